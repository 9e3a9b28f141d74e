"""The one reader of what runs leave behind, for the study commands: run folders, and the small files of finished runs
that `cory-sweep --results` copies out of them to be committed.

What is read (and who writes it):
- `summary.json` (the trainer, at the end of every start): `completed`, `iterations`, `seed`, `algorithm`,
  `agents.<id>.{task_reward, kl, combined_reward}` (the final held-out evaluation), `initial.<id>.{...}`;
- `metrics.jsonl` (`cory.loggers.JsonlLogger`): one row per iteration and split (`iteration`, `train/<agent>/...`,
  `eval/<agent>/...`); a line cut by a kill is skipped (`cory.loggers.read_metrics`);
- `run_config.yaml` (the resolved config) and Hydra's `.hydra/overrides.yaml`, or its copy `overrides.yaml` beside
  a run's kept results;
- `passk.json` (`cory-evaluate`): `<model>.{pass@k, greedy_accuracy, ...}`, the base model as `base`;
- `eval_outcomes.jsonl` (MAFT's per-problem outcomes, `cory.maft.outcomes`);
- a sweep's kept results, `RESULTS/<key>=<value>/seed=<n>/` (`cory-sweep --results`);
- W&B run summaries (`wandb_summary`): each key's last value, plain, or in the older `{"last": ..., "max": ...}`
  form, of which the last value is taken.

Everything read is checked where it is read: a file that cannot be read, is empty, is not the JSON or YAML object it
should be, lacks a key a report needs, or holds text or NaN where a number belongs is a `StudyError` naming the file,
the key and what to do (one line through `cory.studies.command.guard`). A file that may be absent (an unfinished
run has no summary yet) reads as None.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cory.studies.command import StudyError

SUMMARY, METRICS, RUN_CONFIG, PASSK = "summary.json", "metrics.jsonl", "run_config.yaml", "passk.json"
OVERRIDES = (Path(".hydra") / "overrides.yaml", Path("overrides.yaml"))  # a run folder's, then a kept copy's
HELD_OUT = {"reward": "task_reward", "kl": "kl", "combined": "combined_reward"}  # held_out's keys: eval/<agent>/<name>


# ------------------------------------------------------------------------------------------------------- files
def _text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise StudyError(f"{path} is not text (a corrupt or foreign file); copy it again from its run") from None
    except OSError as err:
        raise StudyError(f"cannot read {path} ({err.strerror or type(err).__name__})") from None


def read_json(path: Path, kind: type = dict) -> Any:
    """The JSON value of `path`, which must be a `kind` (an object by default)."""
    text = _text(path)
    if not text.strip():
        raise StudyError(f"{path} is empty; the run that wrote it was cut short: run it again or leave it out")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise StudyError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}); copy it again from its run"
        ) from None
    if not isinstance(value, kind):
        names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
        found = names.get(type(value), "null" if value is None else type(value).__name__)
        raise StudyError(f"{path} holds {found}, not {names.get(kind, kind.__name__)}; is it the right file?")
    return value


def read_yaml(path: Path) -> Any:
    """The YAML value of `path` (None for an empty file)."""
    import yaml

    try:
        return yaml.safe_load(_text(path))
    except yaml.YAMLError as err:
        raise StudyError(f"{path} is not valid YAML ({' '.join(str(err).split())[:120]})") from None


def number(value: Any, where: str) -> float:
    """`value` as a finite float; text, null, a boolean or NaN is refused, with `where` naming the file and key."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    what = "NaN or infinite" if isinstance(value, float) else f"{json.dumps(value)}, not a number"
    raise StudyError(f"{where} is {what}; a report needs finite numbers: leave the run out or run it again")


def field(node: Mapping, key: str, where: str) -> Any:
    """`node[key]`, or a `StudyError` saying that `where` lacks it."""
    if not isinstance(node, Mapping) or key not in node:
        raise StudyError(
            f"{where} has no {key!r}; the file is partial or from another tool: copy it again from its run"
        )
    return node[key]


# ------------------------------------------------------------------------------------------------------- a run
def summary(folder: Path) -> dict | None:
    """The run's `summary.json`, or None when there is none (a run that never ended a start)."""
    path = Path(folder) / SUMMARY
    return read_json(path) if path.exists() else None


def finished(folder: Path) -> bool:
    """Whether the run's summary says it completed (`completed: true`); a corrupt summary is refused."""
    found = summary(folder)
    return found is not None and found.get("completed") is True


def final_evaluation(found: dict, folder: Path, keys: Iterable[str] = ("task_reward", "kl")) -> dict[str, dict]:
    """agent → {key: finite number} of a finished run's final held-out evaluation (`summary.json`'s `agents`)."""
    where = Path(folder) / SUMMARY
    agents = field(found, "agents", str(where))
    if not isinstance(agents, Mapping) or not agents:
        raise StudyError(f"{where}: 'agents' holds no agent's evaluation; copy it again from its run")
    return {
        agent: {key: number(field(values, key, f"{where} agent {agent}"), f"{where}: agents.{agent}.{key}")
                for key in keys}
        for agent, values in agents.items()
    }  # fmt: skip


def metrics(path: Path) -> list[dict]:
    """The rows of a `metrics.jsonl` (a malformed line, e.g. one cut by a kill, is skipped); a missing file is
    refused: every run writes one from its first iteration."""
    from cory.loggers import read_metrics

    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path} does not exist; copy the run's metrics.jsonl beside its summary.json")
    _text(path)  # unreadable, or not text: one line
    return read_metrics(path)


def held_out(path: Path, agent: str = "llm1", keys: Iterable[str] = tuple(HELD_OUT)) -> list[dict]:
    """`{iteration, reward, kl, combined}` (or the `keys` of them asked for) of `agent`'s held-out evaluations in a
    `metrics.jsonl`, in order, each value a finite number; none at all is refused (a finished run evaluates at least
    at its start and its end)."""
    out = []
    for row in metrics(path):
        if f"eval/{agent}/task_reward" not in row:
            continue
        where = f"{path} iteration {row['iteration']}"
        point = {"iteration": row["iteration"]}
        for key in keys:
            name = f"eval/{agent}/{HELD_OUT[key]}"
            point[key] = number(field(row, name, where), f"{where}: {name}")
        out.append(point)
    if not out:
        raise StudyError(
            f"{path} holds no held-out evaluation of {agent} (eval/{agent}/task_reward); is it a whole run?"
        )
    return out


def evaluated_agents(path: Path) -> list[str]:
    """The agents a `metrics.jsonl` holds held-out evaluations of (`eval/<agent>/task_reward`), in the order first
    logged: PPO's run has llm1 only, CORY's llm1 and llm2."""
    found = {}
    for row in metrics(path):
        for key in row:
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "eval" and parts[2] == "task_reward":
                found.setdefault(parts[1], None)
    return list(found)


def column(rows: list[dict], key: str, path: Path) -> list[float]:
    """Every logged value of `key` in the rows of `path`, as finite numbers."""
    return [number(r[key], f"{path} iteration {r['iteration']}: {key}") for r in rows if key in r]


def passk(folder: Path, keys: Iterable[str]) -> dict[str, dict[str, float]] | None:
    """model → {key: finite number} of the run's `passk.json` (`cory-evaluate`), or None when it has none."""
    path = Path(folder) / PASSK
    if not path.exists():
        return None
    found = read_json(path)
    return {
        model: {key: number(field(values, key, f"{path} {model}"), f"{path}: {model}.{key}") for key in keys}
        for model, values in found.items()
    }


def overrides(folder: Path) -> list[str] | None:
    """The run's command-line overrides (Hydra's record, or its copy beside kept results); None without one."""
    for name in OVERRIDES:
        path = Path(folder) / name
        if path.is_file():
            found = read_yaml(path) or []
            if not isinstance(found, list):
                raise StudyError(f"{path} is not a list of overrides; copy it again from the run's .hydra folder")
            return [str(o) for o in found]
    return None


def config(folder: Path) -> dict:
    """The run's resolved `run_config.yaml` ({} without one)."""
    path = Path(folder) / RUN_CONFIG
    found = read_yaml(path) if path.is_file() else {}
    if not isinstance(found, dict):
        raise StudyError(f"{path} is not a YAML mapping; copy it again from the run")
    return found


# -------------------------------------------------------------------------------------------------- many runs
def kept_runs(results: Path, group: str) -> list[tuple[str, int, Path]]:
    """(value, seed, folder) of every `RESULTS/<key>=<value>/seed=<n>/` (`cory-sweep --results`) whose group folder
    matches `group` (`algorithm=*`, `experiment=imdb_claim_ppo`), sorted."""
    results = Path(results)
    if not results.is_dir():
        raise StudyError(f"no such folder: {results}; pass the --results folder of the sweep")
    out = []
    for folder in sorted(results.glob(f"{group}/seed=*")):
        seed = folder.name.split("=", 1)[1]
        if not seed.lstrip("-").isdigit():
            raise StudyError(f"{folder}: seed {seed!r} is not an integer; rename the folder seed=<n>")
        out.append((folder.parent.name.split("=", 1)[1], int(seed), folder))
    return out


def discover_runs(dirs: Iterable[str | Path]) -> list[Path]:
    """Every folder under `dirs` (or one of them) holding a `metrics.jsonl`, sorted, each once."""
    return sorted({p.parent.resolve() for d in map(Path, dirs) for p in d.rglob(METRICS)})


def _flatten(node, prefix: str = "") -> dict[str, str]:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out |= _flatten(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: json.dumps(node) if isinstance(node, list) else str(node)}


def settings(folder: Path) -> dict[str, str]:
    """What a run is: its overrides (`key=value`) or, without them, its flattened resolved config, the algorithm's
    class as `algorithm=<name>` (its other keys vary with it and are dropped, the agent's kept)."""
    given = overrides(folder)
    if given is not None:
        items = (o.lstrip("+~").split("=", 1) for o in given)
        return {k: v for k, v in (i if len(i) == 2 else (i[0], "") for i in items)}
    found = _flatten(config(folder))
    target = found.pop("algorithm._target_", None)
    if target is not None:
        found = {k: v for k, v in found.items() if not k.startswith("algorithm.") or "agent." in k}
        found["algorithm"] = target.rsplit(".", 1)[-1].lower()
    return found


# ------------------------------------------------------------------------------------------------- MAFT outcomes
def outcomes(path: Path) -> list[dict]:
    """The well-formed rows of a MAFT `eval_outcomes.jsonl` (`cory.maft.outcomes.read_outcomes`)."""
    from cory.maft.outcomes import read_outcomes

    _text(path)  # unreadable, or not text: one line
    return read_outcomes(path)


def outcomes_at(rows: list[dict], iteration: int | None, where: str) -> tuple[int, list[dict]]:
    """The rows of the evaluation at `iteration` (None: the last one in the file), ordered by problem; refused in one
    line (`where` names the file) when there is none or it is not whole."""
    try:
        done = sorted({int(r["iteration"]) for r in rows})
        if done:
            k = done[-1] if iteration is None else iteration
            chosen = sorted((r for r in rows if int(r["iteration"]) == k), key=lambda r: int(r["problem"]))
            sizes = {int(r["n"]) for r in chosen}
    except (TypeError, ValueError):
        raise StudyError(f"{where}: a row's iteration, problem or n is not an integer; the file is corrupt") from None
    if not done:
        raise StudyError(f"{where} holds no evaluation")
    if k not in done:
        raise StudyError(f"{where} has no evaluation at iteration {k} (it has {', '.join(map(str, done))})")
    n = int(chosen[0]["n"])
    if [int(r["problem"]) for r in chosen] != list(range(n)) or sizes != {n}:
        raise StudyError(f"{where}: the evaluation at iteration {k} is not whole ({len(chosen)} of {n} problems)")
    return k, chosen


def outcome_columns(rows: list[dict]) -> list[str]:
    """The outcome columns of an evaluation's rows (`vote`, `round1_majority`, `single_sample`, `gen1`, ...)."""
    from cory.maft.outcomes import KEYS

    return [key for key in rows[0] if key not in KEYS]


# ------------------------------------------------------------------------------------------------------ W&B
def wandb_last(value: Any) -> Any:
    """A W&B summary value as its last logged value: a plain value as it is; `{"last": v, ...}` (a metric declared
    with `summary="last"` or `"max,last"`) as v; another dict (a table, an image) as None."""
    if isinstance(value, Mapping):
        return value.get("last")
    return value


def wandb_summary(found: Any) -> dict:
    """A W&B run summary (a dict, or the public API's dict-like object) as {key: last value}."""
    if not isinstance(found, Mapping):
        found = {key: found[key] for key in found.keys()}
    return {str(key): wandb_last(value) for key, value in dict(found).items()}
