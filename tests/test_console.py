"""What a run says while it runs, on the console and in its `train.log` (cory/runtime.py `say`, cory/trainer.py).

With `progress=false` the run folder and the plan come first, then one line per iteration (reward, KL and β of
each agent) and one per evaluation as they happen, then the summary; `train.log` holds the same lines with
timestamps. With the progress bar on, the per-iteration lines go to `train.log` only (the bar shows them).
Model loads print one line of ours, not transformers' per-file progress bars.

The command line answers at once: `--help` (our own text: experiments, algorithms, the README's ten overrides, the
docs) and Hydra's tab completion import neither torch nor transformers (their speed is measured by
`scripts/cli_latency.py`, not here), and `cory-evaluate --help` names itself.

Run: `pytest tests/test_console.py` (about 30 seconds).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runners import REPO, env, run_cli, run_main_output

import cory.evaluate
import cory.train
from cory import cli


def _run(tmp_path, *args: str) -> tuple[str, str]:
    run_dir = tmp_path / "run"
    out = run_cli("experiment=smoke", "algorithm=cory", f"hydra.run.dir={run_dir}", *args)
    return out.stdout, (run_dir / "train.log").read_text()


@pytest.mark.slow
def test_a_run_says_what_it_does_as_it_does_it(tmp_path):
    stdout, log = _run(tmp_path, "progress=false")
    lines = [line for line in stdout.splitlines() if line.startswith("[cory]")]
    assert lines[0] == "[cory] model build_tiny_gpt2 loaded in " + lines[0].rsplit(" in ", 1)[1]
    assert lines[1] == f"[cory] run folder: {tmp_path / 'run'}" and lines[2].startswith("[cory] plan: algorithm cory")
    iterations = [line for line in lines if re.match(r"\[cory\] iteration \d/4: ", line)]
    assert [line.split(":")[0] for line in iterations] == [f"[cory] iteration {k}/4" for k in range(1, 5)]
    assert all(f"{a}_{x} " in line for line in iterations for a in ("llm1", "llm2") for x in ("r", "kl", "beta"))
    evaluations = [i for i, line in enumerate(lines) if line.startswith("[cory] evaluation after")]
    assert len(evaluations) == 3 and evaluations[0] < lines.index(iterations[0])  # as they happen, in order
    assert lines[-1].startswith("[cory] wall time") and any("llm2: held-out task reward" in x for x in lines)
    assert "Loading weights" not in stdout
    logged = [re.sub(r"^\[[\d\- :,]+\] ", "", line) for line in log.splitlines() if line.startswith("[20")]
    assert logged[: len(lines) - 1] == lines[1:]  # train.log: the same lines from the run folder on, timestamped


@pytest.mark.slow
def test_with_a_progress_bar_iteration_lines_go_to_the_log_only(tmp_path):
    stdout, log = _run(tmp_path, "progress=true")
    assert not re.search(r"\[cory\] iteration \d/4", stdout)
    assert len(re.findall(r"\[cory\] iteration \d/4", log)) == 4


# ------------------------------------------------------------------------------------------- the command line
def _imported(args: list[str], extra_env: dict[str, str] | None = None) -> tuple[set[str], str]:
    """The modules `python -m cory.train <args>` imports (read from `-X importtime`), and its stdout."""
    cmd = [sys.executable, "-X", "importtime", "-m", "cory.train", *args]
    out = subprocess.run(cmd, cwd=REPO, env=env(**(extra_env or {})), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[-1].strip() for line in lines}, out.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [(["--help"], None), (["-sc", "query=bash"], "cory-train algorithm="), (["-sc", "query=bash"], "cory-train seed")],
    ids=["help", "complete-group", "complete-key"],
)
def test_help_and_tab_completion_import_no_torch(args, line):
    """What makes `--help` and a TAB cost 11-14 s is importing torch, transformers and peft: neither may."""
    extra = {"COMP_LINE": line, "COMP_POINT": str(len(line))} if line else {}
    modules, stdout = _imported(args, extra)
    assert modules and not modules & {"torch", "transformers", "peft"}, sorted(modules & {"torch", "transformers"})
    if line == "cory-train algorithm=":
        assert "algorithm=cory" in stdout.split() and "algorithm=ppo" in stdout.split()
    elif line:
        assert stdout.split() == ["seed="]


def _readme_overrides() -> list[list[str]]:
    """The README table "The ten most used overrides": each row's first cell, its `code` spans."""
    text = (REPO / "README.md").read_text().split("## The ten most used overrides", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    return [re.findall(r"`([^`]+)`", row.split("|")[1]) for row in rows]


def test_help_lists_the_experiments_algorithms_ten_overrides_and_docs(monkeypatch, capsys):
    code, stdout, stderr = run_main_output(monkeypatch, capsys, "--help")
    assert code == 0 and stderr == ""
    assert stdout.startswith("python -m cory.train: ")
    listed = {line.split()[0] for line in stdout.splitlines() if line.startswith("  ") and line.split()}
    conf = REPO / "cory" / "conf"
    for group in ("experiment", "algorithm"):
        assert {p.stem for p in (conf / group).glob("*.yaml")} <= listed, group
    assert "quickstart (default)" in stdout and "Hydra" in stdout  # the default, and where Hydra's own help is
    rows = _readme_overrides()
    assert len(rows) == len(cli.TEN_OVERRIDES) == 10
    for spans, (override, _) in zip(rows, cli.TEN_OVERRIDES, strict=True):
        assert all(span in override for span in spans), (spans, override)  # the README's row, in the same order
        assert override in stdout
    for page, _ in cli.DOC_PAGES:
        assert (REPO / page).is_file() and page in stdout


def test_help_names_the_command_as_it_was_typed(monkeypatch, capsys):
    """`cory-train --help` and `cory-evaluate --help` say their own names; `python -m` gives the module's."""
    bin_dir = Path(sys.executable).parent
    monkeypatch.setattr(sys, "argv", [str(bin_dir / "cory-train"), "--help"])
    cory.train.main()
    assert capsys.readouterr().out.startswith("cory-train: ")
    for argv0, name in (
        (bin_dir / "cory-evaluate", "cory-evaluate"),
        (REPO / "cory" / "evaluate.py", "python -m cory.evaluate"),
    ):
        monkeypatch.setattr(sys, "argv", [str(argv0), "--help"])
        with pytest.raises(SystemExit) as exit_:
            cory.evaluate.main(["--help"])
        assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {name} ")
