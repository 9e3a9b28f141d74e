"""Every study command (`cory/studies`) answers a bad input in one `error:` line with exit code 2, never a traceback.

One test per input class, each over every command it applies to: an empty input, a partial one (a file cut short or
without what the command needs), text where a number belongs, NaN, a corrupt file (not JSON, the wrong type, not
text), an output folder that cannot be written, and a mistyped command line. Nothing is written when an input is
refused. Beside them: Ctrl-C is one line and exit code 130, a bug keeps its traceback, and each installed command
answers in its own process (imports included) in one line. Fake inputs in the formats the runs write; the tiny model
where a command builds a run.
Run: `pytest tests/test_studies.py` (about a minute on 2 CPUs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cory.studies import (
    claim2_report,
    claim_report,
    command,
    family_report,
    kl_optimum,
    make_gpt2_small,
    measure,
    paired_test,
    plot,
    plot_curves,
    plot_frontier,
    precision_gap,
    report,
    reward_spread,
    run_sweep,
    stop_latency,
)

REPO = Path(__file__).resolve().parents[1]
NAN = float("nan")


# ------------------------------------------------------------------------------------------------ inputs
def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _curve_rows(value=0.5) -> list[dict]:
    return [{"iteration": i, "train/llm1/task_reward": value, "train/llm1/kl": value} for i in range(3)]


def _summary(reward=0.5, kl=1.0, **extra) -> dict:
    return {"algorithm": "ppo", "kl_coef": 0.1, "seed": 0, "iterations": 2, "completed": True,
            "agents": {"llm1": {"task_reward": reward, "kl": kl, "combined_reward": 0.2}}} | extra  # fmt: skip


def _claim_results(root: Path, reward=1.0, kl=2.0, summary: str | None = None) -> Path:
    """Arm B's two experiments, two seeds each, as `cory-sweep --results` keeps them; `reward`/`kl`: the last
    evaluation of CORY's seed 0 (where a bad value goes)."""
    for experiment in ("imdb_claim_ppo", "imdb_claim_cory_released"):
        for seed in (0, 1):
            folder = root / f"experiment={experiment}" / f"seed={seed}"
            last = (reward, kl) if (experiment, seed) == ("imdb_claim_cory_released", 0) else (1.0, 2.0)
            rows = [
                {"iteration": k, "eval/llm1/task_reward": r, "eval/llm1/kl": x, "eval/llm1/combined_reward": 0.0}
                for k, (r, x) in ((0, (0.0, 0.0)), (20, last))
            ]
            _write(folder / "metrics.jsonl", _jsonl(rows))
            _write(folder / "summary.json", summary if summary is not None else json.dumps({"completed": True}))
    return root


def _claim2_results(root: Path, reward=0.95, kl=2.0, summary: str | None = None) -> Path:
    """The second claim study's main comparison (PPO and CORY), two seeds each, as `cory-sweep --results` keeps them;
    `reward`/`kl`: the last evaluation of CORY's seed 0 (where a bad value goes)."""
    for experiment in ("imdb_claim2_ppo", "imdb_claim2_cory"):
        for seed in (0, 1):
            folder = root / f"experiment={experiment}" / f"seed={seed}"
            last = (reward, kl) if (experiment, seed) == ("imdb_claim2_cory", 0) else (0.95, 2.0)
            rows = [{"iteration": k, "eval/llm1/task_reward": r, "eval/llm1/kl": x}
                    for k, (r, x) in ((0, (0.5, 0.0)), (10, (0.9, 1.0)), (20, (0.92, 1.5)), (30, last))]  # fmt: skip
            _write(folder / "metrics.jsonl", _jsonl(rows))
            _write(folder / "summary.json", summary if summary is not None else json.dumps({"completed": True}))
    return root


def _family_results(root: Path, summary: dict | str | None = None, passk: dict | None = None) -> Path:
    for seed in (0, 1):
        folder = root / "algorithm=ppo" / f"seed={seed}"
        body = summary if seed == 0 and summary is not None else _summary()
        _write(folder / "summary.json", body if isinstance(body, str) else json.dumps(body))
        _write(folder / "metrics.jsonl", _jsonl([{"iteration": 0, "time/iteration_s": 2.0}]))
        if passk is not None and seed == 0:
            _write(folder / "passk.json", json.dumps(passk))
    return root


def _outcomes(folder: Path, rows: list[dict] | str) -> Path:
    return _write(folder / "eval_outcomes.jsonl", rows if isinstance(rows, str) else _jsonl(rows))


def _outcome_rows(n: int = 4, vote=1, keep: int | None = None) -> list[dict]:
    rows = [{"iteration": 1, "problem": i, "n": n, "id": f"p{i}", "truth": "1", "vote": vote if i == 0 else i % 2}
            for i in range(n)]  # fmt: skip
    return rows[:keep] if keep is not None else rows


def _tokenizer(folder: Path, encoder: str | None = None, bpe: str | None = None) -> Path:
    vocab = {"h": 0, "e": 1, "he": 2, "<|endoftext|>": 3}
    _write(folder / "encoder.json", encoder if encoder is not None else json.dumps(vocab))
    _write(folder / "vocab.bpe", bpe if bpe is not None else "#version: 0.2\nh e\n")
    return folder


def _blocked(tmp_path: Path) -> Path:
    """A path under a file: no folder can be made there, whatever the user's permissions (root included)."""
    blocker = _write(tmp_path / "a_file", "")
    return blocker / "out"


GPT2 = ["--n-layer", "1", "--n-head", "1", "--n-embd", "8"]
SMOKE = ["experiment=smoke"]

# Each case: (main, argv, what the one line must say), built in a tmp folder; a string says why a class does not apply.
Case = tuple[Callable, list[str], str]


def _run_dir(tmp: Path, name: str, metrics: str) -> str:
    """A run folder holding `metrics` as its metrics.jsonl."""
    return str(_write(tmp / name / "metrics.jsonl", metrics).parent)


def _summary_dir(tmp: Path, name: str, summary: dict | str) -> str:
    text = summary if isinstance(summary, str) else json.dumps(summary)
    return str(_write(tmp / name / "summary.json", text).parent)


def _saved_curves(tmp: Path, mean: list) -> str:
    curve = {"label": "a", "agent": "llm1", "split": "train", "metric": "kl", "iterations": [0], "mean": mean,
             "low": [0], "high": [0], "seeds": [1]}  # fmt: skip
    return str(_write(tmp / "c.json", json.dumps({"shared": {}, "curves": [curve], "groups": {}})))


def _saved_points(tmp: Path, reward) -> str:
    point = {"run": "r", "algorithm": "ppo", "kl_coef": 0.1, "seed": 0, "agent": "llm1", "task_reward": reward,
             "kl": 1.0, "x": reward, "y": -1.0}  # fmt: skip
    return str(_write(tmp / "f.json", json.dumps({"points": [point]})))


def _cases(klass: str, tmp: Path) -> dict[str, Case | str]:
    """Each command's input of `klass`: (main, argv, what the one line must say), or why the class does not apply."""
    out, png = tmp / "out", str(tmp / "out" / "f.png")
    if klass == "empty":
        empty = tmp / "empty"
        empty.mkdir()
        return {
            "plot curves": (plot_curves.main, [_run_dir(tmp, "r", ""), "--out", str(out)], "logged no task_reward"),
            "plot frontier": (plot_frontier.main, [_summary_dir(tmp, "s", ""), "--out", png], "none usable"),
            "report claim": (claim_report.main, [str(empty), "--out", str(out)], "no run results under"),
            "report claim2": (claim2_report.main, ["report", str(empty), "--out", str(out)], "no run results under"),
            "report family": (family_report.main, [str(empty), "--out", str(out)], "no finished run results"),
            "report paired": (paired_test.main, [str(_outcomes(tmp / "a", "").parent), str(tmp / "a")],
                              "holds no evaluation"),
            "measure reward-spread": (reward_spread.main, ["--batches", "0", *SMOKE], "--batches: 0 is below 1"),
            "measure kl-optimum": (kl_optimum.main, ["--samples", "1", *SMOKE], "the optimum over one answer"),
            "measure precision-gap": (precision_gap.main, ["--repeat", "0", *SMOKE], "--repeat: 0 is below 1"),
            "measure stop-latency": (stop_latency.main, ["experiment="], "experiment"),
            "sweep": (run_sweep.main, ["--dir", str(out), "--jobs", "", *SMOKE], "--jobs: '' is not an integer"),
            "gpt2-small": (make_gpt2_small.main, ["--tokenizer-dir", str(_tokenizer(tmp / "t", encoder="")), "--out",
                                                  str(out), *GPT2], "is empty"),
        }  # fmt: skip
    if klass == "partial":
        unfinished_row = '{"iteration": 0, "train/ll'  # a kill cut the only line
        no_agents = {"completed": True, "iterations": 2}
        claim = _claim_results(tmp / "c")
        claim2 = _claim2_results(tmp / "c2")
        for metrics in [*claim.rglob("metrics.jsonl"), *claim2.rglob("metrics.jsonl")]:  # no held-out evaluation
            metrics.write_text(_jsonl(_curve_rows()))
        family = _family_results(tmp / "f", passk={"llm1": {"pass@1": 0.5}})  # scored with --ks 1 only
        tokenizer = _tokenizer(tmp / "t", bpe="#version: 0.2\nh\n")  # a merge without its second token
        return {
            "plot curves": (plot_curves.main, [_run_dir(tmp, "r", unfinished_row), "--out", str(out)],
                            "logged no task_reward"),
            "plot frontier": (plot_frontier.main, [_summary_dir(tmp, "s", no_agents), "--out", png],
                              "KeyError: 'agents'"),
            "report claim": (claim_report.main, [str(claim), "--out", str(out)], "holds no held-out evaluation"),
            "report claim2": (claim2_report.main, ["report", str(claim2), "--out", str(out)],
                              "holds no held-out evaluation"),
            "report family": (family_report.main, [str(family), "--out", str(out)], "has no 'pass@4'"),
            "report paired": (paired_test.main, [str(_outcomes(tmp / "a", _outcome_rows(keep=3)).parent),
                                                 str(tmp / "a")], "is not whole (3 of 4 problems)"),
            "measure reward-spread": (reward_spread.main, [*SMOKE, "algorithm=ppo"], "has no pioneer and observer"),
            "measure kl-optimum": (kl_optimum.main, ["experiment=maft_smoke"], "has no agents evaluated"),
            "measure precision-gap": (precision_gap.main, ["experiment=maft_smoke", "model.lora.enabled=false"],
                                      "has no agents evaluated"),
            "measure stop-latency": "its overrides are the run's whole input: nothing of it can be partial",
            "sweep": (run_sweep.main, ["--dir", str(out), *SMOKE, "seed=0,"], "seed=0,"),
            "gpt2-small": (make_gpt2_small.main, ["--tokenizer-dir", str(tokenizer), "--out", str(out), *GPT2],
                           "line 2: 'h' is not a merge"),
        }  # fmt: skip
    if klass == "non-numeric":
        claim = _claim_results(tmp / "c", reward="high")
        claim2 = _claim2_results(tmp / "c2", reward="high")
        family = _family_results(tmp / "f", summary=_summary(reward="0.5"))
        tokenizer = _tokenizer(tmp / "t", encoder=json.dumps({"h": "zero", "<|endoftext|>": 1}))
        return {
            "plot curves": (plot_curves.main, ["--from-json", _saved_curves(tmp, ["x"]), "--out", str(out / "c")],
                            'curve 0: mean is "x", not a number'),
            "plot frontier": (plot_frontier.main, ["--from-json", _saved_points(tmp, "x"), "--out", png],
                              'point 0: task_reward is "x", not a number'),
            "report claim": (claim_report.main, [str(claim), "--out", str(out)],
                             'eval/llm1/task_reward is "high", not a number'),
            "report claim2": (claim2_report.main, ["report", str(claim2), "--out", str(out)],
                              'eval/llm1/task_reward is "high", not a number'),
            "report family": (family_report.main, [str(family), "--out", str(out)],
                              'agents.llm1.task_reward is "0.5", not a number'),
            "report paired": (paired_test.main, [str(_outcomes(tmp / "a", _outcome_rows(vote="yes")).parent),
                                                 str(tmp / "a")], 'problem 0: vote is "yes", not a number'),
            "measure reward-spread": (reward_spread.main, ["--batches", "two", *SMOKE], "--batches: 'two' is not"),
            "measure kl-optimum": (kl_optimum.main, ["--samples", "two", *SMOKE], "--samples: 'two' is not"),
            "measure precision-gap": (precision_gap.main, ["--noise", "x", *SMOKE], "--noise: 'x' is not"),
            "measure stop-latency": (stop_latency.main, [*SMOKE, "batch_size=many"], "batch_size"),
            "sweep": (run_sweep.main, ["--dir", str(out), "--threads", "x", *SMOKE], "--threads: 'x' is not"),
            "gpt2-small": (make_gpt2_small.main, ["--tokenizer-dir", str(tokenizer), "--out", str(out), *GPT2],
                           'has id "zero", not an integer'),
        }  # fmt: skip
    if klass == "nan":
        claim = _claim_results(tmp / "c", kl=NAN)
        claim2 = _claim2_results(tmp / "c2", kl=NAN)
        family = _family_results(tmp / "f", summary=_summary(kl=NAN))
        tokenizer = _tokenizer(tmp / "t", encoder=json.dumps({"h": NAN, "<|endoftext|>": 1}))
        return {
            "plot curves": (plot_curves.main, [_run_dir(tmp, "r", _jsonl(_curve_rows(NAN))), "--out", str(out)],
                            "logged no task_reward"),
            "plot frontier": (plot_frontier.main, [_summary_dir(tmp, "s", _summary(NAN)), "--out", png],
                              "no finite task_reward"),
            "report claim": (claim_report.main, [str(claim), "--out", str(out)], "eval/llm1/kl is NaN"),
            "report claim2": (claim2_report.main, ["report", str(claim2), "--out", str(out)], "eval/llm1/kl is NaN"),
            "report family": (family_report.main, [str(family), "--out", str(out)], "agents.llm1.kl is NaN"),
            "report paired": (paired_test.main, [str(_outcomes(tmp / "a", _outcome_rows(vote=NAN)).parent),
                                                 str(tmp / "a")], "problem 0: vote is NaN"),
            "measure reward-spread": (reward_spread.main, [*SMOKE, "algorithm.agent.learning_rate=nan"],
                                      "learning_rate"),
            "measure kl-optimum": (kl_optimum.main, [*SMOKE, "task.eval_kl_coef=nan"], "eval_kl_coef"),
            "measure precision-gap": (precision_gap.main, ["--noise", "nan", *SMOKE], "--noise: nan is not a finite"),
            "measure stop-latency": (stop_latency.main, [*SMOKE, "algorithm.agent.init_kl_coef=nan"], "init_kl_coef"),
            "sweep": (run_sweep.main, ["--dir", str(out), "--jobs", "nan", *SMOKE], "--jobs: 'nan' is not"),
            "gpt2-small": (make_gpt2_small.main, ["--tokenizer-dir", str(tokenizer), "--out", str(out), *GPT2],
                           "has id NaN, not an integer"),
        }  # fmt: skip
    if klass == "corrupt":
        run = _run_dir(tmp, "r", _jsonl(_curve_rows()))
        _write(Path(run) / ".hydra" / "overrides.yaml", "- [a\n")  # its Hydra record cut mid-list
        outcomes = _write(tmp / "a" / "eval_outcomes.jsonl", "")
        outcomes.write_bytes(b"\xff\xfe\x00garbage")  # not text
        tokenizer = _tokenizer(tmp / "t", encoder='{"h": ')
        return {
            "plot curves": (plot_curves.main, [run, "--out", str(out)], "overrides.yaml is not valid YAML"),
            "plot frontier": (plot_frontier.main, ["--from-json", str(_write(tmp / "f.json", "[1, 2]")), "--out", png],
                              "holds a list, not an object"),
            "report claim": (claim_report.main, [str(_claim_results(tmp / "c", summary="{")), "--out", str(out)],
                             "is not valid JSON"),
            "report claim2": (claim2_report.main, ["report", str(_claim2_results(tmp / "c2", summary="{")), "--out",
                                                   str(out)], "is not valid JSON"),
            "report family": (family_report.main, [str(_family_results(tmp / "f", summary="[]")), "--out", str(out)],
                              "holds a list, not an object"),
            "report paired": (paired_test.main, [str(tmp / "a"), str(tmp / "a")], "is not text"),
            "measure reward-spread": (reward_spread.main, [*SMOKE, "algorithm.agent.no_such_key=1"], "no_such_key"),
            "measure kl-optimum": (kl_optimum.main, [*SMOKE, "task=no_such_task"], "no_such_task"),
            "measure precision-gap": (precision_gap.main, [*SMOKE, "task=no_such_task"], "no_such_task"),
            "measure stop-latency": (stop_latency.main, [*SMOKE, "task=no_such_task"], "no_such_task"),
            "sweep": (run_sweep.main, ["--dir", str(out), *SMOKE, "no_such_key.x=1"], "no_such_key"),
            "gpt2-small": (make_gpt2_small.main, ["--tokenizer-dir", str(tokenizer), "--out", str(out), *GPT2],
                           "is not valid JSON"),
        }  # fmt: skip
    if klass == "unwritable":
        blocked = _blocked(tmp)
        return {
            "plot curves": (plot_curves.main, [_run_dir(tmp, "r", _jsonl(_curve_rows())), "--out", str(blocked / "c")],
                            "a_file is a file, not a folder"),
            "plot frontier": (plot_frontier.main, [_summary_dir(tmp, "s", _summary()), "--out",
                                                   str(blocked / "f.png")], "a_file is a file, not a folder"),
            "report claim": (claim_report.main, [str(_claim_results(tmp / "c")), "--out", str(blocked)],
                             "cannot write"),
            "report claim2": (claim2_report.main, ["report", str(_claim2_results(tmp / "c2")), "--out", str(blocked)],
                              "cannot write"),
            "report family": (family_report.main, [str(_family_results(tmp / "f")), "--out", str(blocked)],
                              "cannot write"),
            "report paired": "it writes nothing: its answer is printed",
            "measure reward-spread": (reward_spread.main, ["--batches", "1", "--out", str(blocked / "s.json"), *SMOKE,
                                                           "algorithm=cory"], "cannot write"),
            "measure kl-optimum": (kl_optimum.main, ["--samples", "2", "--out", str(blocked / "o.json"), *SMOKE],
                                   "cannot write"),
            "measure precision-gap": (precision_gap.main, ["--repeat", "1", "--out", str(blocked / "g.json"),
                                                           *SMOKE], "cannot write"),
            "measure stop-latency": "it writes only into a temporary folder of its own",
            "sweep": (run_sweep.main, ["--dir", str(blocked), *SMOKE], "cannot write"),
            "gpt2-small": (make_gpt2_small.main, ["--tokenizer-dir", str(_tokenizer(tmp / "t")), "--out", str(blocked),
                                                  *GPT2], "cannot write"),
        }  # fmt: skip
    raise AssertionError(klass)


COMMANDS = ("plot curves", "plot frontier", "report claim", "report claim2", "report family", "report paired",
            "measure reward-spread", "measure stop-latency", "measure kl-optimum", "measure precision-gap", "sweep",
            "gpt2-small")  # fmt: skip
# they build the tiny model before refusing
SLOW = {"measure reward-spread", "measure stop-latency", "measure kl-optimum", "measure precision-gap"}


def _case(klass: str, name: str, tmp_path: Path) -> Case:
    cases = _cases(klass, tmp_path)
    assert set(cases) == set(COMMANDS)  # every command is considered for every class
    if isinstance(cases[name], str):
        pytest.skip(f"{name}: {cases[name]}")
    return cases[name]


def _refused(main: Callable, argv: list[str], expect: str, capsys, tmp_path: Path) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (argv, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-2000:]
    assert expect in lines[0], (expect, lines[0])
    assert not (tmp_path / "out").exists()  # nothing written where the output would go


def _params():
    return [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else []) for name in COMMANDS]


@pytest.mark.parametrize("name", _params())
def test_an_empty_input_is_one_line(name, tmp_path, capsys):
    _refused(*_case("empty", name, tmp_path), capsys, tmp_path)


@pytest.mark.parametrize("name", _params())
def test_a_partial_input_is_one_line(name, tmp_path, capsys):
    _refused(*_case("partial", name, tmp_path), capsys, tmp_path)


@pytest.mark.parametrize("name", _params())
def test_text_where_a_number_belongs_is_one_line(name, tmp_path, capsys):
    _refused(*_case("non-numeric", name, tmp_path), capsys, tmp_path)


@pytest.mark.parametrize("name", _params())
def test_nan_where_a_number_belongs_is_one_line(name, tmp_path, capsys):
    _refused(*_case("nan", name, tmp_path), capsys, tmp_path)


@pytest.mark.parametrize("name", _params())
def test_a_corrupt_input_is_one_line(name, tmp_path, capsys):
    _refused(*_case("corrupt", name, tmp_path), capsys, tmp_path)


@pytest.mark.parametrize("name", _params())
def test_an_unwritable_output_is_one_line(name, tmp_path, capsys):
    _refused(*_case("unwritable", name, tmp_path), capsys, tmp_path)


# ------------------------------------------------------------------------------------------------ the boundary
@pytest.mark.parametrize(
    ("main", "argv", "expect"),
    [
        (plot.main, [], "error: cory-plot: give a command (curves, frontier)"),
        (plot.main, ["curve"], "error: cory-plot: no command 'curve'; choose one of curves, frontier"),
        (
            report.main,
            ["claim", "r", "--out", "o", "--outt"],
            "error: cory-report claim: unrecognized arguments: --outt",
        ),
        (report.main, ["family", "results"], "the following arguments are required: --out"),
        (report.main, ["claim2", "report", "results"], "the following arguments are required: --out"),
        (report.main, ["claim2", "results"], "error: cory-report claim2: argument mode: invalid choice: 'results'"),
        (measure.main, ["stop-latency", "--snapshot"], "unrecognized arguments: --snapshot"),
        (report.main, ["paired", "a"], "error: two evaluations are compared, 1 given; usage: cory-report paired"),
    ],
)
def test_a_mistyped_command_line_is_one_line(main, argv, expect, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and expect in err, err


def test_ctrl_c_is_one_line_and_exit_code_130_and_a_bug_keeps_its_traceback(capsys):
    def interrupted(argv, prog=""):
        raise KeyboardInterrupt

    def buggy(argv, prog=""):
        return {}["no such key"]

    assert command.guard(interrupted, []) == 130
    assert capsys.readouterr().err == "error: interrupted (Ctrl-C)\n"
    with pytest.raises(KeyError):  # an unexpected error is not turned into a line: it is a bug to see and fix
        command.guard(buggy, [])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("cory.studies.plot", ["curves", "/no/such/folder"]),
        ("cory.studies.plot", ["frontier", "/no/such/folder"]),
        ("cory.studies.report", ["claim", "/no/such/folder", "--out", "/tmp/x"]),
        ("cory.studies.report", ["claim2", "report", "/no/such/folder", "--out", "/tmp/x"]),
        ("cory.studies.report", ["family", "/no/such/folder", "--out", "/tmp/x"]),
        ("cory.studies.report", ["paired", "/no/such/a", "/no/such/b"]),
        ("cory.studies.measure", ["reward-spread", "--batches", "0"]),
        ("cory.studies.measure", ["stop-latency", "no_such_key=1"]),
        ("cory.studies.measure", ["kl-optimum", "--samples", "1"]),
        ("cory.studies.measure", ["precision-gap", "--noise", "-1"]),
        ("cory.studies.run_sweep", ["--dir", "/tmp/x", "--jobs", "0"]),
        ("cory.studies.make_gpt2_small", ["--tokenizer-dir", "/no/such/folder"]),
    ],
)
def test_each_installed_command_answers_in_one_line_in_its_own_process(module, argv):
    """What a user runs: the module as `cory-<command>` runs it (its imports included), stderr one line, exit 2."""
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "WANDB_MODE": "disabled"})  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr[-2000:]


def test_every_installed_command_is_a_module_of_this_package():
    """pyproject.toml's study commands point at `main` functions of cory.studies modules, and each module runs as
    `python -m` too (the commands the docs print in either form)."""
    import importlib
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    studies = {name: target for name, target in scripts.items() if target.startswith("cory.studies.")}
    assert set(studies) == {"cory-plot", "cory-report", "cory-measure", "cory-sweep", "cory-gpt2-small"}
    for target in studies.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function))
        assert 'if __name__ == "__main__":' in Path(importlib.import_module(module).__file__).read_text()
    for dispatcher in (plot, report, measure):
        for _, (module, _) in dispatcher.COMMANDS.items():
            assert callable(importlib.import_module(module).run)
