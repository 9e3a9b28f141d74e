"""What a run says while it runs, on the console and in its `train.log` (cory/runtime.py `say`, cory/trainer.py).

With `progress=false` the run folder and the plan come first, then one line per iteration (reward, KL and β of
each agent) and one per evaluation as they happen, then the summary; `train.log` holds the same lines with
timestamps. With the progress bar on, the per-iteration lines go to `train.log` only (the bar shows them).
Model loads print one line of ours, not transformers' per-file progress bars.

Run: `pytest tests/test_console.py` (about 20 seconds).
"""

from __future__ import annotations

import re

import pytest
from helpers.runners import run_cli


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
