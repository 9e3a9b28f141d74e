"""pass@k of the base model and of every agent of a run (paper Fig. 5; docs/method.md §1.6, §3.2, §6).

    python -m cory.evaluate outputs/runs/gsm8k/cory/2026-12-02_16-00-00            # latest checkpoint
    python -m cory.evaluate outputs/runs/gsm8k/cory/.../checkpoints/iter_000100 --n 16 --num-problems 128
    python -m cory.evaluate RUN model.name_or_path=/data/llama-2-7b-chat task.dataset_name=/data/gsm8k
    python -m cory.evaluate experiment=gsm8k_cpu --n 4                           # the base model of a config

For each model — `base` (the initial weights: a fresh policy, whose new LoRA adapter adds exactly zero) and each
agent of the checkpoint (`llm1`; CORY's `llm2`) — and each held-out problem of the run's task, it draws `n`
responses at the training sampling settings (the prompt repeated n times in one `generate` call) and one greedy
response, and reports the unbiased pass@k for every k ≤ n of `--ks` (averaged over problems), the greedy
accuracy and the share of sampled responses with no number. Sampling is seeded per chunk of problems, the same
for every model (common random numbers).

Given Hydra overrides instead of a run (the first argument holds a `=`), it composes that config as
`python -m cory.train` would and evaluates its base model only: how hard a task is before any training.

Writes to `--out` (default `<run>/evaluation/<checkpoint>`, or `outputs/evaluation/<overrides>`):
`results.jsonl` (one row per model and problem, appended as chunks finish: a killed evaluation continues where
it stopped), `passk.json` (the summary) and `passk.png` (pass@k against k, one line per model). With
`logger=wandb` in the run's config both are also logged to W&B. Trailing `key=value` arguments override the run's
resolved config (a local model or dataset path, the device); the run's own config is not changed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cory import figures, runtime
from cory.checkpoints import ALGORITHM_DIR
from cory.config import validate
from cory.errors import ConfigError, entry_point, writing
from cory.tasks.answers import extract_answer, pass_at_k

RESULTS, SUMMARY, PLOT, SETTINGS = "results.jsonl", "passk.json", "passk.png", "settings.json"


def resolve_target(path: Path) -> tuple[Path, Path | None]:
    """(run folder, checkpoint folder or None) for a run folder or one of its checkpoint folders."""
    from cory.checkpoints import latest_checkpoint
    from cory.runs import RUN_CONFIG

    path = Path(path)
    if (path / "trainer.json").exists():  # checkpoints/iter_<k> of a run
        return path.parents[1], path
    if (path / RUN_CONFIG).exists():
        return path, latest_checkpoint(path)
    raise ConfigError(f"{path}: neither a cory run folder ({RUN_CONFIG}) nor one of its checkpoints (trainer.json)")


def load_config(run_dir: Path | None, overrides: list[str]) -> DictConfig:
    """The run's resolved config with `key=value` overrides (an unknown key is an error, not a silent no-op), or,
    without a run, the config `python -m cory.train <overrides>` would run."""
    if run_dir is None:
        from hydra import compose, initialize_config_dir
        from hydra.errors import HydraException

        conf = str(Path(__file__).resolve().parent / "conf")
        try:
            with initialize_config_dir(version_base="1.3", config_dir=conf):
                return compose("train", overrides=overrides)
        except (HydraException, OmegaConfBaseException) as err:
            from cory.cli import explain  # one line with the hint `cory-train` gives ("did you mean ...?")

            raise ConfigError(explain(err, overrides)) from None
    from cory.runs import check_layout, load_run_config, plain_config, typed

    trusted = typed(overrides)
    check_layout(run_dir, str(run_dir), writes=False)  # no link out of it is followed, nothing odd is read
    cfg = load_run_config(run_dir, trusted)  # a run folder never names code to run
    OmegaConf.set_struct(cfg, True)
    try:
        merged = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    except OmegaConfBaseException as err:
        raise ConfigError(f"override {' '.join(overrides)}: {' '.join(str(err).split())}") from None
    source = str(run_dir / "run_config.yaml") + (f" with {' '.join(overrides)}" if overrides else "")
    return plain_config(merged, source, trusted)


def checkpoint_agents(checkpoint: Path) -> list[str]:
    """The policy agents of a checkpoint whose weights a `Backbone` handle can load: the folders its algorithm
    recorded as policies (`cory.checkpoints.policy_folders`; a centralised critic's is not one). A checkpoint that
    recorded none (MAFT's, whose agents are adapters of its own) has no policy agents to evaluate here."""
    from cory.checkpoints import policy_folders

    return sorted(policy_folders(checkpoint) or [])


class _Policy:
    """The one model in memory: a policy handle whose weights are replaced by each agent's in turn."""

    def __init__(self, backbone, seed: int, precision: str) -> None:
        self.handle = backbone.policy("evaluated", init_seed=seed)
        self.tokenizer, self.add_special_tokens = backbone.tokenizer, backbone.add_special_tokens
        self.device, self.dtype = backbone.device, runtime.autocast_dtype(precision)

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else contextlib.nullcontext()


def sample_chunk(policy: _Policy, task, questions: list[str], n: int, batch_size: int) -> list[dict]:
    """n sampled responses and one greedy response per question, scored; one row per question."""
    from cory.ppo.rollout import generate

    def responses(prompts: list[str], generation_kwargs: dict) -> list[str]:
        with torch.no_grad(), policy.autocast():
            _, ids = generate(
                policy.handle,
                policy.tokenizer,
                prompts,
                task.max_new_tokens[1],
                generation_kwargs,
                policy.device,
                batch_size,
                policy.add_special_tokens,
            )
        return policy.tokenizer.batch_decode(ids, skip_special_tokens=True)

    prompts = [task.pioneer_prompt(q) for q in questions]
    sampled = responses([p for p in prompts for _ in range(n)], task.generation_kwargs)
    greedy = responses(prompts, task.generation_kwargs | {"do_sample": False, "top_k": None})  # top_k unused
    rows = []
    for i, q in enumerate(questions):
        answers = sampled[i * n : (i + 1) * n]
        rows.append(
            {
                "question": q,
                "n": n,
                "correct": int(sum(task.score([q] * n, answers))),
                "no_answer": sum(extract_answer(a, stop_at_question=task.stop_at_question) is None for a in answers),
                "greedy_correct": bool(task.score([q], [greedy[i]])[0]),
                "greedy_response": greedy[i],
                "sample_response": answers[0],
            }
        )
    return rows


def summarize(rows: list[dict], ks: list[int]) -> dict[str, float]:
    """Mean unbiased pass@k over problems for each k ≤ n, greedy accuracy and the no-number rate."""
    n = rows[0]["n"]
    out = {f"pass@{k}": float(np.mean([pass_at_k(n, r["correct"], k) for r in rows])) for k in ks if k <= n}
    out["greedy_accuracy"] = float(np.mean([r["greedy_correct"] for r in rows]))
    out["no_answer_rate"] = float(np.mean([r["no_answer"] / n for r in rows]))
    out["n"], out["num_problems"] = n, len(rows)
    return out


def plot_passk(summary: dict[str, dict], path: Path, title: str) -> None:
    """pass@k against k (log₂ axis), one line per model (paper Fig. 5); legend, ticks and title per `cory.figures`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for model, stats in summary.items():
        ks = sorted(int(key.split("@")[1]) for key in stats if key.startswith("pass@"))
        ax.plot(ks, [stats[f"pass@{k}"] for k in ks], marker="o", label=model)
    ax.set_xscale("log", base=2)
    ticks = sorted({int(key.split("@")[1]) for stats in summary.values() for key in stats if key.startswith("pass@")})
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.set(xlabel="k (samples per problem)", ylabel="pass@k (fraction of problems)", ylim=(0, 1))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    figures.outside_legend(ax, fontsize=9)
    figures.save(fig, path, dpi=120)


def passk_title(info: figures.RunInfo, n: int, num_problems: int, checkpoint: Path | None) -> str:
    """What was evaluated: the run (`cory.figures.title`), its checkpoint, n and the number of problems."""
    where = f"checkpoint {checkpoint.name}" if checkpoint is not None else ""
    return figures.title(
        [info], heading="pass@k", note=" · ".join(p for p in (where, f"n={n}, {num_problems} problems") if p)
    )


def read_results(path: Path) -> list[dict]:
    """The complete rows of `results.jsonl`, one per (model, problem): a line cut by a kill or a full disk is dropped
    and a repeated row is kept once (the first), and the file is rewritten that way before anything is appended."""
    if not path.exists():
        return []
    rows, good, seen = [], [], set()
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if text and not text.endswith("\n"):
        lines = lines[:-1]  # a torn tail: even if it parses, it was not written whole
    for line in lines:
        try:
            row = json.loads(line)
            key = (row["model"], row["index"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        if key not in seen:
            seen.add(key)
            rows.append(row)
            good.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(good), encoding="utf-8")
    os.replace(tmp, path)
    return rows


def evaluate_run(
    target: Path | None,
    overrides: list[str],
    n: int,
    ks: list[int],
    num_problems: int | None,
    batch_size: int | None,
    seed: int,
    out: Path | None,
) -> dict[str, dict]:
    """Evaluate the base model and every agent of `target`'s checkpoint (the base model of the config composed from
    `overrides` when `target` is None); returns {model: summary}."""

    run_dir, checkpoint = resolve_target(target) if target is not None else (None, None)
    cfg = load_config(run_dir, overrides)
    validate(cfg)  # an override can make it invalid (4-bit on a CPU): one line, before any model loads
    weights = None
    if checkpoint is not None:  # checked whole as a resume checks it: a cut or edited weight file is one line
        from cory.checkpoints import read_state, verify_checksums

        state = read_state(checkpoint)
        verify_checksums(checkpoint, state)
        weights = hashlib.sha256(json.dumps(state["files"], sort_keys=True).encode()).hexdigest()
    if out is None and run_dir is not None:
        out = run_dir / "evaluation" / (checkpoint.name if checkpoint else "base")
    elif out is None:
        out = Path("outputs") / "evaluation" / ("_".join(overrides) or "default")
    out = Path(out)
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
    agents = checkpoint_agents(checkpoint) if checkpoint else []
    settings = result_settings(cfg, checkpoint, weights, n, seed, num_problems, batch_size)
    if (out / SETTINGS).exists():
        other = _differences(_read_settings(out / SETTINGS), settings)
        if other:
            raise ConfigError(
                f"{out} holds results of other settings ({other}; {out / SETTINGS}): they are never reused for "
                f"these; pass another --out"
            )
    with writing(out / SETTINGS):
        (out / SETTINGS).write_text(json.dumps(settings))
    with _owned(out), writing(out):  # one evaluation per output folder at a time, as one run per run folder
        return _evaluate_into(cfg, run_dir, checkpoint, agents, out, n, ks, num_problems, batch_size, seed)


# What an evaluation's rows depend on besides the flags: the config's seed, model, task (its sampling settings and
# data) and hardware (device and precision change the numbers); the logger, cadence and paths do not
RESULT_KEYS = ("seed", "model", "task", "hardware")


def result_settings(cfg, checkpoint, weights, n: int, seed: int, num_problems, batch_size) -> dict:
    """Every setting that changes an evaluation's rows, as `settings.json` records them: the rows in a folder are
    reused only by an evaluation of the very same settings. The batch size counts: it sets how problems are
    chunked, and each chunk's sampling seed."""
    config = {
        k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        for k, v in ((k, cfg.get(k)) for k in RESULT_KEYS)
    }
    return {
        "n": n,
        "seed": seed,
        "num_problems": num_problems,
        "batch_size": batch_size or cfg.eval_batch_size,
        "checkpoint": str(checkpoint),
        "weights": weights,  # the SHA-256 of the checkpoint's file checksums: the same folder name, other weights
        "config": config,
    }


def _read_settings(path: Path) -> dict:
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _differences(recorded: dict, settings: dict) -> str:
    """The settings that differ, as `key: <recorded> there, <now> now` (the first three), or "" when none does."""
    from cory.runs import flatten

    before, now = flatten(recorded), flatten(settings)
    keys = sorted(k for k in before.keys() | now.keys() if before.get(k, "(absent)") != now.get(k, "(absent)"))
    shown = [f"{k}: {before.get(k, '(absent)')} there, {now.get(k, '(absent)')} now" for k in keys[:3]]
    return "; ".join(shown) + ("; ..." if len(keys) > 3 else "")


@contextlib.contextmanager
def _owned(out: Path):
    from cory.runs import RunLock

    lock = RunLock(out)
    try:
        lock.acquire()
    except ConfigError:
        raise ConfigError(
            f"{out} is being written by another evaluation; wait for it, or pass another --out"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _evaluate_into(cfg, run_dir, checkpoint, agents, out: Path, n: int, ks, num_problems, batch_size, seed) -> dict:
    """The pass@k evaluation proper, into `out` (owned by this process)."""
    from hydra.utils import get_object, instantiate
    from tqdm.auto import tqdm

    from cory.build import build_backbone
    from cory.tasks.base import provides_problems

    if not provides_problems(get_object(cfg.task._target_)):  # said before any model loads
        raise ConfigError(f"task {cfg.task._target_}: pass@k needs a task with numeric answers (gsm8k, arithmetic)")
    if not agents:
        where = f"{run_dir} has no checkpoint of policy agents" if run_dir is not None else "no run was given"
        runtime.say(f"[cory.evaluate] {where}: evaluating the base model only")
    backbone = build_backbone(cfg.model, runtime.resolve_device(cfg.hardware.device))
    task = instantiate(cfg.task, tokenizer=backbone.tokenizer, _convert_="all")
    questions = [p.question for p in task.eval_problems()[:num_problems]]
    policy = _Policy(backbone, cfg.seed, cfg.hardware.precision)
    batch_size = batch_size or cfg.eval_batch_size
    per_chunk = max(1, batch_size // n)
    done = {(r["model"], r["index"]) for r in read_results(out / RESULTS)}
    with (out / RESULTS).open("a", encoding="utf-8") as results:
        for model in ["base", *agents]:
            if all((model, i) in done for i in range(len(questions))):
                continue
            if model != "base":
                policy.handle.load_weights(checkpoint / ALGORITHM_DIR / model)
            starts = range(0, len(questions), per_chunk)
            for start in tqdm(starts, desc=f"pass@k {model}", unit="chunk", dynamic_ncols=True, leave=False):
                index = range(start, min(start + per_chunk, len(questions)))
                if all((model, i) in done for i in index):
                    continue
                torch.manual_seed(int(np.random.SeedSequence([seed, start]).generate_state(1)[0]))
                rows = sample_chunk(policy, task, [questions[i] for i in index], n, batch_size)
                lines = [json.dumps({"model": model, "index": i} | row) for i, row in zip(index, rows)]
                results.write("\n".join(lines) + "\n")  # one write per chunk: a kill loses at most this chunk
                results.flush()
            runtime.say(f"[cory.evaluate] {model}: {len(questions)} problems done")

    rows = read_results(out / RESULTS)
    summary = {
        model: summarize(sorted((r for r in rows if r["model"] == model), key=lambda r: r["index"]), ks)
        for model in ["base", *agents]
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))
    runtime.say(f"[cory.evaluate] results in {out / SUMMARY} and {out / PLOT}")
    config = OmegaConf.to_container(cfg, resolve=False) if run_dir is not None else {"task": {"name": task.name}}
    plot_passk(summary, out / PLOT, passk_title(figures.run_info(config), n, len(questions), checkpoint))
    if str(cfg.logger.get("_target_", "")).endswith("WandbLogger"):
        _log_to_wandb(cfg, run_dir or out, out, summary, checkpoint)
    return summary


def _log_to_wandb(
    cfg: DictConfig, run_dir: Path, out: Path, summary: dict[str, dict], checkpoint: Path | None
) -> None:
    """pass@k scalars, the per-model table and the PNG, in a W&B run of its own (the run's project and group),
    linked to the checkpoint's training run: its W&B id and name in the config (`train_run`) and a tag."""
    from cory.build import wandb_run_name
    from cory.callbacks import run_identity, wandb_group, wandb_tags
    from cory.checkpoints import read_state
    from cory.loggers import WandbLogger

    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.logger, resolve=True).items() if not k.startswith("_")}
    choices, overrides = run_identity(run_dir)  # the evaluated run's group and tags, so it sits beside it in W&B
    state = read_state(checkpoint) if checkpoint is not None else {}
    trained = {  # the W&B run that wrote the checkpoint (none: the base model of a config)
        "id": state.get("wandb_run_id"),
        "name": wandb_run_name(state["run_info"]) if state else None,
        "checkpoint": checkpoint.name if checkpoint is not None else None,
    }
    kwargs["group"] = kwargs.get("group") or wandb_group(cfg, choices)
    link = [f"train_run={trained['id']}"] if trained["id"] else []
    kwargs["tags"] = wandb_tags(choices, overrides, ["passk", *link])
    config = {"run": str(run_dir), "choices": choices, "overrides": overrides, "train_run": trained, **summary}
    logger = WandbLogger(run_dir=out, config=config, name=f"passk-{run_dir.name}", job_type="evaluate", **kwargs)
    logger.log({f"passk/{m}/{k}": v for m, stats in summary.items() for k, v in stats.items()}, step=0)
    logger.log_table("passk/summary", [{"model": m, **stats} for m, stats in summary.items()], step=0)
    logger.log_image("passk/plot", out / PLOT, step=0)
    logger.close()


# Ctrl-C at any moment: one line, exit code 130; a refused input or a failed write of --out: one line, exit code 2
@entry_point(write_advice="pass another --out", unnamed="the output folder")
def main(argv: list[str] | None = None) -> None:
    from cory.cli import prog_name

    prog = prog_name("cory-evaluate", "python -m cory.evaluate")
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a run folder (its latest checkpoint), a checkpoint folder, or an override")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the run's resolved config")
    parser.add_argument("--n", type=int, default=16, help="samples per problem (default 16)")
    parser.add_argument(
        "--ks", type=int, nargs="+", default=None, help="k values, each <= n (default: 1, 2, 4, 8, 16 up to n)"
    )
    parser.add_argument("--num-problems", type=int, default=None, help="first N held-out problems (default all)")
    parser.add_argument("--batch-size", type=int, default=None, help="prompts per generate (default eval_batch_size)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default <run>/evaluation/<ckpt>)")
    parser.add_argument("--cfg", choices=["job"], help="print the config it would evaluate with, run nothing")
    args = parser.parse_args(argv)
    if args.ks is None:
        args.ks = [k for k in (1, 2, 4, 8, 16) if k <= args.n] or [args.n]
    if args.n < 1 or min(args.ks) < 1:
        raise ConfigError(f"--n={args.n} and --ks={args.ks}: need n >= 1 and every k >= 1")
    above = [k for k in args.ks if k > args.n]
    if above:  # pass@k needs k of the n samples: such a k would silently be left out
        raise ConfigError(f"--ks {' '.join(map(str, above))}: above --n={args.n}; pass@k needs k <= n")
    if args.num_problems is not None and args.num_problems < 1:
        raise ConfigError(f"--num-problems={args.num_problems}: must be >= 1 (leave it out for all problems)")
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"--batch-size={args.batch_size}: must be >= 1")
    target, overrides = Path(args.target), args.overrides
    # no run: the base model of the config these overrides compose (a sweep job's folder, `algorithm=cory/seed=0`,
    # holds `=` too: an existing folder is a run)
    if "=" in args.target and not target.is_dir():
        target, overrides = None, [args.target, *args.overrides]
    if args.cfg:
        run_dir = resolve_target(target)[0] if target is not None else None
        print(OmegaConf.to_yaml(load_config(run_dir, overrides)))
        return
    summary = evaluate_run(target, overrides, args.n, args.ks, args.num_problems, args.batch_size, args.seed, args.out)
    print(summary_table(summary, args.ks))


def summary_table(summary: dict[str, dict], ks: list[int]) -> str:
    """pass@k per model (rows: k), then greedy accuracy and the no-answer rate: what `passk.json` holds."""
    models = list(summary)
    width = max(12, *(len(m) + 2 for m in models))
    lines = ["".ljust(16) + "".join(m.rjust(width) for m in models)]
    for key in [f"pass@{k}" for k in ks] + ["greedy_accuracy", "no_answer_rate"]:
        values = [summary[m].get(key) for m in models]
        lines.append(key.ljust(16) + "".join(("—" if v is None else f"{v:.3f}").rjust(width) for v in values))
    problems = {summary[m]["num_problems"] for m in models}
    lines.append(f"({', '.join(map(str, sorted(problems)))} problems, n = {summary[models[0]]['n']} samples each)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
