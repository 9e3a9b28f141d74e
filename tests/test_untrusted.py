"""A run folder is input from others (a shared filesystem, downloaded results): it never makes cory run code, and a
run never reaches out of it (cory/runs.py, "Trust"; cory/checkpoints.py).

- What a run folder may set is checked on the values that will be built, after interpolation: a `_target_` no
  installed config names, or a code-loading switch (`trust_remote_code`, for a model or the classifier reward) that
  this command line did not set, in `run_config.yaml` or in the recorded overrides (`starts.jsonl`, interpolated or
  not), a key of Hydra's own node or a config group option that is not installed. `resume=` and `cory.evaluate`
  refuse each in one line before anything is imported or called, and the folder is left as it was.
- A symbolic link in a run folder is never followed: a linked `checkpoints/` (which pruning would empty), log, lock
  or summary is refused by a resume, and by a new run in that folder.
- `trainer.json` carries its own SHA-256: a shifted counter, a pending-evaluation flag or an emptied list of file
  checksums is refused, and so is a file the list leaves out when the digest was recomputed.

Each planted target would create a marker file if it ran (`builtins.open(file=<marker>, mode="w")`, or Python code
shipped with a model); the tests check the refusal, its one line, and that the marker does not exist.
Run: `pytest tests/test_untrusted.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.runners import (
    REPO,
    cli,
    copy_of,
    env,
    finished_run,
    one_error_line,
    read_rows,
    run_main,
    snapshot,
    start_run,
)
from omegaconf import OmegaConf

from cory import runs
from cory.checkpoints import latest_checkpoint


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """`finished_run`, once for the module: each test spoils a copy."""
    return finished_run(tmp_path_factory.mktemp("finished"))


def _plant_in_config(run_dir, marker, key: str) -> None:
    cfg = OmegaConf.load(run_dir / runs.RUN_CONFIG)
    OmegaConf.update(cfg, key, {"_target_": "builtins.open", "file": str(marker), "mode": "w"}, merge=False)
    (run_dir / runs.RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg))


def _record_override(run_dir, override: str) -> None:
    """`override` added to the run's recorded first start, as if it had been typed then."""
    lines = (run_dir / runs.STARTS).read_text().splitlines()
    first = json.loads(lines[0])
    first["overrides"] = [*first["overrides"], override]
    (run_dir / runs.STARTS).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    hydra_overrides = run_dir / ".hydra" / "overrides.yaml"
    hydra_overrides.parent.mkdir(exist_ok=True)
    hydra_overrides.write_text(yaml.safe_dump([*first["overrides"]]))


def _plant_in_overrides(run_dir, marker, key: str) -> None:
    _record_override(run_dir, f"+{key}={{_target_:builtins.open,file:'{marker}',mode:w}}")


PLANTS = {
    "model loader in run_config.yaml": (_plant_in_config, "model"),
    "learner node in run_config.yaml": (_plant_in_config, "algorithm.agent"),
    "logger in run_config.yaml": (_plant_in_config, "logger"),
    "Hydra callback in the recorded overrides": (_plant_in_overrides, "hydra.callbacks.evil"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
@pytest.mark.parametrize("command", ["resume", "evaluate"])
def test_a_planted_target_is_refused_in_one_line_and_nothing_runs(finished, tmp_path, plant, command):
    run_dir = copy_of(finished, tmp_path)
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
    if plant.startswith("Hydra"):
        assert "hydra.callbacks.evil, one of Hydra's own settings" in line and "nothing was run" in line
    else:
        assert "builtins.open" in line and "which no installed config names" in line and "nothing was built" in line
    assert not marker.exists(), "a target planted in a run folder was called"
    assert snapshot(run_dir) == before


def _plant_remote_code(run_dir: Path, marker: Path) -> Path:
    """A model folder inside the run whose `config.json` maps AutoConfig to Python shipped beside it: loading it with
    `trust_remote_code=true` imports that file, which creates `marker`."""
    model = run_dir / "model"
    model.mkdir()
    auto_map = {"AutoConfig": "shipped.Config", "AutoModelForCausalLM": "shipped.Model"}
    (model / "config.json").write_text(json.dumps({"model_type": "shipped", "auto_map": auto_map}))
    (model / "shipped.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import PretrainedConfig\n\n\nclass Config(PretrainedConfig):\n    model_type = 'shipped'\n"
    )
    return model


def _numeric_task() -> dict:
    """The arithmetic task's resolved node: `cory.evaluate` loads the model only for a task with numeric answers."""
    from helpers.compose import compose_cfg

    return OmegaConf.to_container(compose_cfg(["experiment=smoke", "task=arithmetic"]).task, resolve=True)


@pytest.mark.parametrize("command", ["resume", "evaluate"])
def test_code_shipped_with_a_model_runs_only_when_this_command_line_trusts_it(finished, tmp_path, command):
    """An installed loader (`cory.models.load_pretrained`) with `trust_remote_code: true` in `run_config.yaml` would
    import the Python file a model folder of the run ships: refused in one line unless typed on this command line."""
    run_dir = copy_of(finished, tmp_path)
    marker = tmp_path / "pwned"
    model = _plant_remote_code(run_dir, marker)
    cfg = OmegaConf.load(run_dir / runs.RUN_CONFIG)
    cfg.model = {"_target_": "cory.models.load_pretrained", "name_or_path": str(model), "trust_remote_code": True}
    if command == "evaluate":
        cfg.task = _numeric_task()
    (run_dir / runs.RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg))
    before = snapshot(run_dir)
    if command == "resume":
        args = cli(f"resume={run_dir}", "iterations=3")
    else:
        args = [sys.executable, "-m", "cory.evaluate", str(run_dir), "--n", "2", "--out", str(tmp_path / "out")]
    out = subprocess.run(
        args,
        cwd=tmp_path,
        env=env(HF_MODULES_CACHE=str(tmp_path / "modules")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = one_error_line(out)
    assert "sets model.trust_remote_code: True, which lets a library import and run code" in line, line
    assert "pass model.trust_remote_code=true on the command line" in line and "nothing was built" in line
    assert not marker.exists(), "code shipped with a model of a run folder was run"
    assert snapshot(run_dir) == before


def test_the_classifier_rewards_switch_is_refused_too_and_the_command_line_can_set_it(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    cfg = OmegaConf.load(run_dir / runs.RUN_CONFIG)
    reward = {"_target_": "cory.tasks.rewards.ClassifierReward", "name_or_path": "x", "trust_remote_code": True}
    OmegaConf.update(cfg, "task.reward", reward, merge=False)
    (run_dir / runs.RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg))
    with pytest.raises(runs.ConfigError, match=r"sets task\.reward\.trust_remote_code: True, which lets a library"):
        runs.load_run_config(run_dir)
    with pytest.raises(runs.ConfigError, match=r"task\.reward\.trust_remote_code"):  # typed for another key
        runs.load_run_config(run_dir, runs.typed(["model.trust_remote_code=true"]))
    for typed in ["task.reward.trust_remote_code=true", "+task.reward={trust_remote_code: true}"]:
        assert runs.load_run_config(run_dir, runs.typed([typed])).task.reward.trust_remote_code is True


def test_an_interpolated_target_in_the_recorded_overrides_never_runs(finished, tmp_path):
    """A callback whose `_target_` only becomes `builtins.open` once resolved (`oc.decode`) is no text a pattern
    sees; Hydra would build it before cory runs. Hydra's own node is off limits to recorded overrides, and a value
    is checked as it will be built: resolved."""
    run_dir = copy_of(finished, tmp_path)
    marker = tmp_path / "pwned"
    evil = f"+hydra.callbacks.evil={{_target_:'${{oc.decode:builtins.open}}',file:'{marker}',mode:w}}"
    _record_override(run_dir, evil)
    before = snapshot(run_dir)
    out = subprocess.run(
        cli(f"resume={run_dir}", "iterations=3"), cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300
    )
    line = one_error_line(out)
    assert "its recorded overrides set hydra.callbacks.evil, one of Hydra's own settings" in line, line
    assert f"pass {evil} on the command line" in line
    assert not marker.exists() and snapshot(run_dir) == before
    with pytest.raises(runs.ConfigError, match=r"names model\._target_: \$\{oc\.decode:builtins\.open\}, which no"):
        runs.refuse_untrusted_overrides(["model._target_=${oc.decode:builtins.open}"], "f")
    planted = OmegaConf.create({"x": {"_target_": "${oc.decode:builtins.open}"}, "y": "${x}"})
    with pytest.raises(runs.ConfigError, match=r"names x\._target_: builtins\.open, which no installed config"):
        runs.plain_config(planted, "f")  # a config: checked resolved


def test_a_config_group_option_that_is_not_installed_is_refused(finished, tmp_path):
    """`experiment=../../..` would compose a file from outside the installed configs, whose Hydra node (callbacks,
    logging) Hydra itself would build."""
    run_dir = copy_of(finished, tmp_path)
    marker = tmp_path / "pwned"
    shipped = run_dir / "shipped.yaml"
    callback = {"_target_": "builtins.open", "file": str(marker), "mode": "w"}
    shipped.write_text("# @package _global_\n" + yaml.safe_dump({"hydra": {"callbacks": {"evil": callback}}}))
    option = os.path.relpath(shipped.with_suffix(""), REPO / "cory" / "conf" / "experiment")
    _record_override(run_dir, f"+experiment@_global_={option}")
    before = snapshot(run_dir)
    out = subprocess.run(
        cli(f"resume={run_dir}", "iterations=3"), cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300
    )
    line = one_error_line(out)
    assert f"choose experiment={option}, which is no installed option of experiment" in line, line
    assert not marker.exists() and snapshot(run_dir) == before


def test_the_trust_rule_knows_every_target_of_the_package_and_of_the_command_line():
    known = runs.known_targets()
    for path in (REPO / "cory" / "conf").rglob("*.yaml"):
        for _, name, target in runs._leaves(yaml.safe_load(path.read_text()), ""):
            assert name != "_target_" or target in known, (path, target)
    assert "builtins.open" not in known and "torch.load" not in known
    trusted = runs.typed(["model._target_=a.b.C", "+task.reward={_target_: d.e, x: 1}", "seed=1", "bad=[", "s=1,2"])
    assert trusted.targets == {"a.b.C", "d.e"} and not trusted.values
    planted = {"model": {"_target_": "torch.load", "f": "x.pt", "weights_only": False}}
    with pytest.raises(runs.ConfigError, match=r"^f names model\._target_: torch\.load, which no installed config"):
        runs.refuse_untrusted(planted, "f")
    runs.refuse_untrusted(planted, "f", runs.typed(["model._target_=torch.load"]))  # the user's own command line
    for value in ({"a": 1}, [True], "yes", 1):  # anything but false or absent: a truthy value turns it on
        with pytest.raises(runs.ConfigError, match=r"^f sets model\.trust_remote_code: "):
            runs.refuse_untrusted({"model": {"trust_remote_code": value}}, "f")
    with pytest.raises(runs.ConfigError, match=r"^f names model\._target_: \['os\.system'\]"):
        runs.refuse_untrusted({"model": {"_target_": ["os.system"]}}, "f")
    with pytest.raises(runs.ConfigError, match=r"set hydra\.callbacks\.x, one of Hydra's own settings"):
        runs.refuse_untrusted_overrides(["+hydra.callbacks.x={_target_: os.system, command: ls}"], "f")
    with pytest.raises(runs.ConfigError, match=r"names model\._target_: os\.system"):
        runs.refuse_untrusted_overrides(["model._target_=os.system"], "f")
    runs.refuse_untrusted_overrides(
        ["experiment=smoke", "task/reward=tfidf", "seed=3", "model._target_=x.Y"],
        "f",
        runs.typed(["model._target_=x.Y"]),
    )


def test_a_target_the_users_own_command_named_is_built_again_when_the_command_names_it_again(
    tmp_path, monkeypatch, capsys
):
    """Trust follows the command line, not the folder: a run started with a task of the user's own module resumes
    only when the resume command names it too (a sweep continued or a job requeued with its own command retypes it:
    tests/test_stop_signals.py); named again, it is built although the folder's record names it as well."""
    own = ["task.reward._target_=helpers.paced.PacedReward", f"+task.reward.barrier_dir={tmp_path / 'b'}"]
    own += ["+task.reward.jobs=1"]
    run_dir = tmp_path / "run"
    start_run(tmp_path, run_dir, "iterations=2", "save_every=2", *own, "+task.reward.pause=0")
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", "iterations=3")
    assert code == 2 and "task.reward._target_: helpers.paced.PacedReward, which no installed config names" in err
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", "iterations=3", own[0])
    assert code == 0, err
    assert [r["iteration"] for r in read_rows(run_dir) if "train/llm1/kl" in r] == [1, 2, 3]


# ------------------------------------------------------------------------------------------------ links
def _files_and_links(folder: Path) -> dict[str, object]:
    """Every entry under `folder` (links not followed): a file's bytes, a link's target, a folder's name."""
    out: dict[str, object] = {}
    for top, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(top) / name
            rel = str(path.relative_to(folder))
            out[rel] = (
                ("link", os.readlink(path)) if path.is_symlink() else path.read_bytes() if path.is_file() else "/"
            )
    return out


def _link_checkpoints(run_dir: Path, outside: Path) -> Path:
    """`checkpoints/` moved out beside a folder of the victim's and linked back: pruning would delete in there."""
    shutil.move(run_dir / "checkpoints", outside)
    (outside / "iter_000000").mkdir()
    (outside / "iter_000000" / "precious.txt").write_text("the victim's")
    (run_dir / "checkpoints").symlink_to(outside)
    return outside


def _link_file(name: str):
    def link(run_dir: Path, outside: Path) -> Path:
        outside.mkdir()
        target = outside / "precious.txt"
        target.write_text((run_dir / name).read_text() if (run_dir / name).exists() else "the victim's\n")
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(target)
        return outside

    return link


LINKS = {
    "checkpoints/": _link_checkpoints,
    "metrics.jsonl": _link_file("metrics.jsonl"),
    "run.lock": _link_file("run.lock"),
    "summary.json": _link_file("summary.json"),
}


@pytest.mark.parametrize("link", list(LINKS))
def test_a_link_in_a_run_folder_is_never_followed(finished, tmp_path, monkeypatch, capsys, link):
    run_dir = copy_of(finished, tmp_path)
    outside = LINKS[link](run_dir, tmp_path / "victim")
    before, victim = _files_and_links(run_dir), _files_and_links(outside)
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", "iterations=4", "save_every=1")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: resume={run_dir}: {link.rstrip('/')} is a symbolic link (to {outside}"), err
    assert "a run never follows a link out of its folder" in err
    assert _files_and_links(outside) == victim, "a run wrote or deleted through a link of its folder"
    assert _files_and_links(run_dir) == before


def test_a_new_run_refuses_a_folder_holding_a_link(tmp_path, monkeypatch, capsys):
    folder, victim = tmp_path / "run", tmp_path / "victim.txt"
    folder.mkdir()
    victim.write_text("the victim's\n")
    (folder / "samples.jsonl").symlink_to(victim)  # not a run yet: no run_config.yaml, metrics or checkpoints
    code, err = run_main(monkeypatch, capsys, "experiment=smoke", "progress=false", f"hydra.run.dir={folder}")
    assert code == 2 and err.startswith(f"error: hydra.run.dir={folder}: samples.jsonl is a symbolic link"), err
    assert victim.read_text() == "the victim's\n" and sorted(p.name for p in folder.iterdir()) == ["samples.jsonl"]


# ------------------------------------------------------------------------------------------------ trainer.json
def _sign(state: dict) -> dict:
    """As an editor who knows the scheme would: trainer.json's own digest recomputed after the edit."""
    rest = {k: v for k, v in state.items() if k != "state_sha256"}
    return rest | {"state_sha256": hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()}


EDITS = {  # an edit of trainer.json → what the one-line refusal says
    "a shifted counter": (lambda s: s | {"metrics_lines": s["metrics_lines"] - 2}, "does not match the checksum"),
    "a pending-evaluation flag": (lambda s: s | {"pending_eval": True}, "does not match the checksum"),
    "the file checksums emptied": (lambda s: s | {"files": {}}, "does not match the checksum"),
    "the file checksums emptied, digest recomputed": (
        lambda s: _sign(s | {"files": {}}),
        "algorithm/llm1/agent.json has no checksum in trainer.json",
    ),
    "a counter above the log, digest recomputed": (
        lambda s: _sign(s | {"metrics_lines": s["metrics_lines"] + 3}),
        "counts 7 lines of metrics.jsonl, which holds 4",
    ),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_trainer_json_is_refused_in_one_line(finished, tmp_path, monkeypatch, capsys, edit):
    run_dir = copy_of(finished, tmp_path)
    path = latest_checkpoint(run_dir) / "trainer.json"
    change, message = EDITS[edit]
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    before = snapshot(run_dir)
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", "iterations=3")
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert snapshot(run_dir) == before
