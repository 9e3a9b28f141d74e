"""The errors whose message is written for the user: one line each, printed as `error: ...` with exit code 2.

They live here, below every other module, so that any layer can raise them without importing the layer that
reports them. `entry_point` is the error boundary every command's `main` wears (`cory-train`, `cory-evaluate`, the
study commands): expected failures are one line, Ctrl-C at any moment is one line and exit code 130, anything else
keeps its traceback.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import functools
import os
import re
import resource
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar


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


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate a mistyped `word` most probably meant (`algoritm` → `algorithm`), or None when none is close;
    case is ignored."""
    by_lower = {str(c).lower(): str(c) for c in candidates}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.75)
    return by_lower[close[0]] if close else None


# ------------------------------------------------------------------------------------------------- error boundary
# A write that failed for a reason the user can fix (disk full, quota, read-only or unwritable folder, a file where a
# folder belongs, the file-size limit): one line naming the file, never a traceback.
WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EFBIG}
)
INTERRUPTED = 130  # the shell's code for a process ended by SIGINT (128 + 2)

_Main = TypeVar("_Main", bound=Callable[..., object])


def interrupted(err: BaseException) -> bool:
    """Whether `err` is Ctrl-C, or what a library made of it: a KeyboardInterrupt raised inside an import or a C
    extension can surface as another exception (an ImportError, a RuntimeError) with the interrupt as its cause."""
    seen: BaseException | None = err
    for _ in range(32):  # a cycle in the chain is possible in principle; the chain is short in practice
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def fail(message: str, code: int = 2) -> None:
    """Print `error: <message>` as one line on stderr and exit with `code`."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    sys.exit(code)


@contextlib.contextmanager
def error_boundary(
    expected: tuple[type[BaseException], ...] = (),
    on_interrupt: str = "interrupted (SIGINT); nothing was kept",
    write_advice: str = "free space or fix permissions",
    unnamed: str = "",
) -> Iterator[None]:
    """What a command's user sees when it fails: one line, or a traceback for a bug.

    - `USER_ERRORS` and `expected` (a command's own expected failures): `error: <message>`, exit code 2;
    - an `OSError` of a write the user can fix (`WRITE_ERRNOS`): `error: cannot write <file> (<reason>);
      <write_advice>`, exit code 2 (`unnamed` stands for the file when the error names none);
    - Ctrl-C, at any moment (an import, loading a model) and whatever a library made of it (`interrupted`): one
      line, `error: <on_interrupt>`, exit code 130;
    - `SystemExit` passes (a command that already reported its failure), and any other exception keeps its
      traceback: a bug stays visible.
    """
    try:
        yield
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as err:
        if interrupted(err):
            fail(on_interrupt, INTERRUPTED)
        if isinstance(err, USER_ERRORS + expected):
            fail(one_line(err))
        if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
            where = f" {err.filename or unnamed}".rstrip()
            fail(f"cannot write{where} ({err.strerror or type(err).__name__}); {write_advice}")
        raise


def entry_point(
    expected: tuple[type[BaseException], ...] = (),
    on_interrupt: str = "interrupted (SIGINT); nothing was kept",
    write_advice: str = "free space or fix permissions",
    unnamed: str = "",
) -> Callable[[_Main], _Main]:
    """`error_boundary` around a command's `main`:

        @entry_point()
        def main(argv: list[str] | None = None) -> None: ...

    Import what is slow (torch, transformers) inside `main`, not at the top of its module: an interrupt during an
    import then lands inside the boundary too, and `--help` stays fast.
    """

    def decorate(main: _Main) -> _Main:
        @functools.wraps(main)
        def run(*args, **kwargs):
            with error_boundary(expected, on_interrupt, write_advice, unnamed):
                return main(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


# ---------------------------------------------------------------------------------------------------- failed writes
_RUST_IO = re.compile(r"\(os error (\d+)\)")  # safetensors reports its I/O errors as `... (os error 28)`
_TORCH_WRITER = ("PytorchStreamWriter", "inline_container")  # torch.save's archive writer, failing mid-file
_NEARLY_FULL = 256 * 2**20  # bytes free under which a failed archive write is read as a full disk


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
        with contextlib.suppress(OSError):  # torch's message says only "file write failed": ask the filesystem.
            # Nearly full, not only full: by the time we ask, the failed writer (or another process) may have
            # freed a few blocks (a run of 2026-12-06 failed so with 2 MB free on a 252 GB disk).
            disk = os.statvfs(folder)
            if disk.f_bavail * disk.f_frsize < _NEARLY_FULL:
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
