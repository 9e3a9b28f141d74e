"""A run folder is input from others: nothing it names is ever built. A `_target_` planted in its `run_config.yaml`
or in its recorded overrides is refused in one line by `resume=` and by `python -m cory.evaluate`, before anything
is imported or called, and the folder is left as it was (cory/runs.py, "Trust").

Each planted target would create a marker file if it ran (`builtins.open(file=<marker>, mode="w")`): the tests
check the refusal, its one line, and that the marker does not exist. Run: `pytest tests/test_untrusted.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from helpers.runners import REPO, cli, env, finished_run, one_error_line, read_rows, run_main, snapshot, start_run
from omegaconf import OmegaConf

from cory import runs


def _plant_in_config(run_dir, marker, key: str) -> None:
    cfg = OmegaConf.load(run_dir / runs.RUN_CONFIG)
    OmegaConf.update(cfg, key, {"_target_": "builtins.open", "file": str(marker), "mode": "w"}, merge=False)
    (run_dir / runs.RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg))


def _plant_in_overrides(run_dir, marker, key: str) -> None:
    evil = f"+{key}={{_target_:builtins.open,file:'{marker}',mode:w}}"
    lines = (run_dir / runs.STARTS).read_text().splitlines()
    first = json.loads(lines[0])
    first["overrides"] = [*first["overrides"], evil]
    (run_dir / runs.STARTS).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    hydra_overrides = run_dir / ".hydra" / "overrides.yaml"
    hydra_overrides.parent.mkdir(exist_ok=True)
    hydra_overrides.write_text(yaml.safe_dump([*first["overrides"]]))


PLANTS = {
    "model loader in run_config.yaml": (_plant_in_config, "model"),
    "learner node in run_config.yaml": (_plant_in_config, "algorithm.agent"),
    "logger in run_config.yaml": (_plant_in_config, "logger"),
    "Hydra callback in the recorded overrides": (_plant_in_overrides, "hydra.callbacks.evil"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
@pytest.mark.parametrize("command", ["resume", "evaluate"])
def test_a_planted_target_is_refused_in_one_line_and_nothing_runs(tmp_path, plant, command):
    run_dir = finished_run(tmp_path)
    marker = tmp_path / "pwned"
    spoil, key = PLANTS[plant]
    spoil(run_dir, marker, key)
    before = snapshot(run_dir)
    if command == "resume":
        args = cli(f"resume={run_dir}", "iterations=3")
    else:
        args = [sys.executable, "-m", "cory.evaluate", str(run_dir), "--n", "2"]
    out = subprocess.run(args, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    if command == "evaluate" and plant.startswith("Hydra"):  # pass@k reads run_config.yaml only: no callbacks
        assert not marker.exists()
        return
    line = one_error_line(out)
    assert "builtins.open" in line and "which no installed config names" in line and "nothing was built" in line
    assert not marker.exists(), "a target planted in a run folder was called"
    assert snapshot(run_dir) == before


def test_the_trust_rule_knows_every_target_of_the_package_and_of_the_command_line():
    known = runs.known_targets()
    for path in (REPO / "cory" / "conf").rglob("*.yaml"):
        for _, target in runs._targets(yaml.safe_load(path.read_text())):
            assert target in known, (path, target)
    assert "builtins.open" not in known and "torch.load" not in known
    assert runs.targets_in(["model._target_=a.b.C", "+task.reward={_target_: d.e, x: 1}", "seed=1"]) == {
        "a.b.C",
        "d.e",
    }
    planted = {"model": {"_target_": "torch.load", "f": "x.pt", "weights_only": False}}
    with pytest.raises(runs.ConfigError, match=r"^f names model\._target_: torch\.load, which no installed config"):
        runs.refuse_unknown_targets(planted, "f")
    runs.refuse_unknown_targets(planted, "f", allowed=["torch.load"])  # the user's own command line may name it
    with pytest.raises(runs.ConfigError, match=r"names hydra\.callbacks\.x: os\.system"):
        runs.refuse_unknown_targets(["+hydra.callbacks.x={_target_: os.system, command: ls}"], "f")


def test_a_target_the_users_own_command_named_is_built_again_when_the_command_names_it_again(
    tmp_path, monkeypatch, capsys
):
    """Trust follows the command line, not the folder: a run started with a task of the user's own module resumes
    only when the resume command names it too (a sweep continued or a job requeued with its own command retypes it:
    tests/test_stop_signals.py); named again, it is built although the folder's record names it as well."""
    own = ["task._target_=helpers.paced.PacedToyTask", f"+task.barrier_dir={tmp_path / 'b'}", "+task.jobs=1"]
    run_dir = tmp_path / "run"
    start_run(tmp_path, run_dir, "iterations=2", "save_every=2", *own, "+task.pause=0")
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", "iterations=3")
    assert code == 2 and "task._target_: helpers.paced.PacedToyTask, which no installed config names" in err
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", "iterations=3", own[0])
    assert code == 0, err
    assert [r["iteration"] for r in read_rows(run_dir) if "train/llm1/kl" in r] == [1, 2, 3]
