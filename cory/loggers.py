"""Metric logging: one small interface, a JSONL backend that always runs, and an opt-in W&B mirror.

- `MetricLogger`: the protocol the trainers use (`log`, `log_table`, `close`).
- `JsonlLogger`: writes `run_dir/metrics.jsonl` (one `{"iteration": step, **metrics}` object per `log` call) and
  `run_dir/samples.jsonl` (one line per table row). Non-finite floats become `null`. A resumed run's trainer
  truncates both files to its checkpoint's line counts before a logger opens them (`cory.trainer.truncate_lines`).
- `WandbLogger`: wraps a `JsonlLogger` and mirrors everything to W&B. W&B can never stop training: a failing
  `wandb.init` falls back to JSONL only with one warning line, and a failing `wandb.log` disables the mirror.
  Curves are declared against `iteration` (`define_metric`), with `train/*` summarised by their last value and
  `eval/*` by their last and best; the per-iteration training samples grow one table, logged once at the end;
  a resumed run first re-logs from `metrics.jsonl` the history its W&B run lacks (all of it offline, where each
  start writes its own run file; the iterations after W&B's last step online), so it carries its whole history.
- Metric names and their definitions are not here: `cory.metrics` (the helpers and the trainer's own names) and the
  catalogue beside each algorithm or learner that emits them.

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
# Backends
# --------------------------------------------------------------------------------------------------------------------


class MetricLogger(Protocol):
    """What the trainers log through; `step` is the training iteration."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_table(self, name: str, rows: list[dict], step: int) -> None: ...

    def log_image(self, name: str, path: str | Path, step: int) -> None: ...

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

    def log_image(self, name: str, path: str | Path, step: int) -> None:
        """Figures are files of the run folder already: nothing to add."""

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


def read_metrics(metrics_jsonl: str | Path) -> list[dict]:
    """The well-formed rows of a metrics JSONL file (`JsonlLogger`'s): a malformed line (a tail cut by a kill) or a
    non-object line is skipped."""
    rows = []
    path = Path(metrics_jsonl)
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), (int, float)):
            rows.append(row)
    return rows


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
        job_type: str = "train",
        step_metric: str = "iteration",
    ) -> None:
        history = read_metrics(Path(run_dir) / JsonlLogger.METRICS_FILE) if run_id else []  # before appending
        self.jsonl = JsonlLogger(run_dir)
        self.run_dir = self.jsonl.run_dir
        self.mode = resolve_wandb_mode(mode)
        self._run_id = run_id
        self._run = None
        self._failed_run = None
        self._wandb = None
        self._step_metric = step_metric
        self._growing: dict[str, list[dict]] = {}  # per-iteration tables, logged once at `close`
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
                job_type=job_type,
                id=run_id,
                resume="allow",
                mode=self.mode,
                settings=wandb.Settings(init_timeout=init_timeout),
            )
            self._wandb = wandb
            self._run_id = self._run.id
            self._run.define_metric(step_metric)
            self._run.define_metric("train/*", step_metric=step_metric, summary="last")
            self._run.define_metric("eval/*", step_metric=step_metric, summary="max,last")
            self._run.define_metric("*", step_metric=step_metric)
            # what this W&B run lacks: offline, every start writes a run file of its own; online, W&B keeps the
            # history up to its last step (rows after the checkpoint were truncated from metrics.jsonl)
            first = 0 if self.mode == "offline" else int(getattr(self._run, "step", 0) or 0)
            for row in history:
                if row.get(step_metric, -1) >= first:
                    self._mirror({k: v for k, v in row.items() if k != step_metric}, int(row[step_metric]))
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
        if self._run is not None:
            self._mirror(metrics, step)

    def _mirror(self, metrics: dict, step: int) -> None:
        try:
            values = _jsonable(dict(metrics))  # non-finite → None → NaN, which W&B draws as a gap
            values = {k: float("nan") if v is None else v for k, v in values.items()}
            self._run.log(values | {self._step_metric: int(step)}, step=int(step))
        except Exception as exc:  # noqa: BLE001
            self._disable("log", exc)

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        """An evaluation's table is one W&B table at its iteration; a per-iteration table (`train/samples`) grows,
        with an `iteration` column, and is logged once at `close`."""
        self.jsonl.log_table(name, rows, step)
        if self._run is None or not rows:
            return
        if name.startswith("train/"):
            self._growing.setdefault(name, []).extend({self._step_metric: int(step), **r} for r in rows)
            return
        self._log_table_now(name, rows, step)

    def _log_table_now(self, name: str, rows: list[dict], step: int | None) -> None:
        try:
            rows = [_jsonable(dict(r)) for r in rows]
            columns = list(dict.fromkeys(k for r in rows for k in r))
            data = [[r.get(c) for c in columns] for r in rows]
            table = {name: self._wandb.Table(columns=columns, data=data)}
            self._run.log(table, step=int(step)) if step is not None else self._run.log(table)
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
        for name, rows in self._growing.items():
            if self._run is not None:
                self._log_table_now(name, rows, None)
        self._growing = {}
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
