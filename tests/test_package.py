"""cory as an installable package: the wheel carries the configs and the console commands, `cory-train` completes
on the command line, and another project adds a task and a reward by `_target_` without editing cory.

- a wheel built from the checkout holds every YAML of `cory/conf` and the two console commands, and installed into a
  folder of its own it composes and validates a run with no checkout in sight;
- `cory-train` (installed by `make install`, editable) runs the smoke experiment, and Hydra's shell completion answers
  through it (it cannot through `python -m cory.train`);
- a package made in a temporary folder outside the repository, on PYTHONPATH, brings a task class, a reward class and
  their YAML (through a Hydra search-path plugin, as docs/extending.md shows): `cory-train task=<theirs>` trains on it.

Run: `pytest tests/test_package.py` (about a minute on 2 CPUs; the wheel build and the runs are subprocesses).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from helpers.runners import env

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(args: list[str], cwd: Path, extra_env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        args, cwd=cwd, env=env() | (extra_env or {}), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_the_wheel_carries_every_config_and_the_console_commands(tmp_path):
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO), "-w", "wheel"],
        tmp_path,
    )
    (wheel,) = (tmp_path / "wheel").glob("cory-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {str(p.relative_to(REPO)) for p in (REPO / "cory" / "conf").rglob("*.yaml")}
    assert configs and configs <= names, sorted(configs - names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "cory-train = cory.train:main" in text and "cory-evaluate = cory.evaluate:main" in text
    for study in ("cory-plot", "cory-report", "cory-measure", "cory-sweep", "cory-gpt2-small"):  # cory/studies
        assert f"{study} = cory.studies." in text, study
    assert not any(n.startswith(("tests/", "outputs/", "scripts/")) for n in names)

    # installed alone (its dependencies are this venv's), away from the checkout: the configs come from the wheel
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", "site", str(wheel)], tmp_path)
    site = {"PYTHONPATH": str(tmp_path / "site")}
    where = _run([sys.executable, "-c", "import cory.cli; print(cory.cli.CONF_DIR)"], tmp_path, site).stdout.strip()
    assert Path(where) == tmp_path / "site" / "cory" / "conf"
    job = _run(
        [sys.executable, "-m", "cory.train", "experiment=smoke", "algorithm=cory", "--cfg", "job"], tmp_path, site
    )
    assert "_target_: cory.algorithms.team.Team" in job.stdout and "_target_: cory.ppo.learner.PPOConfig" in job.stdout
    assert "name: cory" in job.stdout  # the episode part of algorithm=cory, from the wheel's configs


@pytest.mark.long
@pytest.mark.slow
def test_cory_train_runs_and_completes_on_the_command_line(tmp_path):
    command = BIN / "cory-train"
    assert command.is_file(), "cory-train is missing: `make install` installs the package (pip install -e .)"
    _run(
        [str(command), "experiment=smoke", "progress=false", "iterations=2", f"hydra.run.dir={tmp_path / 'run'}"], REPO
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed"] is True

    def complete(line: str) -> list[str]:
        out = _run([str(command), "-sc", "query=bash"], tmp_path, {"COMP_LINE": line, "COMP_POINT": str(len(line))})
        return out.stdout.split()

    shipped = sorted(f"algorithm={p.stem}" for p in (REPO / "cory" / "conf" / "algorithm").glob("*.yaml"))
    assert complete("cory-train algorithm=") == shipped and "algorithm=cory" in shipped
    assert complete("cory-train experiment=smo") == ["experiment=smoke"]
    script = _run([str(command), "--shell-completion", "install=bash"], tmp_path).stdout
    assert "complete -o nospace -o default -F hydra_bash_completion cory-train" in script


EXTERNAL = {
    "myext/__init__.py": "",
    "myext/rewards.py": '''
        """A reward of another project: how often a letter occurs in each text."""


        class LetterReward:
            def __init__(self, letter: str) -> None:
                self.letter = letter

            def __call__(self, texts: list[str]) -> list[float]:
                return [float(text.count(self.letter)) for text in texts]
        ''',
    "myext/conf/__init__.py": "",
    "myext/conf/task/letters.yaml": """
        # cory's toy task, its reward a part of this project (a task is configured, never subclassed)
        _target_: cory.tasks.toy.ToyTask
        name: letters
        reward:
          _target_: myext.rewards.LetterReward
          letter: e
        scored: response
        num_train: 512
        num_eval: 32
        query_chars: [2, 6]
        max_new_tokens: [6, 10]
        generation_kwargs: {do_sample: true, top_k: 0, top_p: 1.0, temperature: 1.0}
        eval_kl_coef: 0.3
        failure_reward: 0.0
        observer_template: "{query}{response}|{query}"
        seed: ${seed}
        """,
    "hydra_plugins/myext_searchpath/__init__.py": """
        from hydra.core.config_search_path import ConfigSearchPath
        from hydra.plugins.search_path_plugin import SearchPathPlugin


        class MyextSearchPath(SearchPathPlugin):
            def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
                search_path.append(provider="myext", path="pkg://myext.conf")
        """,
}


@pytest.mark.long
@pytest.mark.slow
def test_another_project_adds_a_task_config_and_a_reward_without_editing_cory(tmp_path):
    project = tmp_path / "myproject"
    for name, text in EXTERNAL.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(textwrap.dedent(text).lstrip())
    assert REPO not in project.parents
    before = subprocess.run(["git", "status", "--porcelain", "cory"], cwd=REPO, capture_output=True, text=True).stdout
    extra = {"PYTHONPATH": os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")])}
    run_dir = tmp_path / "run"
    args = [str(BIN / "cory-train"), "experiment=smoke", "task=letters", "progress=false", "iterations=2"]
    _run([*args, "task.reward.letter=a", f"hydra.run.dir={run_dir}"], tmp_path, extra)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((run_dir / "summary.json").read_text())["task"] == "letters"
    rewards = [r["train/llm1/task_reward"] for r in rows if "train/llm1/task_reward" in r]
    assert len(rewards) == 2 and all(r == int(r * 16) / 16 for r in rewards)  # letter counts, batch mean of 16
    # a typo in the other project's keys is one line, as for cory's own
    bad = subprocess.run(
        [*args, "+task.reward.leter=a", f"hydra.run.dir={tmp_path / 'bad'}"],
        cwd=tmp_path,
        env=env() | extra,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: task.reward.leter")
    after = subprocess.run(["git", "status", "--porcelain", "cory"], cwd=REPO, capture_output=True, text=True).stdout
    assert after == before  # nothing of cory was edited


DOC_FILE = re.compile(r"```(?:python|yaml)\n# ((?:mypkg|hydra_plugins)/\S+)[^\n]*\n(.*?)```", re.S)


@pytest.mark.long
@pytest.mark.slow
def test_docs_extending_examples_run_as_printed_from_an_outside_package(tmp_path):
    """docs/extending.md's credit rule, advantage estimator, method from parts alone, task, reward and search-path
    plugin, written verbatim into a package outside the repository: each runs through `cory-train` with no file of
    cory added or changed."""
    blocks = DOC_FILE.findall((REPO / "docs" / "extending.md").read_text())
    written = {path for path, _ in blocks}
    assert {"mypkg/credit.py", "mypkg/estimators.py", "mypkg/tasks.py", "mypkg/rewards.py"} <= written
    assert {"mypkg/conf/algorithm/independent.yaml", "mypkg/conf/algorithm/credit/mean_team.yaml"} <= written
    assert "hydra_plugins/mypkg_searchpath/__init__.py" in written
    project = tmp_path / "mypkg_project"
    for path, text in blocks:
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text)
    for package in ("mypkg", "mypkg/conf"):
        (project / package / "__init__.py").touch()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a good day {i} and\n" for i in range(40)))
    extra = {"PYTHONPATH": os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")])}
    before = subprocess.run(["git", "status", "--porcelain", "cory"], cwd=REPO, capture_output=True, text=True).stdout
    smoke = [str(BIN / "cory-train"), "experiment=smoke", "progress=false"]

    def run(name: str, *overrides: str) -> tuple[dict, list[dict]]:
        _run([*smoke, *overrides, f"hydra.run.dir={tmp_path / name}"], tmp_path, extra)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return json.loads((tmp_path / name / "summary.json").read_text()), [r for r in rows if "train/llm1/kl" in r]

    # a method from parts alone: two agents, each on its own reward, nobody sees another's answer
    independent, rows = run("independent", "algorithm=independent", "iterations=2")
    assert independent["algorithm"] == "independent" and set(independent["agents"]) == {"llm1", "llm2"}
    assert all(r["train/llm1/collective_reward"] == r["train/llm1/task_reward"] for r in rows)
    _run([str(BIN / "cory-train"), f"resume={tmp_path / 'independent'}", "iterations=3"], tmp_path, extra)
    rows = [json.loads(line) for line in (tmp_path / "independent" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "train/llm2/kl" in r] == [1, 2, 3]  # checkpoint, resume, one more
    # a credit rule: both agents learn the mean of their task rewards
    mean_team, rows = run("credit", "algorithm=cory", "algorithm/credit=mean_team", "iterations=1")
    assert mean_team["algorithm"] == "cory_mean_team" and mean_team["credit"] == "mean_team"
    for r in rows:
        team = (r["train/llm1/task_reward"] + r["train/llm2/task_reward"]) / 2
        assert r["train/llm1/collective_reward"] == pytest.approx(team, abs=1e-6)
        assert r["train/llm2/collective_reward"] == pytest.approx(team, abs=1e-6)
    # an advantage estimator without a critic
    batch_mean, rows = run("estimator", "algorithm=cory", "algorithm/advantage=batch_mean", "algorithm/critic=none")
    assert batch_mean["algorithm"] == "cory_batch_mean" and batch_mean["advantage"] == "batch_mean"
    assert rows and not any("ppo/llm1/value_loss" in r for r in rows)  # no value term, no value head trained
    assert any(r["ppo/llm1/policy_loss"] != 0 for r in rows)
    refused = subprocess.run(
        [*smoke, "algorithm=cory", "algorithm/advantage=batch_mean", f"hydra.run.dir={tmp_path / 'refused'}"],
        cwd=tmp_path,
        env=env() | extra,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2 and "would be trained for nothing" in refused.stderr.strip().splitlines()[-1]
    prompts_run, _ = run("prompts", "task=prompts", f"task.path={prompts}", "iterations=1")
    assert prompts_run["task"] == "prompts"
    after = subprocess.run(["git", "status", "--porcelain", "cory"], cwd=REPO, capture_output=True, text=True).stdout
    assert after == before  # nothing of cory was edited
