"""Checkpoint files: atomic writes, and reads that refuse a damaged, foreign or non-finite checkpoint in one line.

A checkpoint `checkpoints/iter_<k>/` holds the algorithm's folder `algorithm/` (whatever its `save` writes: for
PPO and CORY each agent's folder, `cory.ppo.learner.Agent.save`, and `policies.json`, the folders that hold
policies), the torch RNG states (safetensors) and `trainer.json`, written last. The helpers `check_files`,
`damaged` and `refuse_nonfinite` are what an algorithm's `load` uses to refuse its own files in the same one-line way.
It is written into a temporary sibling and renamed, so a
crash mid-write leaves the previous checkpoint intact. Reading checks, before anything is restored or any log
is truncated: `trainer.json` has every key, each of the type and range the trainer wrote (`read_state`), and
matches its own SHA-256 (`state_sha256`, over the rest of it: the file checksums included); every other file of
the checkpoint is listed with its SHA-256 and has it; no file is empty, nothing pickled other than tensors is loaded
(`torch.load(weights_only=True)`), and every loaded weight and optimiser tensor is finite. A checkpoint may come
from someone else (a run folder is input): a value that parses but is out of range is refused as a damaged one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
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
    "files",
)
STATE_DIGEST = "state_sha256"  # trainer.json's own SHA-256, over the rest of it (older checkpoints have none)
CHECKPOINT_NAME = re.compile(r"iter_(\d+)")  # `checkpoints/iter_<iteration>`; anything else there is not one


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
        (tmp / "trainer.json").write_text(_signed(state | {"files": files}))  # last: its presence marks completeness
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
        (tmp / "trainer.json").write_text(_signed(state | {"files": _checksums(tmp)}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _keep_last(root, keep)


def _checksums(folder: Path) -> dict[str, str]:
    return {str(f.relative_to(folder)): _sha256(f) for f in sorted(folder.rglob("*")) if f.is_file()}


def _state_digest(state: dict) -> str:
    """SHA-256 of `trainer.json`'s content without its own digest, in one canonical form (sorted keys)."""
    rest = {k: v for k, v in state.items() if k != STATE_DIGEST}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def _signed(state: dict) -> str:
    """`trainer.json`'s text: the state and its own SHA-256, so that an edit of a counter, a flag or the list of file
    checksums is refused as a bit flip of a weight file is."""
    return json.dumps(state | {STATE_DIGEST: _state_digest(state)})


def _keep_last(root: Path, keep: int) -> None:
    for old in _checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)  # refuses a link (a run folder holding one is refused before)


def _checkpoints(root: Path) -> list[Path]:
    """The checkpoint folders under `root` (`iter_<k>`), oldest first."""
    found = [(int(m.group(1)), p) for p in root.glob("iter_*") if (m := CHECKPOINT_NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found) if p.is_dir()]


def read_state(path: Path) -> dict:
    """`trainer.json` of a checkpoint, refused in one line when unreadable, missing keys, edited since it was written
    (its digest) or holding a value of the wrong type or out of range (`state_problem`)."""
    try:
        state = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        first = " ".join(str(err).split()) or type(err).__name__
        raise CheckpointError(f"checkpoint {path} is unreadable ({first}); {_FALLBACK}") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        lacks = ", ".join(missing)
        raise CheckpointError(f"checkpoint {path} is unreadable (trainer.json lacks {lacks}); {_FALLBACK}")
    if STATE_DIGEST in state and state[STATE_DIGEST] != _state_digest(state):
        raise CheckpointError(
            f"checkpoint {path} is damaged: trainer.json does not match the checksum recorded when it was saved (a "
            f"bit flip or an edit); {_FALLBACK}"
        )
    problem = state_problem(state, path)
    if problem:
        raise CheckpointError(f"checkpoint {path} is unreadable (trainer.json: {problem}); {_FALLBACK}")
    return state


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _rng_problem(rng) -> str | None:
    """Why `rng` (`cory.runtime.rng_state`'s form) cannot be restored, or None: tried on fresh generators."""
    try:
        version, keys, gauss = rng["python"]
        random.Random().setstate((version, tuple(keys), gauss))
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.RandomState().set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    except (KeyError, TypeError, ValueError, OverflowError):
        return "is not a python and numpy generator state"
    return None


_SHA256 = re.compile(r"[0-9a-f]{64}")


def state_problem(state: dict, path: Path) -> str | None:
    """What in `trainer.json` is not what the trainer writes (type and range, key by key), or None.

    A checkpoint named `iter_<k>` holds k iterations; each line count is a count; nonfinite iterations are at most
    the iterations done; the file list names files inside the checkpoint, each with a SHA-256; the generator states
    restore on fresh generators.
    """
    iteration, wall = state["iteration"], state.get("wall_time_s", 0.0)
    checks = {
        "format": (_count(state["format"]), "a whole number"),
        "iteration": (_count(iteration), "a whole number >= 0"),
        "bad_streak": (_count(state["bad_streak"]), "a whole number >= 0"),
        "metrics_lines": (_count(state["metrics_lines"]), "a whole number >= 0"),
        "samples_lines": (_count(state["samples_lines"]), "a whole number >= 0"),
        "nonfinite_iterations": (
            _count(state["nonfinite_iterations"]) and _count(iteration) and state["nonfinite_iterations"] <= iteration,
            "a whole number, at most the iterations done",
        ),
        "wandb_run_id": (state["wandb_run_id"] is None or isinstance(state["wandb_run_id"], str), "null or a string"),
        "run_info": (isinstance(state["run_info"], dict), "an object"),
        "pending_eval": (isinstance(state.get("pending_eval", False), bool), "true or false"),
        "wall_time_s": (
            isinstance(wall, (int, float)) and not isinstance(wall, bool) and math.isfinite(wall) and wall >= 0,
            "a finite number of seconds >= 0",
        ),
        "rng_by_rank": (isinstance(state.get("rng_by_rank", []), list), "a list of generator states"),
        "torch_threads": (
            state.get("torch_threads") is None or (_count(state["torch_threads"]) and state["torch_threads"] >= 1),
            "a whole number >= 1",
        ),
        STATE_DIGEST: (isinstance(state.get(STATE_DIGEST, ""), str), "a SHA-256"),
    }
    for key, (ok, expected) in checks.items():  # in this order: `iteration` is known to be a count below it
        if not ok:
            return f"{key} is {_shown(state.get(key))}, not {expected}"
        if key == "iteration" and (name := CHECKPOINT_NAME.fullmatch(path.name)) and int(name.group(1)) != iteration:
            return f"iteration is {iteration}, but the checkpoint folder is {path.name}"
    if problem := _files_problem(state["files"]):
        return f"files is not {problem}"
    for key, rng in [
        ("rng", state["rng"]),
        *((f"rng_by_rank[{i}]", r) for i, r in enumerate(state.get("rng_by_rank", []))),
    ]:
        if problem := _rng_problem(rng):
            return f"{key} {problem}"
    return None


def _files_problem(files) -> str | None:
    if not isinstance(files, dict):
        return "an object of file names and their SHA-256"
    for name, digest in files.items():
        parts = Path(name).parts
        if Path(name).is_absolute() or not parts or ".." in parts or name != str(Path(*parts)):
            return f"an object of file names inside the checkpoint (it names {name!r})"
        if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
            return f"an object of file names and their SHA-256 ({name!r} has {_shown(digest)})"
    return None


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checksums(checkpoint: Path, state: dict, complete: bool = True) -> None:
    """Every file `trainer.json` lists has the SHA-256 recorded when it was written: a bit flip or an edit that
    still parses (a weight changed on disk) is refused, naming the file, instead of resuming with other numbers.
    `complete`: every file of the checkpoint is listed too (a file list emptied or shortened is refused); only the
    trainer's own snapshot, written without checksums, is read without it."""
    files = state.get("files", {})
    if complete:
        check_listed(checkpoint, state)
    for name, digest in files.items():
        path = checkpoint / name
        if path.is_symlink() or not path.is_file():
            raise CheckpointError(f"checkpoint {checkpoint} is damaged: {name} is missing; {_FALLBACK}")
        if _sha256(path) != digest:
            raise CheckpointError(
                f"checkpoint {checkpoint} is damaged: {name} does not match the checksum recorded when it was "
                f"saved (a bit flip or an edit); {_FALLBACK}"
            )


def check_listed(checkpoint: Path, state: dict) -> None:
    """Every file of the checkpoint but `trainer.json` has a checksum in it: a list emptied or shortened (so that an
    edited file would go unchecked) is refused, naming the first file it leaves out. No file is read."""
    names = [str(f.relative_to(checkpoint)) for f in sorted(checkpoint.rglob("*")) if f.is_file() or f.is_symlink()]
    unlisted = sorted(set(names) - set(state.get("files", {})) - {"trainer.json"})
    if unlisted:
        raise CheckpointError(
            f"checkpoint {checkpoint} is damaged: {unlisted[0]} has no checksum in trainer.json (its list of files "
            f"was edited); {_FALLBACK}"
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
    """The newest complete checkpoint folder, by iteration (temporary folders of an interrupted write are ignored)."""
    done = [p for p in _checkpoints(Path(run_dir) / "checkpoints") if (p / "trainer.json").exists()]
    return done[-1] if done else None


def count_lines(path: Path) -> int:
    """The complete lines of `path` (0 when absent); a torn last line (a kill mid-write) does not count."""
    if not path.is_file():
        return 0
    return path.read_bytes().count(b"\n")


def truncate_lines(path: Path, keep: int) -> None:
    """Keep the first `keep` lines of `path`: a resumed run's log then equals an uninterrupted one. Bytes, not text:
    whatever the file holds, the lines kept are the bytes written."""
    if path.exists():
        lines = path.read_bytes().split(b"\n")[:keep]  # `keep` is at most the complete lines (`count_lines`)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in lines))
        os.replace(tmp, path)
