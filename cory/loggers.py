"""Metric logging: one small interface, a JSONL backend that always runs, and an opt-in W&B mirror.

- `MetricLogger`: the protocol the trainers use (`log`, `log_table`, `close`).
- `JsonlLogger`: writes `run_dir/metrics.jsonl` (one `{"iteration": step, **metrics}` object per `log` call) and
  `run_dir/samples.jsonl` (one line per table row). Non-finite floats become `null`. A resumed run's trainer
  truncates both files to its checkpoint's line counts before a logger opens them (`cory.trainer.truncate_lines`).
- `WandbLogger`: wraps a `JsonlLogger` and mirrors everything to W&B. W&B can never stop training: a failing
  `wandb.init` falls back to JSONL only with one warning line, and a failing `wandb.log` disables the mirror.
  Curves are declared against `iteration` (`define_metric`). A metric's summary is W&B's default, its last value
  (a plain number); a metric given a direction (`best`, from `cory.metrics.BEST` through `cory.build`) also keeps
  its best value so far as `best/<name>`, and the iteration of it as `best_iteration/<name>`. Every table (the
  training samples, each evaluation's samples) is one incremental W&B table with an `iteration` column, its new
  rows logged as they come. Each checkpoint is a version of the model artifact `checkpoint-<run id>` (aliases
  `latest` and `iter_<k>`), unless `log_checkpoints=false`. A resumed run first re-logs from `metrics.jsonl`
  the history its W&B run lacks (all of it offline, where each start writes its own run file; the iterations
  after W&B's last step online) and its tables' rows from `samples.jsonl`, so it carries its whole history.
- `read_wandb_run`: what W&B recorded in an offline run (config, summary, state, group, ...), read back with W&B's
  own reader (`wandb leet inspect`).
- Metric names and their definitions are not here: `cory.metrics` (the helpers and the trainer's own names) and the
  catalogue beside each algorithm or learner that emits them.

`wandb` is imported lazily inside `WandbLogger`, so importing this module costs nothing (importing it takes ~1 s).
"""

from __future__ import annotations

import json
import math
import netrc
import os
import re
import subprocess
import sys
from collections.abc import Mapping
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

    def log_checkpoint(self, checkpoint: Path, step: int) -> None: ...

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

    def log_checkpoint(self, checkpoint: Path, step: int) -> None:
        """Checkpoints are folders of the run folder already: nothing to add."""

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


def read_tables(samples_jsonl: str | Path) -> dict[str, list[dict]]:
    """The rows of a samples JSONL file (`JsonlLogger`'s) by table name, each with its `iteration`; a malformed
    line is skipped."""
    tables: dict[str, list[dict]] = {}
    for row in read_metrics(samples_jsonl):
        name = row.pop("table", None)
        if isinstance(name, str):
            tables.setdefault(name, []).append(row)
    return tables


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


# The run folder's file that, beside a checkpoint folder, makes a folder `cory-export` and `cory.evaluate` read
# (`cory.runs.RUN_CONFIG`; this module sits below `cory.runs`): a checkpoint artifact holds both.
RUN_CONFIG_FILE = "run_config.yaml"


def _direction_patterns(best: Mapping[str, str]) -> list[tuple[re.Pattern, str]]:
    """`best`'s names as patterns: a `<...>` path segment (`<agent>`) matches any one segment."""
    patterns = []
    for name, direction in best.items():
        if direction not in ("max", "min"):
            raise ValueError(f"best[{name!r}] = {direction!r}: must be 'max' or 'min'")
        parts = [r"[^/]+" if re.fullmatch(r"<[^/]+>", part) else re.escape(part) for part in name.split("/")]
        patterns.append((re.compile("/".join(parts) + r"\Z"), direction))
    return patterns


class WandbLogger:
    """`JsonlLogger` plus a W&B mirror that can fail without stopping training.

    `mode`: "online", "offline" or "disabled"; None → `resolve_wandb_mode`. In "disabled" mode wandb is not even
    imported. `run_id`: a W&B run id to resume (`resume="allow"`); `.run_id` holds the id to save in checkpoints.
    `best`: metric name (pattern) → "max" or "min", the metrics whose best value W&B keeps beside the last.
    `log_checkpoints`: each checkpoint the trainer writes becomes a version of a W&B model artifact.
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
        best: Mapping[str, str] | None = None,
        log_checkpoints: bool = True,
    ) -> None:
        run_dir = Path(run_dir)
        # a resumed run's history, read before anything is appended (the trainer truncated both to its checkpoint)
        history = read_metrics(run_dir / JsonlLogger.METRICS_FILE) if run_id else []
        tables = read_tables(run_dir / JsonlLogger.SAMPLES_FILE) if run_id else {}
        self.jsonl = JsonlLogger(run_dir)
        self.run_dir = self.jsonl.run_dir
        self.mode = resolve_wandb_mode(mode)
        self._run_id = run_id
        self._run = None
        self._failed_run = None
        self._wandb = None
        self._step_metric = step_metric
        self._directions = _direction_patterns(best or {})
        self._best: dict[str, tuple[float, int]] = {}  # name → (best value, its iteration)
        self._tables: dict[str, Any] = {}  # name → its incremental wandb.Table
        self._log_checkpoints = bool(log_checkpoints)
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
            # no summary option anywhere: a glob's would reach the tables' fields too, and W&B would store a dict
            # ({"last": ..}) where a reader expects the number; the best values are keys of their own (`_keep_best`)
            self._run.define_metric("*", step_metric=step_metric)
            # what this W&B run lacks: offline, every start writes a run file of its own; online, W&B keeps the
            # history up to its last step (rows after the checkpoint were truncated from metrics.jsonl)
            first = 0 if self.mode == "offline" else int(getattr(self._run, "step", 0) or 0)
            for row in history:
                values = {k: v for k, v in row.items() if k != step_metric}
                if row.get(step_metric, -1) >= first:
                    self._mirror(values, int(row[step_metric]))
                else:  # in W&B already; its best still counts
                    self._keep_best(values, int(row[step_metric]))
            # a table is new in each process: its earlier rows go first, so it holds the whole run again
            for table_name, rows in tables.items():
                self._add_rows(table_name, rows)
            if self._tables and self._run is not None:  # joins W&B's current row: no step is used up
                self._run.log(dict(self._tables), commit=False)
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
            self._keep_best(values, step)
        except Exception as exc:  # noqa: BLE001
            self._disable("log", exc)

    def _direction(self, name: str) -> str | None:
        return next((d for pattern, d in self._directions if pattern.match(name)), None)

    def _keep_best(self, values: Mapping[str, Any], step: int) -> None:
        """`best/<name>` and `best_iteration/<name>` in the summary, for the metrics that have a direction."""
        improved = {}
        for name, value in values.items():
            direction = self._direction(name)
            if direction is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                continue
            held = self._best.get(name)
            if held is None or (value > held[0] if direction == "max" else value < held[0]):
                self._best[name] = (float(value), int(step))
                improved |= {f"best/{name}": float(value), f"best_iteration/{name}": int(step)}
        if improved and self._run is not None:
            self._run.summary.update(improved)

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        """Rows of the table `name` (the training samples, an evaluation's samples) at iteration `step`: in W&B one
        incremental table per name, with an `iteration` column, whose new rows are logged at once."""
        self.jsonl.log_table(name, rows, step)
        if self._run is None or not rows:
            return
        try:
            self._add_rows(name, [{self._step_metric: int(step), **r} for r in rows])
            self._run.log({name: self._tables[name]}, step=int(step))
        except Exception as exc:  # noqa: BLE001
            self._disable("log_table", exc)

    def _add_rows(self, name: str, rows: list[dict]) -> None:
        """Append `rows` to the table `name`, created with the first rows' columns (a table's columns are fixed;
        a table's rows all have the same fields)."""
        rows = [_jsonable(dict(r)) for r in rows]
        table = self._tables.get(name)
        if table is None:
            columns = list(dict.fromkeys(k for r in rows for k in r))
            table = self._wandb.Table(columns=columns, log_mode="INCREMENTAL", allow_mixed_types=True)
            self._tables[name] = table
        for r in rows:
            table.add_data(*[r.get(c) for c in table.columns])

    def log_image(self, name: str, path: str | Path, step: int) -> None:
        """Mirror a PNG already written to disk (`cory.evaluate`'s pass@k plot) to W&B."""
        if self._run is None:
            return
        try:
            self._run.log({name: self._wandb.Image(str(path))}, step=int(step))
        except Exception as exc:  # noqa: BLE001
            self._disable("log_image", exc)

    def log_checkpoint(self, checkpoint: Path, step: int) -> None:
        """The checkpoint folder, with the run's `run_config.yaml`, as a new version of the model artifact
        `checkpoint-<run id>` (aliases `latest`, `iter_<k>`): downloaded, it is a run folder with one checkpoint,
        which `cory-export` and `cory.evaluate` read. A failure stops the checkpoint uploads only, with one line."""
        if self._run is None or not self._log_checkpoints:
            return
        checkpoint = Path(checkpoint)
        try:
            artifact = self._wandb.Artifact(
                f"checkpoint-{self._run.id}",
                type="model",
                metadata={self._step_metric: int(step), "run_dir": str(self.run_dir.resolve())},
            )
            artifact.add_dir(str(checkpoint), name=f"checkpoints/{checkpoint.name}")
            if (self.run_dir / RUN_CONFIG_FILE).is_file():
                artifact.add_file(str(self.run_dir / RUN_CONFIG_FILE), name=RUN_CONFIG_FILE)
            self._run.log_artifact(artifact, aliases=["latest", checkpoint.name])
        except Exception as exc:  # noqa: BLE001 - the checkpoint is on disk; W&B's copy is a convenience
            self._log_checkpoints = False
            _warn(
                f"W&B checkpoint artifact failed ({_one_line(exc)}); no further checkpoint goes to W&B, they stay "
                f"in {checkpoint.parent}."
            )

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


# --------------------------------------------------------------------------------------------------------------------
# Reading an offline run back
# --------------------------------------------------------------------------------------------------------------------


def offline_run_file(path: str | Path) -> Path:
    """The `.wandb` file of an offline W&B run: `path` itself, the one in an `offline-run-*` folder, or the newest
    run under a `wandb/` folder or under a cory run folder's `wandb/` (a resumed offline run writes one file per
    start, the newest holding the whole history).

    Raises:
        FileNotFoundError: there is no offline run there.
    """
    path = Path(path)
    if path.is_file() and path.suffix == ".wandb":
        return path
    for folder in (path, path / "wandb"):
        files = sorted(folder.glob("run-*.wandb")) or sorted(folder.glob("offline-run-*/run-*.wandb"))
        if files:
            return files[-1]  # offline-run-<date>_<time>-<id>: the newest sorts last
    raise FileNotFoundError(f"{path}: no offline W&B run there (no offline-run-*/run-*.wandb)")


def read_wandb_run(path: str | Path, timeout: float = 120.0) -> dict:
    """What W&B recorded in an offline run (`offline_run_file(path)`), read with W&B's own reader, `wandb leet
    inspect`: {"id", "name", "project", "group", "job_type", "tags", "state", "config", "summary"}.

    `summary` is what the W&B UI shows as the run's summary: `summary["eval/llm1/task_reward"]` is the last logged
    value (a number), `summary["best/eval/llm1/task_reward"]` the best, `summary["_step"]` the last step, a table a
    dict describing it. `config` holds plain values (no `{"value": ...}` wrappers).
    """
    run_file = offline_run_file(path)

    def inspect(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "wandb", "leet", "inspect", *args, str(run_file)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"wandb leet inspect {run_file} failed: {(out.stderr.strip() or '?').splitlines()[-1]}")
        return out.stdout

    state = json.loads(inspect("--summary", "--json"))
    run: dict = {}  # the run record: group and job type, which the summary view leaves out
    for line in inspect("--json").splitlines():
        if line.startswith("{") and '"type":"run"' in line:
            run = json.loads(line)["run"]
            break
    return {
        "id": state.get("run_id") or run.get("run_id"),
        "name": state.get("name") or run.get("display_name"),
        "project": state.get("project") or run.get("project"),
        "group": run.get("run_group"),
        "job_type": run.get("job_type"),
        "tags": list(state.get("tags") or run.get("tags") or []),
        "state": state.get("state"),
        "config": state.get("config") or {},
        "summary": state.get("summary") or {},
    }
