"""What every study command shares: its error boundary, its argument parser and its sub-commands.

The boundary (`guard`): an expected failure is one `error: ...` line on stderr and exit code 2, Ctrl-C is one line
and exit code 130, and anything else (a bug) keeps its traceback, so that real bugs stay visible. Expected are
- `StudyError`: an input the command cannot use (a missing, empty, corrupt or partial file, text or NaN where a
  number belongs, a mistyped command line), raised by `cory.studies.results` and the commands with a message that
  names the file and what to do;
- the project's own user errors (`cory.errors.USER_ERRORS`: a configuration that does not compose or validate, a
  missing asset, a diverged run);
- a failed write (`OSError` with one of `cory.runs.WRITE_ERRNOS`: a read-only, full or missing output folder).
Outputs are written inside `output(path)`, which turns any `OSError` of the write into a `StudyError` naming the
file, so a file where a folder belongs is one line too.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from cory.errors import USER_ERRORS, ConfigError, one_line

USAGE_ERROR, INTERRUPTED = 2, 130


class StudyError(Exception):
    """An input or output a study command cannot use; the message is one line naming it and what to do."""


def guard(run: Callable[..., int | None], *args, **kwargs) -> int:
    """`run(*args, **kwargs)`'s exit status, with every expected failure as one `error:` line (module docstring)."""
    try:
        return run(*args, **kwargs) or 0
    except (StudyError, *USER_ERRORS) as err:
        message = one_line(err)
    except OSError as err:
        from cory.runs import WRITE_ERRNOS  # here: cory.runs imports torch, which `--help` does not need

        if err.errno not in WRITE_ERRNOS:
            raise
        message = write_error(err)
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        return INTERRUPTED
    print(f"error: {message}", file=sys.stderr, flush=True)
    return USAGE_ERROR


def write_error(err: OSError, flag: str = "--out") -> str:
    """One line (without `error: `) for an output that could not be written; a file where a folder belongs is named
    as such (the system's "File exists" or "Not a directory" does not say which)."""
    where = f" {err.filename}" if err.filename else ""
    why = err.strerror or type(err).__name__
    if err.filename and err.errno in (errno.EEXIST, errno.ENOTDIR):
        blocker = next((p for p in (Path(err.filename), *Path(err.filename).parents) if p.is_file()), None)
        if blocker is not None:
            why = f"{blocker} is a file, not a folder"
    return f"cannot write{where} ({why}); choose a writable {flag}"


@contextlib.contextmanager
def output(path: str | Path | None = None, flag: str = "--out") -> Iterator[None]:
    """Writes of `path` (and of the files it names) fail as one `StudyError` naming the file, whatever the errno:
    a folder that is a file, a read-only or full disk, a missing permission."""
    try:
        yield
    except OSError as err:
        if err.filename is None and path is not None:
            err.filename = str(path)
        raise StudyError(write_error(err, flag)) from err


def emit_json(result: dict, out: Path | None) -> None:
    """A measurement's result: printed as JSON, and written to `out` (`--out`) when given, refused in one line if it
    cannot be."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with output(out):
            out.write_text(text + "\n")


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is below {low}")
    return value


def positive_int(text: str) -> int:
    """An argparse `type=`: an integer >= 1 (`--jobs 0` would run nothing and wait forever)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse `type=`: an integer >= 0 (a count that may be none)."""
    return _int_at_least(text, 0)


def non_negative_float(text: str) -> float:
    """An argparse `type=`: a finite number >= 0 (NaN compares false with everything, so it is named here)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of 0 or more")
    return value


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are a `StudyError` (one line through `guard`) instead of a usage block."""

    def error(self, message: str):  # argparse calls this for every mistyped command line
        raise StudyError(f"{self.prog}: {message}; see `{self.prog} --help`")


def parser(prog: str, doc: str | None) -> Parser:
    """The parser of a study command: `prog` is its installed name (`cory-plot curves`), `doc` its module docstring."""
    return Parser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def compose(overrides: Sequence[str], hydra_config: bool = False):
    """The config `cory-train <overrides>` composes; a wrong key or option is a `ConfigError`, and so is a wrong
    value of the job's config (`cory.config.validate`; with `hydra_config`, Hydra's own node, whose folder names
    resolve only in a running job, the job validates itself when it runs)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from cory.cli import compose as cory_compose
    from cory.config import validate

    try:
        cfg = cory_compose(list(overrides), hydra_config=hydra_config)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(one_line(err).split(" Config search path:")[0]) from None  # the search path is noise
    if not hydra_config:
        validate(cfg)
    return cfg


def dispatch(prog: str, commands: Mapping[str, tuple[str, str]], doc: str, argv: Sequence[str] | None) -> int:
    """`prog <command> [args]`: the `run(argv, prog)` of the command's module (`commands`: name → (module, what
    it does)); the module is imported only when its command runs, so `--help` and a typo answer at once."""
    argv = list(sys.argv[1:] if argv is None else argv)
    listing = "\n".join(f"  {name:<14} {what}" for name, (_, what) in commands.items())
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: {prog} {{{','.join(commands)}}} [ARGS]\n\n{doc}\n\ncommands:\n{listing}\n")
        print(f"`{prog} <command> --help` for a command's own arguments.")
        return 0
    if not argv:
        raise StudyError(f"{prog}: give a command ({', '.join(commands)}); see `{prog} --help`")
    name, rest = argv[0], argv[1:]
    if name not in commands:
        raise StudyError(f"{prog}: no command {name!r}; choose one of {', '.join(commands)}")
    module = importlib.import_module(commands[name][0])
    return module.run(rest, prog=f"{prog} {name}")
