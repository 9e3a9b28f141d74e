"""Every command the README, the docs pages and `scripts/*.sh` print is run or composed, in the form printed.

Commands are collected from the code blocks and inline code spans of `README.md` and `docs/*.md` and from
`scripts/*.sh`: every
`python -m cory.<module> ...` (also behind `$PY`, `.venv/bin/python`, `accelerate launch` or `torchrun`),
every installed study command (`cory-plot`, `cory-report`, `cory-measure`, `cory-sweep`, `cory-gpt2-small`:
pyproject.toml's `[project.scripts]` into `cory.studies`), every `python scripts/<name>.py ...`, `make <target>`
and `bash scripts/<name>.sh`. A new command (GSM8K, figures, MAFT) is covered as soon as it is printed.

- `python -m cory.train`: the command composes with Hydra's compose API, every job of a `-m` sweep and of a
  `sweep=` file, and each job's config validates (as if CUDA were present: GPU commands are composed, not run;
  a local path the reader is told to replace may be missing). Its run and sweep folder names resolve. A command
  whose jobs are all CPU-tiny (`model=tiny_gpt2`) and that uses the basic launcher is also run, in-process,
  with its output folder in a tmp folder (other launchers are run by tests/test_sweeps.py); one under DeepSpeed
  or FSDP is run by the long test `test_every_printed_sharded_command_runs` (`make test-long`).
- another `python -m cory.<module>`: `--cfg job` composes it through its own entrypoint.
- a study command (`cory-plot curves ...`, `python -m cory.studies.<module> ...`): the command and its sub-command
  exist (and its mode, for a command of modes: `cory-report claim2 plan ...`), its `--help` (the mode's) lists every
  flag the command uses, and the Hydra overrides it passes on compose and validate (each job of a `cory-sweep`).
- `python scripts/<name>.py`: the script exists, its `--help` lists every flag the command uses, and the Hydra
  overrides it passes on compose.
- `make <target>`, `bash scripts/<name>.sh`: the target or the script exists.
Lines holding a placeholder (`<run folder>`) are templates, not commands.

Run: `pytest tests/test_commands.py` (about a minute on 2 CPUs).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
import torch
from helpers.compose import _compose, _jobs
from helpers.runners import check_run_folder, env, run_main
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from cory.config import validate
from cory.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
PYTHON = re.compile(r"(^|/)python3?$")
LAUNCHERS = {"accelerate", "torchrun"}  # `<launcher> [flags] -m cory.train ...`
# the installed study commands: console name → module (`cory-plot` → `cory.studies.plot`)
STUDY_COMMANDS = {
    name: target.split(":")[0]
    for name, target in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"].items()
    if target.startswith("cory.studies.")
}


def _shell_lines(text: str) -> list[str]:
    """Logical lines (continuations joined), split at `&&` and `;`."""
    lines = text.replace("\\\n", " ").splitlines()
    return [part.strip() for line in lines for part in re.split(r"&&|;", line) if part.strip()]


def _script_defaults(text: str) -> dict[str, str]:
    """`VAR=${VAR:-default}` lines of a shell script: the values its commands expand by default."""
    return dict(re.findall(r"^(\w+)=\$\{\1:-([^}]*)\}", text, flags=re.M))


# A fenced block (possibly indented in a list item) and its language; shell blocks are "", "bash" or "sh"
FENCE = re.compile(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```", flags=re.S | re.M)


def documents() -> list[Path]:
    """The pages whose commands are checked: the README, then every docs page."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def collect() -> list[tuple[str, str]]:
    """(where, command line) for every command printed in the README, in docs/*.md and in scripts/*.sh."""
    found: list[tuple[str, str]] = []
    for page in documents():
        text, where = page.read_text(), str(page.relative_to(REPO))
        for language, block in FENCE.findall(text):
            if language in ("", "bash", "sh"):  # python, yaml, bibtex blocks hold no shell commands
                found += [(where, line) for line in _shell_lines(block)]
        prose = FENCE.sub("", text)
        found += [(where, span) for span in re.findall(r"`([^`\n]+)`", prose)]
    for script in sorted((REPO / "scripts").glob("*.sh")):
        text = script.read_text()
        for var, value in _script_defaults(text).items():
            text = text.replace(f"${var}", value).replace(f"${{{var}}}", value)
        found += [(script.name, line) for line in _shell_lines(text) if not line.startswith("#")]
    commands = [(where, line) for where, line in found if _kind(line)]
    first = {}  # a command printed on several pages is checked once, where it appears first
    for where, line in commands:
        first.setdefault(line, where)
    return [(where, line) for line, where in first.items()]


# `$(command)` prints a value the reader's shell substitutes (e.g. a local model folder): a stand-in path here
SUBSTITUTION = re.compile(r"\$\([^)]*\)")
SUBSTITUTED = "/substituted/by/the/shell"


def _tokens(line: str) -> list[str]:
    tokens = shlex.split(SUBSTITUTION.sub(SUBSTITUTED, line), comments=True)
    # a script's shell variables (its pass-through arguments "$@", an array "${MODEL[@]}", a loop variable in
    # `algorithm="$algorithm"`) have no value here: those arguments are left out, the rest is checked
    tokens = [t for t in tokens if "$" not in t]
    while tokens and re.fullmatch(r"\w+=\S*", tokens[0]):  # leading `VAR=value` assignments
        tokens.pop(0)
    return tokens


def _kind(line: str) -> str | None:
    """What the line runs: "module:<name>", "script:<path>", "make:<target>", "bash:<path>" or None."""
    try:
        tokens = _tokens(line)
    except ValueError:
        return None
    if not tokens:
        return None
    head = tokens[0]
    if head in STUDY_COMMANDS:
        return f"study:{STUDY_COMMANDS[head]}"
    if PYTHON.search(head) or head in LAUNCHERS:
        after = tokens[tokens.index("-m", 1) + 1 :] if "-m" in tokens[1:] else []
        if after and after[0].startswith("cory.studies."):
            return f"study:{after[0]}"
        if after:  # `python -m <module>`: the first -m names the module, a later one is Hydra's multirun flag
            return f"module:{after[0]}" if after[0].startswith("cory.") else None
        script = next((t for t in tokens[1:] if t.startswith("scripts/") and t.endswith(".py")), None)
        return f"script:{script}" if script else None
    if head == "make" and len(tokens) > 1:
        return f"make:{tokens[1]}"
    if head == "bash" and len(tokens) > 1 and tokens[1].startswith("scripts/"):
        return f"bash:{tokens[1]}"
    return None


COMMANDS = collect()
TEMPLATE = re.compile(r"<[^>]+>")


def test_the_readme_and_scripts_print_the_commands_this_file_checks():
    """The collector sees the paper commands, the cookbook, the scripts and the sweeps (it cannot go blind), on the
    README and on the docs pages."""
    kinds = {_kind(line) for _, line in COMMANDS}
    assert {"module:cory.train", "script:scripts/benchmark.py", "study:cory.studies.plot"} <= kinds
    assert {f"study:{module}" for module in STUDY_COMMANDS.values()} <= kinds  # every study command is printed
    assert {"make:run", "make:test"} <= kinds
    assert any(" -m " in f" {line} " and "cory.train" in line for _, line in COMMANDS if "seed=" in line)
    assert any(where.endswith(".sh") for where, _ in COMMANDS)
    assert {"README.md", "docs/running.md", "docs/results.md"} <= {where for where, _ in COMMANDS}


def _args(line: str) -> list[str]:
    """The arguments after `-m cory.<module>`, `scripts/<name>.py` or an installed command's name."""
    tokens = _tokens(line)
    if tokens[0] in STUDY_COMMANDS:
        return tokens[1:]
    if "-m" in tokens[1:]:
        return tokens[tokens.index("-m", 1) + 2 :]
    return tokens[next(i for i, t in enumerate(tokens) if t.startswith("scripts/")) + 1 :]


def _check_names_resolve(overrides: list[str]) -> None:
    cfg = _compose(tuple(overrides), hydra=True)
    HydraConfig.instance().set_config(cfg)  # what @hydra.main does before resolving `${hydra:...}`
    for key in ("run.dir", "sweep.dir", "sweep.subdir"):
        value = OmegaConf.select(cfg.hydra, key)
        assert isinstance(value, str) and "${" not in value, (key, value)


@cache
def _script_help(script: str) -> str:
    out = subprocess.run(
        [sys.executable, script, "--help"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@cache
def _study_help(module: str, subcommand: tuple[str, ...]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", module, *subcommand, "--help"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _check_study_command(module: str, line: str, monkeypatch) -> None:
    """The (sub-)command exists, its help lists the flags used, the overrides it passes on compose and validate."""
    import importlib

    args = _args(line)
    subcommands = getattr(importlib.import_module(module), "COMMANDS", None)  # cory-plot, cory-report, cory-measure
    subcommand: tuple[str, ...] = ()
    if subcommands is not None and not args:  # the command named in prose (`cory-plot`): it answers --help
        assert "commands:" in _study_help(module, ())
        return
    if subcommands is not None:
        assert args[0] in subcommands, (line, list(subcommands))
        subcommand, args = (args[0],), args[1:]
    # a command of modes, each with its own flags (`cory-report claim2 plan ... --spread`): the mode's --help
    runner = subcommands[subcommand[0]][0] if subcommand else module
    modes = getattr(importlib.import_module(runner), "MODES", None)
    if modes is not None and args:
        assert args[0] in modes, (line, list(modes))
        subcommand, args = (*subcommand, args[0]), args[1:]
    flags = [a for a in args if re.fullmatch(r"--[\w-]+", a)]  # not a quoted value (`--evaluate "--n 16"`)
    assert all(f in _study_help(module, subcommand) for f in flags), (line, flags)
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    if module == "cory.studies.run_sweep":  # every job of the sweep, as `cory-train -m` would run it
        jobs, _ = _jobs(overrides)
        for job in jobs:
            _validate_as_if_cuda(_compose(tuple(o for o in job if not o.startswith("hydra"))), line, monkeypatch)
    elif module == "cory.studies.measure" and overrides:
        _validate_as_if_cuda(_compose(tuple(overrides)), line, monkeypatch)


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M))


def _validate_as_if_cuda(cfg, line: str, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # GPU commands are composed, not run
    try:
        validate(cfg)
    except ConfigError as err:  # only a path the reader is told to replace with their own copy may be missing
        paths = [t.split("=", 1)[1] for t in _args(line) if "=" in t and "/" in t.split("=", 1)[1]]
        assert any(p in str(err) for p in paths), f"{line}: {err}"


def _tiny(cfgs: list) -> bool:
    return all(c.model._target_.endswith("build_tiny_gpt2") and c.hardware.device == "cpu" for c in cfgs)


# A tiny command under DeepSpeed or FSDP starts a process group and an engine per agent (15 s to minutes on a
# loaded machine): `make test` composes it, and `make test-long` (CI) runs it.
SHARDED = re.compile(r"hardware=(deepspeed_zero\d|fsdp)\b")
SHARDED_COMMANDS = [(w, c) for w, c in COMMANDS if _kind(c) == "module:cory.train" and SHARDED.search(c)]


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[f"{w}: {c}" for w, c in COMMANDS])
def test_every_printed_command_runs_or_composes(where, line, tmp_path, monkeypatch, capsys):
    if TEMPLATE.search(" ".join(_tokens(line))):  # comments may show placeholders, commands may not
        pytest.skip("a template with a placeholder, not a command")
    kind, _, name = _kind(line).partition(":")
    if kind == "make":
        assert name in _makefile_targets(), line
    elif kind == "bash":
        assert (REPO / name).is_file(), line
    elif kind == "study":
        _check_study_command(name, line, monkeypatch)
    elif kind == "script":
        assert (REPO / name).is_file(), line
        args = _args(line)
        flags = [a for a in args if re.fullmatch(r"--[\w-]+", a)]  # not a quoted value (`--evaluate "--n 16"`)
        assert all(f in _script_help(name) for f in flags), (line, flags)
        overrides = [a for a in args if "=" in a and not a.startswith("-")]
        if (
            name in ("scripts/benchmark.py", "scripts/phases.py", "scripts/length_groups.py") and overrides
        ):  # the scripts that pass Hydra overrides
            _validate_as_if_cuda(_compose(tuple(overrides)), line, monkeypatch)
    elif name == "cory.train":
        _check_train_command(line, tmp_path, monkeypatch, capsys, run_sharded=False)
    else:  # another Hydra entrypoint: its own composition
        out = subprocess.run(
            [sys.executable, "-m", name, *_args(line), "--cfg", "job"],
            cwd=REPO,
            env=env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.long
@pytest.mark.parametrize(("where", "line"), SHARDED_COMMANDS, ids=[f"{w}: {c}" for w, c in SHARDED_COMMANDS])
def test_every_printed_sharded_command_runs(where, line, tmp_path, monkeypatch, capsys):
    _check_train_command(line, tmp_path, monkeypatch, capsys, run_sharded=True)


def _check_train_command(line: str, tmp_path: Path, monkeypatch, capsys, run_sharded: bool) -> None:
    args = _args(line)
    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-") and a not in ("job", "hydra", "all")]
    hydra_overrides = [o for o in overrides if o.startswith("hydra")]
    jobs, seeds = _jobs(overrides)
    _check_names_resolve(jobs[0])
    cfgs = [_compose(tuple(o for o in job if not o.startswith("hydra"))) for job in jobs]
    for cfg in cfgs:
        _validate_as_if_cuda(cfg, line, monkeypatch)
    sweep = "-m" in flags or "--multirun" in flags or any(o.startswith("sweep=") for o in overrides)
    launcher = next((o for o in hydra_overrides if o.startswith("hydra/launcher=")), None)
    if not _tiny(cfgs) or "--cfg" in flags or launcher is not None:
        return
    if not run_sharded and any(c.hardware.get("engine") in ("deepspeed", "fsdp") for c in cfgs):
        assert SHARDED.search(line), f"{line}: a sharded engine the long test would not run"
        return
    where = f"hydra.sweep.dir={tmp_path / 'sweep'}" if sweep else f"hydra.run.dir={tmp_path / 'run'}"
    code, err = run_main(monkeypatch, capsys, *args, where, f"cache_dir={tmp_path / 'cache'}")
    assert code == 0, err[-3000:]
    folders = sorted(p.parent for p in tmp_path.rglob("summary.json"))
    assert len(folders) == len(jobs) * seeds  # one folder per job
    for folder in folders:
        cfg = OmegaConf.load(folder / "run_config.yaml")
        check_run_folder(folder, json.loads((folder / "summary.json").read_text())["algorithm"], cfg.iterations)
