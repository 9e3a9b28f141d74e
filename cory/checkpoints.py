"""Checkpoint files: atomic writes, and reads that refuse a damaged, foreign or non-finite checkpoint in one line.

A checkpoint `checkpoints/iter_<k>/` holds the algorithm's folder `algorithm/` (whatever its `save` writes: for
PPO and CORY each agent's folder, `cory.ppo.learner.Agent.save`, and `policies.json`, the folders that hold
policies), the torch RNG states (safetensors) and `trainer.json`, written last. The helpers `check_files`,
`damaged` and `refuse_nonfinite` are what an algorithm's `load` uses to refuse its own files in the same one-line way.
It is written into a temporary sibling and renamed, so a
crash mid-write leaves the previous checkpoint intact. Reading checks, before anything is restored or any log
is truncated: `trainer.json` has every key, no file is empty, nothing pickled other than tensors is loaded
(`torch.load(weights_only=True)`), and every loaded weight and optimiser tensor is finite.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from cory import runtime
from cory.errors import CheckpointError, writing

ALGORITHM_DIR = "algorithm"
# In `algorithm/`: the agent folders that hold a policy (weights a `cory.policy` handle loads), written by algorithms
# whose agents can be evaluated alone or exported; what `cory.evaluate` and an export read, whatever the algorithm.
POLICIES = "policies.json"
CHECKPOINT_FORMAT = 4  # 3: the algorithm owns `algorithm/`; 4: a team of parts (older ones are refused, not misread)
STATE_KEYS = (  # what trainer.json must hold (`pending_eval` is optional: older checkpoints have none)
    "format",
    "iteration",
    "rng",
    "bad_streak",
    "nonfinite_iterations",
    "metrics_lines",
    "samples_lines",
    "wandb_run_id",
    "run_info",
)


# what every refusal tells the user to do: the run folder itself is never changed by a refused load
_FALLBACK = "delete that checkpoint folder and resume again to continue from the one before it (or from the start)"


def write_checkpoint(
    final: Path,
    save_algorithm: Callable[[Path], None],
    state: dict,
    keep: int,
    checksums: bool = True,
    torch_rng: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write `final` atomically (temporary folder + rename) and keep only the last `keep` checkpoints.

    `save_algorithm(folder)` writes the algorithm's part into `final/algorithm` (`Algorithm.save`). Without
    `checksums` (a pre-iteration snapshot, `install_checkpoint` adds them if it becomes a checkpoint) no file is
    hashed: hashing a large model costs about a second per GB. `torch_rng`: the torch RNG states to store (default
    this process's; several processes store each one's, `rank<r>/<device>`)."""
    root = final.parent
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    for stale in root.glob(".tmp-*"):  # left by a crash mid-write; one process writes a run's checkpoints
        shutil.rmtree(stale, ignore_errors=True)
    with writing(tmp):  # a full disk is one OSError naming the file, whichever library was writing it
        tmp.mkdir(parents=True)
        (tmp / ALGORITHM_DIR).mkdir()
        save_algorithm(tmp / ALGORITHM_DIR)
        with writing(tmp / "torch_rng.safetensors"):
            save_file(torch_rng or runtime.torch_rng_states(), str(tmp / "torch_rng.safetensors"))
        files = _checksums(tmp) if checksums else {}
        (tmp / "trainer.json").write_text(
            json.dumps(state | {"files": files})
        )  # last: its presence marks completeness
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _keep_last(root, keep)


def install_checkpoint(source: Path, final: Path, keep: int) -> None:
    """Copy a complete checkpoint folder written elsewhere (a snapshot, possibly in RAM) to `final`, atomically as
    `write_checkpoint` does, with the checksums it may lack; keep the last `keep` checkpoints."""
    root = final.parent
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with writing(tmp):
        shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("trainer.json"))
        state = json.loads((source / "trainer.json").read_text())
        (tmp / "trainer.json").write_text(json.dumps(state | {"files": _checksums(tmp)}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _keep_last(root, keep)


def _checksums(folder: Path) -> dict[str, str]:
    return {str(f.relative_to(folder)): _sha256(f) for f in sorted(folder.rglob("*")) if f.is_file()}


def _keep_last(root: Path, keep: int) -> None:
    for old in sorted(p for p in root.glob("iter_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def read_state(path: Path) -> dict:
    """`trainer.json` of a checkpoint, refused in one line when unreadable or missing keys."""
    try:
        state = json.loads((path / "trainer.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable ({err}); {_FALLBACK}") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        lacks = ", ".join(missing)
        raise CheckpointError(f"checkpoint {path} is unreadable (trainer.json lacks {lacks}); {_FALLBACK}")
    return state


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checksums(checkpoint: Path, state: dict) -> None:
    """Every file `trainer.json` lists has the SHA-256 recorded when it was written: a bit flip or an edit that
    still parses (a weight changed on disk) is refused, naming the file, instead of resuming with other numbers."""
    for name, digest in state.get("files", {}).items():
        path = checkpoint / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {checkpoint} is damaged: {name} is missing; {_FALLBACK}")
        if _sha256(path) != digest:
            raise CheckpointError(
                f"checkpoint {checkpoint} is damaged: {name} does not match the checksum recorded when it was "
                f"saved (a bit flip or an edit); {_FALLBACK}"
            )


def load_torch_rng(checkpoint: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    """The torch RNG states saved with the checkpoint: process `rank`'s when several processes saved theirs (rank 0's
    when that rank saved none: a resume on more processes than the run had)."""
    path = checkpoint / "torch_rng.safetensors"
    with damaged(path, checkpoint):
        states = load_file(str(path))
    if not any(k.startswith("rank") for k in states):
        return states
    prefix = f"rank{rank}/" if any(k.startswith(f"rank{rank}/") for k in states) else "rank0/"
    return {k.removeprefix(prefix): v for k, v in states.items() if k.startswith(prefix)}


def check_files(folder: Path, checkpoint: Path) -> None:
    """Every file under `folder` is non-empty (a 0-byte file is the mark of a full disk or a kill mid-write)."""
    for f in sorted(folder.rglob("*")) if folder.is_dir() else []:
        if f.is_file() and f.stat().st_size == 0:
            raise CheckpointError(
                f"checkpoint {checkpoint} is damaged: {f.relative_to(checkpoint)} is empty (0 bytes); {_FALLBACK}"
            )


def refuse_nonfinite(tensors: Mapping[str, torch.Tensor], folder: Path, checkpoint: Path) -> None:
    """Every floating-point tensor loaded from `folder` is finite (a NaN weight cannot be trained out)."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        shown = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
        raise CheckpointError(
            f"checkpoint {checkpoint} holds non-finite values in {folder.relative_to(checkpoint)} ({shown}), so the "
            f"run cannot continue from it; {_FALLBACK}"
        )


def write_policies(algorithm_dir: Path, folders: list[str]) -> None:
    """Record which folders of a checkpoint's `algorithm/` hold policies (`POLICIES`)."""
    (algorithm_dir / POLICIES).write_text(json.dumps(folders))


def policy_folders(checkpoint: Path) -> list[str] | None:
    """The policy folders a checkpoint's algorithm recorded (`write_policies`), or None when it recorded none."""
    path = checkpoint / ALGORITHM_DIR / POLICIES
    if not path.is_file():
        return None
    with damaged(path, checkpoint):
        folders = json.loads(path.read_text())
        if not isinstance(folders, list) or not all(isinstance(f, str) and "/" not in f for f in folders):
            raise ValueError("not a list of folder names")
    return folders


def tensors_of(state: Mapping, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of a nested state dict (an optimiser's), named `prefix.key.subkey`."""
    return {f"{prefix} {n}": t for n, t in _tensors(dict(state))}


def _tensors(node, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(node, torch.Tensor):
        yield prefix, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))


@contextlib.contextmanager
def damaged(what: Path, checkpoint: Path) -> Iterator[None]:
    """Any failure while reading a checkpoint file is one `CheckpointError` naming it. A file that holds pickled
    objects other than tensors is refused as such: nothing from a checkpoint is ever unpickled."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - any failure here means a damaged checkpoint
        text = str(err).strip()
        if isinstance(err, pickle.UnpicklingError) and "weights only" in text.lower():
            reason = "it holds pickled objects other than tensors, which are never loaded"
        else:
            first = text.splitlines()[0] if text else "no message"
            reason = f"{type(err).__name__}: {first}" if "weights_only" not in first else type(err).__name__
        raise CheckpointError(
            f"checkpoint {checkpoint} is corrupt or from another model ({what.relative_to(checkpoint)}: {reason}); "
            f"{_FALLBACK}"
        ) from None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder (temporary folders of an interrupted write are ignored)."""
    done = sorted(p for p in (Path(run_dir) / "checkpoints").glob("iter_*") if (p / "trainer.json").exists())
    return done[-1] if done else None


def truncate_lines(path: Path, keep: int) -> None:
    """Keep the first `keep` lines of `path`: a resumed run's log then equals an uninterrupted one."""
    if path.exists():
        lines = path.read_text().splitlines(keepends=True)[:keep]
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(lines))
        os.replace(tmp, path)
