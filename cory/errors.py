"""The errors whose message is written for the user: one line each, printed as `error: ...` with exit code 2.

They live here, below every other module, so that any layer can raise them without importing the layer that
reports them (`cory.train`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
from collections.abc import Iterator
from pathlib import Path


class ConfigError(ValueError):
    """An invalid configuration; the message is one line naming the key, its value and what is allowed."""


class AssetUnavailableError(RuntimeError):
    """A model, tokenizer or dataset could not be found locally and the Hub cannot provide it."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt or from an incompatible run."""


class NonFiniteError(RuntimeError):
    """Training diverged: too many consecutive non-finite iterations, or weights that turned non-finite."""


# What the entry points print as one `error:` line (exit code 2) instead of a traceback.
USER_ERRORS = (ConfigError, AssetUnavailableError, CheckpointError, NonFiniteError)


def one_line(err: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(err).split()) or type(err).__name__


# ---------------------------------------------------------------------------------------------------- failed writes
_RUST_IO = re.compile(r"\(os error (\d+)\)")  # safetensors reports its I/O errors as `... (os error 28)`
_TORCH_WRITER = ("PytorchStreamWriter", "inline_container")  # torch.save's archive writer, failing mid-file


@contextlib.contextmanager
def writing(target: Path) -> Iterator[None]:
    """Writes of `target` (a file, or a folder and the files written into it) fail in one way: an `OSError` with
    its errno and the file's name, whichever library wrote it.

    safetensors reports a full disk as `SafetensorError(... (os error 28))` and `torch.save` as a `RuntimeError` of
    its archive writer, neither an `OSError`, and a buffered Python write that fails on flush names no file. The
    entry points turn an `OSError` of a write (`cory.runs.WRITE_ERRNOS`) into one line naming the file; this puts
    every writer on that path. The file named is `target`, or, for a folder, the newest file in it: the one being
    written when the write failed.
    """
    target = Path(target)
    try:
        yield
    except OSError as err:
        if err.filename or not err.errno:
            raise
        raise OSError(err.errno, err.strerror, str(_being_written(target))) from err
    except Exception as err:
        code = _write_errno(err, target if target.is_dir() else target.parent)
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(_being_written(target))) from err


def _write_errno(err: BaseException, folder: Path) -> int | None:
    """The errno behind a failed write that a library raised as another exception, or None when it was not one."""
    seen: BaseException | None = err
    while seen is not None:  # an OSError the library wrapped (torch.save into a Python file object)
        if isinstance(seen, OSError) and seen.errno:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    if match := _RUST_IO.search(str(err)):
        return int(match.group(1))
    if isinstance(err, RuntimeError) and any(mark in str(err) for mark in _TORCH_WRITER):
        with contextlib.suppress(OSError):  # torch's message says only "file write failed": ask the filesystem
            if os.statvfs(folder).f_bavail == 0:
                return errno.ENOSPC
        # and the process's file-size limit (`ulimit -f`): the file it was writing stopped at that size
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        with contextlib.suppress(OSError):
            if limit != resource.RLIM_INFINITY and _being_written(folder).stat().st_size >= limit:
                return errno.EFBIG
    return None


def _being_written(target: Path) -> Path:
    if not target.is_dir():
        return target
    files = [f for f in target.rglob("*") if f.is_file()]
    return max(files, key=lambda f: f.stat().st_mtime_ns) if files else target
