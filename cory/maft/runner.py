"""`run(cfg, run_dir)`: a Multiagent Finetuning run from a composed config (`algorithm=maft`), resumable in place.

It shares everything but the algorithm with PPO and CORY: the `model` group (any builder returning (model,
tokenizer)), a `task` that provides problems through `train_problems()` / `eval_problems()` (e.g. `task=arithmetic`
or `task=gsm8k`), the `hardware` group (device, precision, generation batch), the `logger` group (metrics.jsonl and an
optional W&B mirror), `seed`, `num_eval` (held-out problems; null: all the task provides) and the run folder.
`algorithm.runner` names this function, so the entry point dispatches by config.

  1. the resolved config is written to the run folder; a restart on the same folder must bring the same config;
  2. `MAFT` is built from the `algorithm` block (its values are checked before any model loads), then the model,
     the agents' weights and the task;
  3. for k = 0..K: round k (k ≥ 1: debate, vote, per-agent SFT) and the held-out debate; one metrics row each;
  4. summary.json (the free baselines from round 0, then every round's accuracy ± s.e.) and curves.png.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from cory import runtime
from cory.config import RUNNER_KEYS
from cory.errors import ConfigError
from cory.maft.store import RunStore, write_json_atomic

RUN_CONFIG = "run_config.yaml"
# Keys that may differ between the first start and a restart: they do not change what is computed.
_NOT_IDENTITY = ("resume", "progress", "cache_dir", "hardware", "logger", "hydra")


def run(cfg: DictConfig, run_dir: Path, record_start: Callable[[int], None] | None = None) -> dict:
    """Run (or continue) Multiagent Finetuning in `run_dir`; returns the summary that is also written there.

    `record_start(round)` is called once the run is built and its finished rounds are known (`cory.train` records
    the start in the run folder with it)."""
    start_time = time.perf_counter()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # 1. the config: every target and key checked, then compared with the folder's first start
    _validate(cfg)
    _check_same_run(cfg, run_dir)
    # 2. MAFT (its values checked), then the model and the agents' weights, then the task's problems
    store = RunStore(run_dir)
    maft, train_problems, eval_problems = _build(cfg, store)
    # 3. round 0 (the base agents), then each fine-tuning round, each followed by the held-out debate
    maft.restore()
    first = store.finished_rounds()
    if record_start is not None:
        record_start(first)
    if first:
        print(f"[maft] continuing {run_dir} at round {first}", flush=True)
    logger = _make_logger(cfg, run_dir, store, resume_from=first)
    try:
        for k in range(first, maft.finetune_rounds + 1):
            row = maft.finetune_round(k, train_problems) if k > 0 else {}
            metrics, samples = maft.evaluate(k, eval_problems)
            row |= metrics
            logger.log(row, step=k)
            logger.log_table("maft/debates", samples, step=k)
            store.save_row(k, row)  # the marker that round k is finished
            _print_round(k, row)
    finally:
        logger.close()

    # 4. the summary and the curves
    summary = _summary(cfg, store, maft, len(train_problems), len(eval_problems), time.perf_counter() - start_time)
    write_json_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    from cory.maft.plots import plot_maft_curves

    plot_maft_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
    print(f"[maft] run folder: {run_dir}", flush=True)
    return summary


def _build(cfg: DictConfig, store: RunStore):
    """The MAFT object with its agents on the configured device, and the training and held-out problems."""
    seed = runtime.seed_everything(cfg.seed, cfg.hardware.get("deterministic", False))
    device = runtime.resolve_device(cfg.hardware.device)
    built: dict = {}

    def make_agents(names: list[str]):
        """Called by MAFT once its own settings are checked: the model loads only then."""
        from cory.train import load_model  # the model group's loader, without the PPO agents' handle keys

        model, tokenizer = load_model(cfg.model)
        built["tokenizer"] = tokenizer
        return _instantiate(cfg.algorithm.agent_models)(
            model,
            tokenizer,
            names,
            seed=seed,
            device=device,
            precision=cfg.hardware.precision,
            generation_batch_size=cfg.hardware.generation_batch_size,
        )

    algo_cfg = OmegaConf.masked_copy(cfg.algorithm, [k for k in cfg.algorithm if k not in RUNNER_KEYS])
    maft = _instantiate(algo_cfg, _convert_="all")(make_agents=make_agents, store=store, seed=seed)
    task = _instantiate(cfg.task, tokenizer=built["tokenizer"], _convert_="all")
    train_problems, eval_problems = task.train_problems(), task.eval_problems()[: cfg.get("num_eval")]
    _check(len(train_problems) > 0 or maft.finetune_rounds == 0, "task: no training problems to fine-tune on")
    _check(len(eval_problems) > 0, "task: no held-out problems to evaluate on")
    return maft, train_problems, eval_problems


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _validate(cfg: DictConfig) -> None:
    """The entry point's validation (`cory.config.validate`): every target, key, type and range, before anything
    loads (called again here, so that `run` can be called without `cory.train`)."""
    from cory.config import validate

    validate(cfg)


def _instantiate(node: DictConfig, *args, **kwargs):
    """`hydra.utils.instantiate`, re-raising a `ConfigError` that Hydra wrapped in its own exception."""
    try:
        return instantiate(node, *args, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, ConfigError):
            raise err.__cause__ from None
        raise


def _identity(container: dict) -> dict:
    """The part of a resolved config that decides what a run computes."""
    if isinstance(container, dict):
        return {k: _identity(v) for k, v in container.items() if k not in _NOT_IDENTITY}
    return container


def _check_same_run(cfg: DictConfig, run_dir: Path) -> None:
    saved = run_dir / RUN_CONFIG
    current = OmegaConf.to_container(cfg, resolve=True)
    if not saved.exists():
        saved.write_text(OmegaConf.to_yaml(cfg, resolve=True))
        return
    previous, current = _identity(OmegaConf.to_container(OmegaConf.load(saved), resolve=True)), _identity(current)
    if previous != current:
        changed = sorted(k for k in set(previous) | set(current) if previous.get(k) != current.get(k))
        raise ConfigError(
            f"{run_dir} holds a run with another config (differs in: {', '.join(changed)}); continue it with its "
            f"own config ({RUN_CONFIG}) or start in a new folder"
        )


def _make_logger(cfg: DictConfig, run_dir: Path, store: RunStore, resume_from: int):
    """The `logger` group's target, writing metrics.jsonl from `resume_from` on (later rows of a killed start go)."""
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.logger, resolve=True).items() if not k.startswith("_")}
    kwargs["run_dir"] = str(run_dir)
    for name in ("metrics.jsonl", "samples.jsonl"):
        _drop_rows_from(run_dir / name, resume_from)
    if cfg.logger._target_.endswith("WandbLogger"):
        kwargs |= {
            "config": OmegaConf.to_container(cfg, resolve=True) | {"git_sha": runtime.git_sha()},
            "run_id": store.state().get("wandb_run_id"),
            "name": f"maft-s{cfg.seed}",
            "tags": ["algorithm=maft"],
        }
    with runtime.rng_untouched():
        logger = get_object(cfg.logger._target_)(**kwargs)
    store.save_state({"wandb_run_id": getattr(logger, "run_id", None)})
    return logger


def _drop_rows_from(path: Path, iteration: int) -> None:
    """Keep the well-formed rows of a JSONL log with `iteration` < `iteration` (atomic rewrite): a continued run
    logs the later ones again, so its files equal an uninterrupted run's."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a partial last line from a kill
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), int) and row["iteration"] < iteration:
            kept.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def _print_round(k: int, row: dict) -> None:
    def pm(key: str) -> str:
        return f"{row.get(f'maft/eval/{key}', math.nan):.3f} ± {row.get(f'maft/eval/{key}_se', math.nan):.3f}"

    print(
        f"[maft] round {k}: held-out accuracy {pm('accuracy')} (n={int(row.get('maft/eval/problems', 0))}); "
        f"round-1 majority {pm('round1_majority_accuracy')}; single sample {pm('single_sample_accuracy')}; "
        f"round-1 disagreement {row.get('maft/eval/disagreement_round1', math.nan):.2f}",
        flush=True,
    )


def _summary(cfg: DictConfig, store: RunStore, maft, n_train: int, n_eval: int, wall_time_s: float) -> dict:
    """Baselines from round 0 and every round's held-out accuracies, each with its standard error."""

    def acc(row: dict, key: str) -> dict[str, float]:
        return {"accuracy": row.get(f"maft/eval/{key}"), "se": row.get(f"maft/eval/{key}_se")}

    rows = [store.row(k) for k in range(maft.finetune_rounds + 1)]
    last_round = f"round{maft.debate_rounds}_accuracy"
    return {
        "algorithm": "maft",
        "seed": cfg.seed,
        "num_agents": maft.num_agents,
        "debate_rounds": maft.debate_rounds,
        "finetune_rounds": maft.finetune_rounds,
        "single_agent_ft": maft.single_agent_ft,
        "filter": maft.filter,
        "train_problems": n_train,
        "eval_problems": n_eval,
        "baselines": {  # round 0: the base agents
            "single_sample": acc(rows[0], "single_sample_accuracy"),
            "majority": acc(rows[0], "round1_majority_accuracy"),
            "debate": acc(rows[0], "accuracy"),
        },
        "rounds": [
            {"round": k}
            | acc(row, "accuracy")
            | {
                "round1_accuracy": row.get("maft/eval/round1_accuracy"),
                "final_round_accuracy": row.get(f"maft/eval/{last_round}"),
                "single_sample_accuracy": row.get("maft/eval/single_sample_accuracy"),
                "disagreement_round1": row.get("maft/eval/disagreement_round1"),
                "embedding_dissimilarity_round1": row.get("maft/eval/embedding_dissimilarity_round1"),
            }
            for k, row in enumerate(rows)
        ],
        "wall_time_s": wall_time_s,  # of this start only, when the run was continued
    }
