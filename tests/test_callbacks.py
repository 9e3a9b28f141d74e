"""Sweeps end to end and the end-of-sweep callback (`cory/callbacks.py`, `cory/conf/sweep/*.yaml`).

- A tiny-model sweep of 2 jobs (`experiment=smoke sweep=fig3_imdb seed=0`) runs through Hydra's basic launcher with
  `logger=wandb` offline: every run lands in the W&B group named after the sweep with its choices and overrides as
  tags, and the callback writes frontier.{png,csv,json} and a `job_type="summary"` W&B run holding the frontier
  table, its scatter chart and the PNG (checked by reading the offline run files, `.wandb` records included).
- The same sweep runs through the joblib launcher (2 processes).
- The callback never fails a sweep; group and tag rules; every job of every sweep file composes.
Run: `pytest tests/test_callbacks.py` (about a minute: two sweeps in subprocesses).
"""

from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.compose import CONF_DIR, compose_cfg
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from cory import callbacks, frontier

REPO = Path(__file__).resolve().parents[1]
SWEEPS = sorted(p.stem for p in (Path(CONF_DIR) / "sweep").glob("*.yaml"))
# The experiment each sweep is meant for (its header comment); None: the sweep chooses the experiment itself.
SWEEP_EXPERIMENT = {
    "fig3_imdb": "imdb_gpt2",
    "fig6_ablations": None,
    "coop_vs_comp": "imdb_gpt2",
    "imdb_kl_frontier": "imdb_gpt2",
    "gsm8k_kl_frontier": "gsm8k_llama2",
    "gsm8k_curves": "gsm8k_llama2",
    "gsm8k_robustness": "gsm8k_llama2",
    "cpu_imdb_curves": "cpu_imdb",
    "cpu_imdb_frontier": "cpu_imdb",
    "imdb_claim": None,  # the sweep chooses its experiments (the arms)
    "imdb_claim2": None,
    "imdb_claim2_pilot": None,
    "family_arithmetic": "gsm8k_cpu",
    "family_parts": "gsm8k_cpu",
}


def wandb_records(run_file: Path) -> list:
    """The protobuf records of an offline `run-<id>.wandb` file (W&B's LevelDB-style log: a 7-byte file header,
    32 KiB blocks of chunks, each chunk `crc32 u32, length u16, type u8` + data; FULL=1, FIRST=2, MIDDLE=3, LAST=4)."""
    from wandb.proto import wandb_internal_pb2

    data, block = run_file.read_bytes(), 32768
    assert data[:4] == b":W&B"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def offline_run(folder: Path) -> dict:
    """What one offline W&B run under `folder/wandb/` recorded: run (group, job type, tags), config, summary."""
    (run_file,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    out = {"dir": run_file.parent, "config": {}, "summary": {}}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out |= {"group": run.run_group, "job_type": run.job_type, "tags": list(run.tags)}
        for item in record.config.update if kind == "config" else []:
            out["config"][tuple(item.nested_key) or (item.key,)] = json.loads(item.value_json)
        for item in record.summary.update if kind == "summary" else []:
            out["summary"][tuple(item.nested_key) or (item.key,)] = json.loads(item.value_json)
    return out


def _sweep(tmp_path: Path, *extra: str, env: dict | None = None) -> tuple[Path, subprocess.CompletedProcess]:
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "cory.train", "experiment=smoke", "sweep=fig3_imdb", "seed=0", "progress=false",
           f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep_dir}", *extra]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"} | (env or {})
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir, proc


def _summaries(sweep_dir: Path) -> dict[str, dict]:
    found = {}
    for path in sweep_dir.rglob("summary.json"):
        summary = json.loads(path.read_text())
        assert summary["completed"] is True
        found[summary["algorithm"]] = summary
    return found


@pytest.mark.long
def test_sweep_groups_its_runs_in_wandb_and_logs_the_frontier_at_the_end(tmp_path):
    sweep_dir, proc = _sweep(tmp_path, "logger=wandb", env={"WANDB_MODE": "offline"})
    summaries = _summaries(sweep_dir)
    assert set(summaries) == {"ppo", "cory"}  # fig3_imdb = algorithm ppo,cory × seeds; seed=0 narrows it to 2 jobs

    # every run: one W&B group named after the sweep, its group choices and overrides as tags
    for run_dir in {p.parent for p in sweep_dir.rglob("summary.json")}:
        algorithm = json.loads((run_dir / "summary.json").read_text())["algorithm"]
        run = offline_run(run_dir)
        assert run["group"] == "fig3_imdb" and run["job_type"] == "train"
        assert {f"algorithm={algorithm}", "seed=0", "sweep=fig3_imdb", "experiment=smoke", "model=tiny_gpt2"} <= set(
            run["tags"]
        )
        assert not any(t.startswith(("hydra", "progress", "cache_dir")) for t in run["tags"])

    # the callback: frontier files in the sweep folder, holding exactly the runs' final evaluations
    expected = sorted(
        (s["algorithm"], s["kl_coef"], s["seed"], agent, m["task_reward"], m["kl"], m["combined_reward"])
        for s in summaries.values()
        for agent, m in s["agents"].items()
    )
    assert len(expected) == 3  # ppo llm1, cory llm1 and llm2
    with (sweep_dir / "frontier.csv").open() as f:
        rows = list(csv.DictReader(f))
    got = sorted(
        (r["algorithm"], float(r["kl_coef"]), int(r["seed"]), r["agent"], float(r["task_reward"]), float(r["kl"]),
         float(r["combined_reward"]))
        for r in rows
    )  # fmt: skip
    assert got == expected
    assert (sweep_dir / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert "sweep frontier" in proc.stdout

    # ... and the summary run in the same group, read back from its offline files
    summary_run = offline_run(sweep_dir)
    assert (summary_run["group"], summary_run["job_type"]) == ("fig3_imdb", "summary")
    table_file = summary_run["dir"] / "files" / summary_run["summary"][("frontier/points", "path")]
    table = json.loads(table_file.read_text())
    assert table["columns"] == list(frontier.COLUMNS)
    wandb_rows = sorted(tuple(r[:7]) for r in table["data"])
    assert wandb_rows == [tuple(e) for e in expected]
    assert all(r[7] == -r[5] for r in table["data"])  # neg_kl, the frontier's y-axis
    chart = summary_run["config"][("_wandb", "visualize", "frontier/scatter")]
    assert chart["panel_config"]["panelDefId"] == "wandb/scatter/v0"
    assert chart["panel_config"]["fieldSettings"] == {"x": "task_reward", "y": "neg_kl"}
    assert (
        summary_run["summary"][("frontier/scatter_table", "path")]
        == summary_run["summary"][("frontier/points", "path")]
    )  # the chart draws the points table
    image = summary_run["dir"] / "files" / summary_run["summary"][("frontier/png", "path")]
    assert image.read_bytes() == (sweep_dir / "frontier.png").read_bytes()
    means = json.loads(
        (summary_run["dir"] / "files" / summary_run["summary"][("frontier/seed_means", "path")]).read_text()
    )
    assert len(means["data"]) == 3


@pytest.mark.long
@pytest.mark.slow
def test_sweep_runs_through_the_joblib_launcher(tmp_path):
    sweep_dir, proc = _sweep(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert "Joblib" in proc.stdout + proc.stderr
    assert set(_summaries(sweep_dir)) == {"ppo", "cory"}
    assert len(list(csv.DictReader((sweep_dir / "frontier.csv").open()))) == 3
    assert not list(sweep_dir.rglob("offline-run-*"))  # logger=jsonl: no W&B run at all


def test_callback_failure_is_one_warning_and_never_fails_the_sweep(tmp_path, monkeypatch, capsys):
    run = tmp_path / "sweep" / "0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(
        json.dumps({"algorithm": "ppo", "kl_coef": 0.1, "seed": 0, "agents": {"llm1": {"task_reward": 1, "kl": 2}}})
    )
    cfg = compose_cfg(["experiment=smoke", f"hydra.sweep.dir={tmp_path / 'sweep'}"], return_hydra_config=True)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device\nsecond line")

    monkeypatch.setattr(frontier, "write_frontier", disk_full)
    callbacks.FrontierCallback().on_multirun_end(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["[cory] WARNING: sweep summary failed (OSError: No space left on device); draw it with "
                   "`cory-plot frontier`"]  # fmt: skip


def test_callback_without_finished_runs_warns_and_writes_nothing(tmp_path, capsys):
    cfg = compose_cfg(["experiment=smoke", "logger=wandb"], return_hydra_config=True)
    assert callbacks.summarise_sweep(tmp_path, cfg) is None
    assert "no finished run" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_group_is_the_loggers_then_the_sweeps_then_the_experiments():
    choices = {"experiment": "smoke"}
    assert callbacks.wandb_group(compose_cfg(["logger=wandb"]), choices) == "smoke"
    assert callbacks.wandb_group(compose_cfg(["logger=wandb", "sweep=fig3_imdb"]), choices) == "fig3_imdb"
    assert callbacks.wandb_group(compose_cfg(["logger=wandb", "sweep=fig3_imdb", "logger.group=mine"]), choices) == (
        "mine"
    )


def test_tags_hold_choices_and_overrides_but_not_where_a_run_ran():
    choices = {"model": "tiny_gpt2", "hydra/launcher": "joblib", "algorithm": "cory"}
    overrides = ["algorithm=cory", "+algorithm.agent.init_kl_coef=0.01", "cache_dir=/tmp/c", "progress=false",
                 "model.name_or_path=/a/very/long/local/path/to/some/model/checkpoint/folder/and/on"]  # fmt: skip
    tags = callbacks.wandb_tags(choices, overrides, ["task=toy"])
    assert tags[:3] == ["algorithm=cory", "model=tiny_gpt2", "algorithm.agent.init_kl_coef=0.01"]
    assert tags[3] == "model.name_or_path=/a/very/long/local/path/to/some/model/checkpoint/"[:64]
    assert tags[4:] == ["task=toy"] and all(len(t) <= 64 for t in tags)


def test_identity_is_the_first_starts_even_after_a_resume(tmp_path, monkeypatch):
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # no Hydra run of an earlier test in this process
    first = compose_cfg(["experiment=smoke", "sweep=fig3_imdb", "algorithm=cory"], return_hydra_config=True)
    (tmp_path / ".hydra" / "resumed").mkdir(parents=True)
    OmegaConf.save({"hydra": first.hydra}, tmp_path / ".hydra" / "hydra.yaml")
    resumed = compose_cfg([f"resume={tmp_path}"], return_hydra_config=True)  # what a resumed start records
    OmegaConf.save({"hydra": resumed.hydra}, tmp_path / ".hydra" / "resumed" / "hydra.yaml")
    choices, overrides = callbacks.run_identity(tmp_path)
    assert choices["experiment"] == "smoke" and choices["sweep"] == "fig3_imdb" and choices["algorithm"] == "cory"
    assert overrides == ["experiment=smoke", "sweep=fig3_imdb", "algorithm=cory"]
    assert callbacks.run_identity(tmp_path / "elsewhere") == ({}, [])  # outside Hydra, no record: nothing


def test_sweep_files_follow_the_convention():
    """Every sweep is a multirun whose W&B group is named after its file, and has an experiment entry above."""
    assert sorted(SWEEP_EXPERIMENT) == SWEEPS
    for sweep in SWEEPS:
        cfg = compose_cfg([f"sweep={sweep}"], return_hydra_config=True)
        assert cfg.hydra.mode.name == "MULTIRUN" and cfg.hydra.sweeper.params, sweep
        assert cfg.sweep.name == sweep


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_job_of_every_sweep_composes_with_its_swept_values(sweep):
    from cory.studies import run_sweep

    experiment = SWEEP_EXPERIMENT[sweep]
    if experiment and not (Path(CONF_DIR) / "experiment" / f"{experiment}.yaml").exists():
        pytest.skip(f"experiment={experiment} is not in this checkout yet")
    jobs, _ = run_sweep.expand([f"sweep={sweep}"] + ([f"experiment={experiment}"] if experiment else []))
    assert len({tuple(sorted(j)) for j in jobs}) == len(jobs) > 1
    for job in jobs:
        missing = [
            o for o in job if o.startswith("model=") and not (Path(CONF_DIR) / "model" / f"{o[6:]}.yaml").exists()
        ]
        if missing:
            pytest.skip(f"{missing[0]} is not in this checkout yet")
        cfg = compose_cfg(job, return_hydra_config=True)
        for override in OverridesParser.create().parse_overrides(job):
            key, value = override.key_or_group, override.value()
            if "." in key or key == "seed":  # a value: the composed config holds it
                assert OmegaConf.select(cfg, key) == value, override.input_line
            else:  # a config-group choice
                assert cfg.hydra.runtime.choices[key] == value, override.input_line
        assert cfg.sweep.name == sweep


def _readme_sweep_commands() -> list[list[str]]:
    """The overrides of every sweep command the README and the docs pages print (`python -m cory.train -m ...` with
    `sweep=`, and `cory-sweep ...`), in backticks or in code blocks."""
    import re
    import shlex

    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    text = re.sub(r"\\\n\s*", " ", text)  # a command continued with `\` is one command
    found = []
    commands = r"(?:python|cory-sweep) "
    for line in re.findall(rf"`({commands}[^`]+)`", text) + re.findall(rf"^({commands}[^\n#]+)", text, flags=re.M):
        args = shlex.split(line.strip())
        if any("<" in a for a in args):  # a pattern (`experiment=<exp>`), not a command
            continue
        if args[:3] == ["python", "-m", "cory.train"] and any(a.startswith("sweep=") for a in args):
            found.append([a for a in args[3:] if a != "-m"])
        elif args[:1] == ["cory-sweep"] and any(a.startswith("sweep=") for a in args):
            found.append([a for a in args[1:] if "=" in a and not a.startswith("--")])
    return found


@pytest.mark.long
def test_every_sweep_command_of_the_readme_composes():
    from cory.studies import run_sweep

    commands = _readme_sweep_commands()
    assert len(commands) >= 8  # the reproduction table, the GSM8K sweeps are prose; the cluster block; the cookbook
    for overrides in commands:
        experiment = next((o.split("=", 1)[1] for o in overrides if o.startswith("experiment=")), None)
        if experiment and not (Path(CONF_DIR) / "experiment" / f"{experiment}.yaml").exists():
            continue  # the GSM8K sweeps, until their experiment lands
        jobs, _ = run_sweep.expand(overrides)
        for job in jobs:
            cfg = compose_cfg(job, return_hydra_config=True)
            assert cfg.sweep.name in SWEEPS, overrides
