"""The GSM8K task and its CPU stand-in (`cory/tasks/gsm8k.py`, `cory/tasks/arithmetic.py`) and the GSM8K runs.

Covers: prompts are the one-shot "Question: … Answer:" form with the observer's "Reference:" line; the 0/1 reward
on the last number never raises on malformed text; test problems are disjoint from training, shuffled once, and
the trainer's periodic evaluations use a prefix of the full evaluation set; data from a local GSM8K copy and from
the offline gsm_symbolic source; arithmetic problems are distinct and exact; PPO and CORY with LoRA run end to end
on arithmetic (run folder, adapter-only checkpoints, the task's `no_answer_rate`); the README's GSM8K commands
compose, and the CPU experiment runs for one iteration (`slow`).
Run: `pytest tests/test_gsm8k.py` (about a minute on 2 CPUs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.compose import compose_cfg
from helpers.runners import check_run_folder, read_rows, run_main_output
from hydra.utils import instantiate

import cory.algorithms.agents
from cory.config import validate
from cory.evaluate import evaluate_run
from cory.tasks.answers import extract_answer
from cory.tasks.base import SafeScorer
from cory.tasks.problems import Problem
from cory.train import train

SHOT = "Question: Shawn has five toys."
REPO = Path(__file__).resolve().parents[1]


def gsm8k_folder(tmp_path, n_train: int = 6, n_test: int = 5):
    """A local GSM8K copy: train/test JSONL with GSM8K's answer format (one test question also in train)."""
    rows = [
        {"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i} + 2\n#### {i + 2}"}
        for i in range(20)
    ]
    folder = tmp_path / "gsm8k"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:n_train]))
    test = rows[n_train : n_train + n_test] + rows[:1]
    (folder / "test.jsonl").write_text("\n".join(json.dumps(r) for r in test))
    return folder


def gsm8k_task(tmp_path, *overrides: str):
    cfg = compose_cfg(["task=gsm8k", f"task.dataset_name={gsm8k_folder(tmp_path)}", *overrides])
    return instantiate(cfg.task, tokenizer=None, _convert_="all")


# ------------------------------------------------------------------------------------------------ prompts
def test_pioneer_and_observer_prompts(tmp_path):
    task = gsm8k_task(tmp_path)
    q = task.eval_queries()[0]
    pioneer = task.pioneer_prompt(q)
    assert pioneer.startswith(SHOT) and pioneer.endswith(f"\nQuestion: {q}\nAnswer:")
    assert pioneer.count("Question:") == 2 and pioneer.count("Answer:") == 2  # one shot, then the question
    observer = task.observer_prompt(q, "  He has 7 apples.</s> \n")
    assert observer == pioneer.removesuffix("Answer:") + "Reference: He has 7 apples.</s>\nAnswer:"


# ------------------------------------------------------------------------------------------------ reward
@pytest.mark.parametrize(
    ("response", "reward"),
    [
        (" Tom starts with 7 and buys 2: 7 + 2 = 9.", 1.0),
        (" 7 + 2 = 9 apples, so $9.00 worth", 1.0),  # decimals and currency: numeric comparison
        (" He has 9.\nQuestion: Ann has 4 pens and buys 3", 0.0),  # run-on: judged on its last number
        (" 9 apples. Earlier he had 7", 0.0),  # several numbers: the last one counts
        ("", 0.0),
        (" I do not know", 0.0),
        ("\x00\ufffd 9 9 9 9999999999999999999999999", 0.0),
    ],
)
def test_reward_is_one_for_the_right_last_number(tmp_path, response, reward):
    task = gsm8k_task(tmp_path)
    q = next(p.question for p in task.eval_problems() if p.answer == "9")
    scores, failed = SafeScorer(task)([q], [response])
    assert scores == [reward] and failed == 0  # never raises: the failure reward is never needed


def test_run_on_answer_can_be_judged_before_the_next_question(tmp_path):
    task = gsm8k_task(tmp_path, "task.stop_at_question=true")
    q = next(p.question for p in task.eval_problems() if p.answer == "9")
    assert task.score([q], [" He has 9.\nQuestion: Ann has 4 pens and buys 3"]) == [1.0]


# ------------------------------------------------------------------------------------------------ data
def test_test_problems_are_disjoint_shuffled_and_capped(tmp_path):
    task = gsm8k_task(tmp_path)
    train_q, eval_q = set(task.train_queries()), task.eval_queries()
    assert len(train_q) == 6 and len(eval_q) == 5 and not train_q & set(eval_q)  # the leaked question is dropped
    assert all(isinstance(p, Problem) and p.answer for p in task.train_problems() + task.eval_problems())
    in_file = [json.loads(line)["question"] for line in (tmp_path / "gsm8k" / "test.jsonl").read_text().splitlines()]
    assert eval_q != [q for q in in_file if q in eval_q]  # the file order is not kept ...
    assert gsm8k_task(tmp_path / "again").eval_queries() == eval_q  # ... but the shuffle is fixed by the seed
    capped = gsm8k_task(tmp_path / "capped", "task.num_eval=3", "task.num_train=4")
    assert len(capped.eval_queries()) == 3 and len(capped.train_queries()) == 4


def test_offline_source_generates_disjoint_problems():
    cfg = compose_cfg(["task=gsm8k", "task.source=gsm_symbolic", "task.symbolic_sizes=[12,6]"])
    task = instantiate(cfg.task, tokenizer=None, _convert_="all")
    train_p, eval_p = task.train_problems(), task.eval_problems()
    assert len(train_p) == 12 and len(eval_p) == 6
    assert not {p.question for p in train_p} & {p.question for p in eval_p}
    assert all(extract_answer(p.answer) == p.answer for p in train_p + eval_p)
    assert "Reference:" in task.observer_prompt(eval_p[0].question, "x")


def test_arithmetic_problems_are_distinct_and_exact():
    cfg = compose_cfg(["task=arithmetic", "task.num_eval=50"])
    task = instantiate(cfg.task, tokenizer=None, _convert_="all")
    train_p, eval_p = task.train_problems(), task.eval_problems()
    assert len(eval_p) == 50 and 100 < len(train_p) <= 150  # one-digit a±b has 200 distinct questions
    assert len({p.question for p in train_p}) == len(train_p)
    assert not {p.question for p in train_p} & {p.question for p in eval_p}
    for p in train_p + eval_p:
        expression = p.question.removeprefix("What is the result of ").removesuffix("?")
        assert int(p.answer) == eval(expression)  # noqa: S307 - our own digits and operators
        assert task.score([p.question], [f" {p.answer}\n"]) == [1.0]


# ------------------------------------------------------------------------------------------------ runs
@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_lora_run_on_arithmetic_end_to_end(tmp_path, monkeypatch, algorithm):
    """Periodic evaluations use a prefix of the first and final ones' held-out problems (num_eval ≤ num_eval_final)."""
    evaluated, real = [], cory.algorithms.agents.evaluate

    def spy(agent, task, queries, lengths, batch_size, seed):
        evaluated.append(list(queries))
        return real(agent, task, queries, lengths, batch_size, seed)

    monkeypatch.setattr(cory.algorithms.agents, "evaluate", spy)
    cfg = compose_cfg(["experiment=gsm8k_smoke", f"algorithm={algorithm}", "progress=false"])
    train(cfg, tmp_path / "run")
    check_run_folder(tmp_path / "run", algorithm, cfg.iterations)
    agents = 2 if algorithm == "cory" else 1
    sizes = [len(q) for q in evaluated[::agents]]
    assert sizes == [cfg.num_eval_final, cfg.num_eval, cfg.num_eval_final]  # iterations 0, 2, 4
    assert evaluated[agents] == evaluated[0][: cfg.num_eval]
    eval_rows = [r for r in read_rows(tmp_path / "run") if "eval/llm1/no_answer_rate" in r]
    assert len(eval_rows) == 3 and all(0 <= r["eval/llm1/no_answer_rate"] <= 1 for r in eval_rows)
    checkpoint = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    assert (checkpoint / "algorithm" / "llm1" / "adapter_model.safetensors").exists()
    assert not list(checkpoint.rglob("policy.safetensors"))  # the base is never written


@pytest.mark.parametrize(
    "command",
    [
        "experiment=gsm8k_llama2 algorithm=ppo hardware=gpu",
        "experiment=gsm8k_llama2 algorithm=cory hardware=gpu",
        "experiment=gsm8k_llama2_13b_lr1e-4 algorithm=cory",
        "experiment=gsm8k_llama2 algorithm=cory task.source=gsm_symbolic",
    ],
)
def test_the_paper_commands_compose(command):
    """The README's GPU commands: composed and validated here up to the CUDA check (no GPU on CI)."""
    cfg = compose_cfg(command.split())
    assert cfg.model.load_in_4bit and cfg.model.lora.enabled and cfg.model.lora.share_base
    assert cfg.task._target_ == "cory.tasks.gsm8k.gsm8k_task"
    try:
        validate(cfg)
    except Exception as err:  # noqa: BLE001 - only the missing GPU may stop it here
        assert "CUDA is not available" in str(err) or "needs CUDA" in str(err), err


def _readme_commands(prefix: str) -> list[str]:
    """Every command of the README and the docs pages, backticked or a line of a code block (its comment cut), that
    starts with `prefix` and mentions GSM8K's experiments."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    spans = re.findall(r"`([^`\n]+)`", text)
    lines = [line.split(" #")[0].strip() for line in text.splitlines()]
    found = [c for c in [*spans, *lines] if c.startswith(prefix) and "gsm8k" in c]
    return list(dict.fromkeys(found))


@pytest.mark.parametrize("command", _readme_commands("python -m cory.train -m "))
def test_the_readme_gsm8k_sweeps_compose(command):
    """Each run of each GSM8K sweep the README and the docs pages print (its sweep file's jobs, expanded by
    `helpers.compose._jobs` as in tests/test_commands.py) composes and validates up to the missing GPU."""
    from helpers.compose import _jobs

    jobs, seeds = _jobs(command.removeprefix("python -m cory.train -m ").split())
    assert len(jobs) * seeds >= 6
    for run in jobs:
        try:
            validate(compose_cfg(list(run)))
        except Exception as err:  # noqa: BLE001 - only the missing GPU may stop it here
            assert "CUDA is not available" in str(err) or "needs CUDA" in str(err), (run, err)


@pytest.mark.parametrize("command", _readme_commands("python scripts/benchmark.py "))
def test_the_readme_memory_benchmarks_compose(command):
    """The benchmark runs `cory.train` with these overrides (plus its own cadence keys) for PPO and CORY."""
    overrides = [a for a in command.split()[2:] if "=" in a]
    for algorithm in ("ppo", "cory"):
        validate(compose_cfg([*overrides, f"algorithm={algorithm}", "eval_every=0", "save_every=0", "num_eval=2"]))


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_the_cpu_experiment_runs(tmp_path, tmp_path_factory, algorithm):
    """`python -m cory.train experiment=gsm8k_cpu algorithm=...`, cut to one small iteration and two held-out problems
    (the full run takes minutes per iteration on this CPU)."""
    cache = tmp_path_factory.getbasetemp() / "smollm2-cache"  # one SmolLM2 conversion for both algorithms
    small = [
        "batch_size=4",
        "algorithm.agent.mini_batch_size=2",
        "algorithm.agent.ppo_epochs=1",
        "task.max_new_tokens=[2,2]",
    ]
    overrides = ["iterations=1", "num_eval=2", "num_eval_final=2", *small, "progress=false", f"cache_dir={cache}"]
    cfg = compose_cfg(["experiment=gsm8k_cpu", f"algorithm={algorithm}", *overrides])
    summary = train(cfg, tmp_path / "run")
    assert summary["completed"] and summary["task"] == "arithmetic"
    # then `python -m cory.evaluate <run folder>` on two problems, two samples each
    passk = evaluate_run(tmp_path / "run", [], n=2, ks=[1, 2], num_problems=2, batch_size=4, seed=0, out=None)
    assert list(passk) == ["base", *summary["agents"]]
    assert (tmp_path / "run" / "evaluation" / "iter_000001" / "passk.png").exists()


def test_one_local_file_is_split_into_disjoint_train_and_test_problems(tmp_path):
    from cory.tasks.problems import gsm8k_problems

    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(20)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    train, test = gsm8k_problems("train", str(path)), gsm8k_problems("test", str(path))
    assert len(test) == 4 and len(train) == 16  # a fixed fifth held out
    assert not {p.question for p in train} & {p.question for p in test}
    assert gsm8k_problems("test", str(path)) == test  # the same split every time


@pytest.mark.parametrize("content", ["", "{not json", '{"question": "a", "answer": "#### 1"}'])
def test_an_empty_broken_or_one_row_file_names_the_file(tmp_path, content):
    from cory.tasks.problems import gsm8k_problems

    path = tmp_path / "gsm8k.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"^task\.dataset_name={re.escape(str(path))}: ") as err:
        gsm8k_problems("train", str(path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("gsm8k.jsonl", "", "the file is empty (0 bytes)"),  # was `unreadable (StopIteration: )`
        ("gsm8k.jsonl", "{not json\n", "unreadable (ArrowInvalid: JSON parse error"),  # was datasets' generic error
        ("gsm8k", None, "unreadable (EmptyDatasetError: The directory at"),  # an empty folder: was Hydra's traceback
    ],
)
def test_a_bad_gsm8k_file_or_folder_is_one_line_naming_it_and_leaves_no_run_folder(
    tmp_path, monkeypatch, capsys, name, content, reason
):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    run_dir = tmp_path / "run"
    argv = ["experiment=smoke", "task=gsm8k", "model=tiny_llama", f"task.dataset_name={path}", "progress=false"]
    code, _, err = run_main_output(monkeypatch, capsys, *argv, f"hydra.run.dir={run_dir}")
    assert code == 2 and "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()  # nothing else on stderr: no parser log, no progress bar
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"task.dataset_name={path}: {reason}" in lines[0]
    assert not run_dir.exists()
