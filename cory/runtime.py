"""Seeding, RNG snapshots, device/precision, git SHA and memory: the run-level plumbing in one place."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = False) -> int:
    """Seed python, numpy and torch (plus the process rank) and return the seed that was used."""
    seed = int(seed) + int(os.environ.get("RANK", 0))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    return seed


def rng_state() -> dict:
    """A JSON-able snapshot of the python and numpy global RNGs; torch's goes to safetensors (`torch_rng_state`)."""
    version, state, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(state), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def set_rng_state(state: dict) -> None:
    version, s, gauss = state["python"]
    random.setstate((version, tuple(s), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


@contextlib.contextmanager
def rng_untouched():
    """Run a block (e.g. `wandb.init`) without moving the python, numpy or torch CPU global RNGs."""
    state = rng_state()
    with torch.random.fork_rng(devices=[]):
        yield
    set_rng_state(state)


def torch_rng_states() -> dict[str, torch.Tensor]:
    """Torch CPU (and CUDA) generator states as uint8 tensors, storable with safetensors."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            states[f"cuda{i}"] = s
    return states


def set_torch_rng_states(states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["cpu"])
    cuda = [states[k] for k in sorted(states) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


_LIBC_KEEPS_FREED_MEMORY = False  # set by `keep_freed_memory`; `release_freed_memory` acts only then


@functools.cache
def _libc():
    """This process's C library if it is glibc on Linux (it has `mallopt` and `malloc_trim`), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):  # glibc's; musl has neither
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def keep_freed_memory() -> bool:
    """Serve every allocation from malloc's heap and keep what is freed there until `release_freed_memory`, for this
    process (Linux, glibc).

    By default glibc maps each block above 32 MB from the kernel and unmaps it when freed, so a tensor of that size
    allocated again in every step is faulted in afresh, one zero-filled 4 KB page at a time: the [vocab, d]
    gradient of a tied embedding (154 MB for GPT-2), the logits over the vocabulary, their log-softmax. On the
    GPT-2-small shape that was 0.16 s for each zero-fill of the embedding's gradient and 0.2 s for each sum into the
    tied weight, in every backward (docs/cost.md, "Memory the kernel maps again"). `M_MMAP_MAX = 0` serves large
    blocks from the heap and `M_TRIM_THRESHOLD` at its maximum keeps freed heap for the next use. The arithmetic is
    untouched (the same kernels on the same values): only where the bytes live changes. Kept for ever, the heap
    would keep its high-water mark and the gaps fragmentation leaves, and the peak resident size grew for some
    iterations (+26 % for PPO, +7 % for CORY over 12 at that shape); the trainer therefore returns the free heap to
    the kernel after each iteration and evaluation (`release_freed_memory`). The PPO epochs, the rollouts and the
    agents of one iteration still reuse it: 0.88x the time per iteration for PPO at +10 % peak, 0.94x for CORY at
    -1 % (docs/cost.md). Returns whether it applied (False off glibc)."""
    global _LIBC_KEEPS_FREED_MEMORY
    libc = _libc()
    if libc is None:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's <malloc.h>
    _LIBC_KEEPS_FREED_MEMORY = libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, 2**31 - 1) == 1
    return _LIBC_KEEPS_FREED_MEMORY


def release_freed_memory() -> bool:
    """Return the heap's free pages to the kernel (glibc's `malloc_trim(0)`) where `keep_freed_memory` keeps them;
    a no-op otherwise. Returns whether it ran."""
    libc = _libc() if _LIBC_KEEPS_FREED_MEMORY else None
    if libc is None:
        return False
    libc.malloc_trim(0)  # its result says whether any memory went back, not whether it worked
    return True


def resolve_device(device: str) -> torch.device:
    """`auto` picks CUDA when present; asking for CUDA without it fails in one line."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"hardware.device={device} but CUDA is not available; use hardware=cpu")
    return torch.device(device)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """`fp32` → no autocast; `bf16`/`fp16` → that autocast dtype."""
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory on a GPU, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def git_sha() -> str | None:
    """The commit of the code that runs, for provenance (None outside a git checkout)."""
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


@torch.no_grad()
def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite (no inf, no NaN): each tensor's min and max are finite.

    `aminmax` reads each tensor once and propagates NaN; `torch.isfinite(x).all()` writes a mask of x's size
    first (9× slower on GPT-2's gradients), a max-norm has no vectorised kernel (5×), and a 2-norm or a sum can
    overflow to inf on finite values.
    """
    extremes = [torch.stack(torch.aminmax(x)).float() for x in tensors if x.numel()]
    return not extremes or bool(torch.isfinite(torch.stack(extremes)).all())  # one device sync for all tensors


# ---------------------------------------------------------------------------------------------------- console
# What cory says goes through the `cory` logger: to the console (stdout, resolved at each line, so a captured or
# redirected stdout gets it) and, while a run is live, to its `train.log` with a timestamp (`log_to`). It does not
# propagate to the root logger, so Hydra's own handlers never print a line twice.
_LOG = logging.getLogger("cory")


class _Console(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "console", True):
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stdout)  # above a live progress bar, which stays whole
            sys.stdout.flush()


if not _LOG.handlers:
    _LOG.addHandler(_Console())
    _LOG.setLevel(logging.INFO)
    _LOG.propagate = False


def match_threads(recorded: int | None, chosen: int | None) -> str | None:
    """Torch's thread count for a resumed run, and what to say about it (None: nothing).

    How many threads share a matrix product changes the order of its sums, so its float rounding: a run continues
    exactly only with the count its checkpoint was taken with (`recorded`; None for a new run or an older
    checkpoint). That count is set unless `hardware.threads` (`chosen`, already set by `cory.build`) names one;
    a chosen count that is not the checkpoint's is said, since the run then continues with other rounding."""
    now = torch.get_num_threads()
    if recorded is None or now == recorded:
        return None
    if chosen is None:
        torch.set_num_threads(recorded)
        return (
            f"torch threads: {recorded}, as when the checkpoint was taken (the default here is {now}): a product's "
            f"float rounding depends on the count, so the run continues exactly; hardware.threads=N chooses another"
        )
    return (
        f"torch threads: {now} (hardware.threads), where the checkpoint was taken with {recorded}: the run continues "
        f"with other float rounding, so not exactly as it would have"
    )


def say(message: str, console: bool = True) -> None:
    """One line for the user: on the console (unless `console=False`: a progress bar owns it) and in the run's log."""
    _LOG.info(message, extra={"console": console})


@contextlib.contextmanager
def log_to(path: Path):
    """While the block runs, what `say` says is also appended to `path` (the run's `train.log`)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
    _LOG.addHandler(handler)
    try:
        yield
    finally:
        _LOG.removeHandler(handler)
        handler.close()
