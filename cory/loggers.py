"""Metric logging: one small interface, a JSONL backend that always runs, and an opt-in W&B mirror.

- `MetricLogger`: the protocol the trainers use (`log`, `log_table`, `close`).
- `JsonlLogger`: writes `run_dir/metrics.jsonl` (one `{"iteration": step, **metrics}` object per `log` call) and
  `run_dir/samples.jsonl` (one line per table row). Non-finite floats become `null`. A resumed run's trainer
  truncates both files to its checkpoint's line counts before a logger opens them (`cory.trainer.truncate_lines`).
- `WandbLogger`: wraps a `JsonlLogger` and mirrors everything to W&B. W&B can never stop training: a failing
  `wandb.init` falls back to JSONL only with one warning line, and a failing `wandb.log` disables the mirror.
- Metric names live here and only here (`train_key`, `ppo_key`, `eval_key`, `role_key` and the constants), with a
  one-line definition each in `METRICS` (docs/method.md §6); `metrics_markdown_table()` renders the README table.
  A run emits no name that `METRICS` does not define (`tests/test_meaning.py`).

`wandb` is imported lazily inside `WandbLogger`, so importing this module costs nothing (importing it takes ~1 s).
"""

from __future__ import annotations

import json
import math
import netrc
import os
import sys
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

# --------------------------------------------------------------------------------------------------------------------
# Metric names
# --------------------------------------------------------------------------------------------------------------------

AGENT_PLACEHOLDER = "<agent>"
# Role names used in place of an agent name for the by-role training curves (`train/pioneer/...`).
ROLES = ("pioneer", "observer")

TIME_ITERATION = "time/iteration_s"
TIME_GENERATE = "time/generate_s"
TIME_LEARN = "time/learn_s"
MEMORY_PEAK_MB = "memory/peak_mb"
CORY_LLM1_ROLE = "cory/llm1_role"
CORY_SWAPS = "cory/swaps"


def train_key(agent: str, name: str) -> str:
    """Training-rollout metric of one agent in its current role, e.g. `train/llm1/task_reward`."""
    return f"train/{agent}/{name}"


def ppo_key(agent: str, name: str) -> str:
    """PPO-update internal of one agent, e.g. `ppo/llm1/clipfrac`."""
    return f"ppo/{agent}/{name}"


def eval_key(agent: str, name: str) -> str:
    """Held-out evaluation metric of one agent alone in the query-only role, e.g. `eval/llm1/kl`."""
    return f"eval/{agent}/{name}"


def role_key(role: str, name: str) -> str:
    """Training metric of whichever agent holds `role` ("pioneer" or "observer"), e.g. `train/pioneer/kl`."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return f"train/{role}/{name}"


_A = AGENT_PLACEHOLDER
# Every logged metric name (pattern) with its one-line definition; the README table is generated from this dict.
METRICS: dict[str, str] = {
    # Training rollouts, per agent, in the agent's current role and prompt (batch means).
    train_key(_A, "task_reward"): "Task reward r(q, a) of the agent's own response, before any score scaling.",
    train_key(_A, "kl"): (
        "KL_seq: per-token KL to π0 on the agent's own prompt (the penalty's estimator, `full` by default: "
        "Σ_v π_θ log π_θ/π0), summed over response tokens (EOS included)."
    ),
    train_key(_A, "kl_per_token"): "KL_seq / T per response, batch mean.",
    train_key(_A, "kl_coef"): "β used for this iteration's KL-shaped rewards (before the adaptive controller update).",
    train_key(_A, "combined_reward"): (
        "r − η_eval·KL_seq with the task's fixed η_eval (IMDB 0.3, GSM8K 0.01), the same for every algorithm."
    ),
    train_key(_A, "combined_reward_current_beta"): (
        "r − β·KL_seq with the agent's current β (secondary; the official code's `LLM*_index`)."
    ),
    train_key(_A, "response_length"): "T: response tokens, EOS included if generated.",
    train_key(_A, "tokens"): (
        "Prompt + response tokens of the batch, padding excluded: the work of each forward and backward pass."
    ),
    train_key(_A, "hit_max_tokens"): "Fraction of responses that reached `max_new_tokens`.",
    train_key(_A, "entropy"): (
        "Mean over response tokens of the full-vocabulary entropy H(π_θ(·|s_t)), from rollout-time logits."
    ),
    train_key(_A, "sampled_entropy"): "Σ_t −log π_θ(a_t|s_t) per response, batch mean (TRL's `objective/entropy`).",
    train_key(_A, "collective_reward"): (
        "R_i = w_self·r_i + w_other·r_{−i}, the reward PPO optimises (before score scaling); equals r for PPO."
    ),
    train_key(_A, "scaled_collective_reward"): (
        "R̃_i: R_i as it enters the last token's reward, after score scaling, normalisation and clipping "
        "(`use_score_scaling`, `use_score_norm`, `score_clip`); equals `collective_reward` when they are off."
    ),
    # PPO internals, per agent (means over epochs and minibatches).
    ppo_key(_A, "policy_loss"): "Clipped surrogate policy loss.",
    ppo_key(_A, "value_loss"): "Clipped value-function loss.",
    ppo_key(_A, "clipfrac"): "Fraction of response tokens where the clipped policy term is the active one.",
    ppo_key(_A, "value_clipfrac"): "Fraction of response tokens where the clipped value term is the active one.",
    ppo_key(_A, "approx_kl"): "½·mean((log π_θ − log π_old)²) over response tokens (TRL's `policy/approxkl`).",
    ppo_key(_A, "policy_kl"): (
        "mean(log π_old − log π_θ) over response tokens (TRL's `policy/policykl`), the early-stopping statistic."
    ),
    ppo_key(
        _A, "entropy"
    ): "Mean full-vocabulary token entropy in the training forward pass (TRL's `policy/entropy`).",
    ppo_key(_A, "ratio"): "Mean probability ratio π_θ / π_old over response tokens.",
    ppo_key(
        _A, "ratio_threshold_hits"
    ): "Minibatches whose mean ratio exceeded `ratio_threshold` (loss zeroed, as TRL).",
    ppo_key(_A, "explained_variance"): "1 − Var(returns − values) / Var(returns) over response tokens.",
    ppo_key(_A, "mean_non_score_reward"): "Masked token mean of −β·kl_t (TRL's `ppo/mean_non_score_reward`).",
    ppo_key(_A, "early_stopped"): (
        "1 when the early-stopping test (policy_kl > 1.5·target_kl, checked after each epoch as TRL does) fired "
        "and ended the epochs; always 0 with `early_stopping=false`."
    ),
    ppo_key(_A, "nonfinite_skipped"): "1 when the whole update was skipped for a non-finite reward, KL or value.",
    ppo_key(_A, "nonfinite_steps"): "Optimiser steps skipped because a gradient was non-finite.",
    "train/reward_failures": "Samples whose reward function raised this iteration (given the task's failure reward).",
    "train/nonfinite_iterations": "Cumulative iterations with a non-finite loss, reward or KL (update skipped).",
    # Evaluation: each agent alone, query-only (pioneer) prompt, held-out queries, dropout off (docs/method.md §1.6).
    eval_key(_A, "task_reward"): "Task reward of the agent alone on held-out queries (frontier x-axis).",
    eval_key(_A, "kl"): "KL_seq on the query-only prompt against π0 on held-out queries (frontier y-axis is −KL_seq).",
    eval_key(_A, "combined_reward"): "r − η_eval·KL_seq on held-out queries, fixed η_eval shared by all algorithms.",
    eval_key(_A, "response_length"): "T on held-out queries, EOS included if generated.",
    eval_key(_A, "reward_failures"): "Held-out samples whose reward raised (given the task's failure reward).",
    eval_key(_A, "no_answer_rate"): "GSM8K and arithmetic: share of held-out responses with no number (reward 0).",
    # Cost.
    TIME_ITERATION: "Wall-clock seconds of the whole training iteration.",
    TIME_GENERATE: "Seconds spent generating responses this iteration (all agents).",
    TIME_LEARN: "Seconds spent in PPO updates this iteration (all agents).",
    MEMORY_PEAK_MB: "Peak memory in MB: CUDA max allocated on GPU, process peak RSS on CPU.",
    # CORY by role and role exchange.
    role_key("pioneer", "task_reward"): "Task reward of whichever agent is the pioneer this iteration.",
    role_key("pioneer", "kl"): "KL_seq of whichever agent is the pioneer this iteration.",
    role_key("observer", "task_reward"): "Task reward of whichever agent is the observer this iteration.",
    role_key("observer", "kl"): "KL_seq of whichever agent is the observer this iteration.",
    CORY_LLM1_ROLE: "Role held by LLM1 this iteration: 0 = pioneer, 1 = observer (LLM2 holds the other).",
    CORY_SWAPS: "Cumulative number of role exchanges so far.",
}
del _A


def is_known_metric(name: str) -> bool:
    """Whether `name` matches a pattern of `METRICS` (any agent name but a role name in place of `<agent>`)."""
    if name in METRICS:
        return True
    parts = name.split("/")
    if len(parts) == 3 and parts[1] not in ROLES:  # the by-role views are defined one by one
        return "/".join((parts[0], AGENT_PLACEHOLDER, parts[2])) in METRICS
    return False


def metrics_markdown_table(metrics: dict[str, str] | None = None) -> str:
    """A README table of logged metrics, one row per entry: `METRICS` by default (`<agent>` is llm1/llm2, or the
    PPO agent); `cory.maft.metrics.MAFT_METRICS` for Multiagent Finetuning."""
    lines = ["| metric | definition |", "|---|---|"]
    for name, description in (METRICS if metrics is None else metrics).items():
        escaped = description.replace("|", "\\|")
        lines.append(f"| `{name}` | {escaped} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------------------------------


class MetricLogger(Protocol):
    """What the trainers log through; `step` is the training iteration."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_table(self, name: str, rows: list[dict], step: int) -> None: ...

    def close(self) -> None: ...


def _jsonable(value: Any) -> Any:
    """A JSON-safe copy: non-finite floats → None, numpy/torch scalars → Python numbers, unknown objects → str."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy scalar, 0-d array, one-element torch tensor
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    try:
        return _jsonable(float(value))
    except (TypeError, ValueError):
        return str(value)


class JsonlLogger:
    """Appends metrics to `run_dir/metrics.jsonl` and table rows to `run_dir/samples.jsonl`, one flushed line each."""

    METRICS_FILE = "metrics.jsonl"
    SAMPLES_FILE = "samples.jsonl"

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / self.METRICS_FILE
        self.samples_path = self.run_dir / self.SAMPLES_FILE
        self._metrics_file = self.metrics_path.open("a", encoding="utf-8")
        self._samples_file = None  # opened on the first table

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"iteration": int(step), **{str(k): _jsonable(v) for k, v in metrics.items()}}
        self._write(self._metrics_file, row)

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        if self._samples_file is None:
            self._samples_file = self.samples_path.open("a", encoding="utf-8")
        for r in rows:
            self._write(self._samples_file, {"iteration": int(step), "table": name, **_jsonable(dict(r))})

    @staticmethod
    def _write(handle, row: dict) -> None:
        if handle.closed:
            return
        handle.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        handle.flush()

    def close(self) -> None:
        for handle in (self._metrics_file, self._samples_file):
            if handle is not None and not handle.closed:
                handle.close()

    def __enter__(self) -> JsonlLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SECRET_MARKERS = ("key", "token", "secret", "password")


def strip_secrets(config: Any) -> Any:
    """A copy of `config` without entries whose key contains key/token/secret/password (any case, any depth)."""
    if isinstance(config, dict):
        return {
            k: strip_secrets(v)
            for k, v in config.items()
            if not any(marker in str(k).lower() for marker in _SECRET_MARKERS)
        }
    if isinstance(config, (list, tuple)):
        return [strip_secrets(v) for v in config]
    return config


def _api_key_configured() -> bool:
    """Whether W&B could authenticate: `WANDB_API_KEY`, or a netrc entry for api.wandb.ai (or `WANDB_BASE_URL`)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    hosts = {"api.wandb.ai"}
    base_url = os.environ.get("WANDB_BASE_URL")
    if base_url:
        hosts.add(urlparse(base_url).hostname or base_url)
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        entries = netrc.netrc(path)
    except (OSError, netrc.NetrcParseError):
        return False
    return any(entries.authenticators(host) for host in hosts)


def resolve_wandb_mode(mode: str | None = None) -> str:
    """The W&B mode: explicit `mode`, else `WANDB_MODE`, else "offline" without an API key, else "online"."""
    if mode:
        return mode
    env_mode = os.environ.get("WANDB_MODE")
    if env_mode:
        return env_mode
    return "online" if _api_key_configured() else "offline"


def _warn(message: str) -> None:
    print(f"[cory] WARNING: {message}", file=sys.stderr, flush=True)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class WandbLogger:
    """`JsonlLogger` plus a W&B mirror that can fail without stopping training.

    `mode`: "online", "offline" or "disabled"; None → `resolve_wandb_mode`. In "disabled" mode wandb is not even
    imported. `run_id`: a W&B run id to resume (`resume="allow"`); `.run_id` holds the id to save in checkpoints.
    """

    def __init__(
        self,
        run_dir: str | Path,
        config: dict,
        project: str = "cory",
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        name: str | None = None,
        mode: str | None = None,
        run_id: str | None = None,
        init_timeout: float = 20.0,
    ) -> None:
        self.jsonl = JsonlLogger(run_dir)
        self.run_dir = self.jsonl.run_dir
        self.mode = resolve_wandb_mode(mode)
        self._run_id = run_id
        self._run = None
        self._failed_run = None
        self._wandb = None
        if self.mode == "disabled":
            return
        try:
            import wandb

            self._run = wandb.init(
                dir=str(self.run_dir),
                config=strip_secrets(dict(config or {})),
                project=project,
                entity=entity,
                group=group,
                tags=list(tags) if tags else None,
                name=name,
                id=run_id,
                resume="allow",
                mode=self.mode,
                settings=wandb.Settings(init_timeout=init_timeout),
            )
            self._wandb = wandb
            self._run_id = self._run.id
        except Exception as exc:  # noqa: BLE001 - W&B must never stop training
            self._run = None
            _warn(
                f"W&B init failed in mode {self.mode!r} ({_one_line(exc)}); continuing with "
                f"{self.jsonl.metrics_path} only. Set WANDB_MODE=offline (local W&B copy) or WANDB_MODE=disabled."
            )

    @property
    def run_id(self) -> str | None:
        """The W&B run id (or the one given, when W&B is disabled or failed); save it to resume the same run."""
        return self._run_id

    @property
    def mirroring(self) -> bool:
        """Whether metrics are still being mirrored to W&B."""
        return self._run is not None

    def _disable(self, what: str, exc: Exception) -> None:
        _warn(f"W&B {what} failed ({_one_line(exc)}); W&B mirror disabled, still writing {self.jsonl.metrics_path}.")
        # Finished (as failed) only in `close()`, after training, in case finishing blocks on a broken connection.
        self._failed_run, self._run = self._run, None

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.jsonl.log(metrics, step)
        if self._run is None:
            return
        try:
            values = _jsonable(dict(metrics))  # non-finite → None → NaN, which W&B draws as a gap
            self._run.log({k: float("nan") if v is None else v for k, v in values.items()}, step=int(step))
        except Exception as exc:  # noqa: BLE001
            self._disable("log", exc)

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        self.jsonl.log_table(name, rows, step)
        if self._run is None or not rows:
            return
        try:
            rows = [_jsonable(dict(r)) for r in rows]
            columns = list(dict.fromkeys(k for r in rows for k in r))
            data = [[r.get(c) for c in columns] for r in rows]
            self._run.log({name: self._wandb.Table(columns=columns, data=data)}, step=int(step))
        except Exception as exc:  # noqa: BLE001
            self._disable("log_table", exc)

    def log_image(self, name: str, path: str | Path, step: int) -> None:
        """Mirror a PNG already written to disk (`cory.evaluate`'s pass@k plot) to W&B."""
        if self._run is None:
            return
        try:
            self._run.log({name: self._wandb.Image(str(path))}, step=int(step))
        except Exception as exc:  # noqa: BLE001
            self._disable("log_image", exc)

    def close(self) -> None:
        self.jsonl.close()
        if self._failed_run is not None:
            run, self._failed_run = self._failed_run, None
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001
                pass
        if self._run is not None:
            run, self._run = self._run, None
            try:
                run.finish()
            except Exception as exc:  # noqa: BLE001
                _warn(f"W&B finish failed ({_one_line(exc)}); metrics are in {self.jsonl.metrics_path}.")

    def __enter__(self) -> WandbLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
