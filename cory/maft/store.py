"""MAFT's stage cache in the run folder: every finished stage is a file, so a resumed run recomputes none of it.

The trainer owns the run folder (config, metrics.jsonl, samples.jsonl, checkpoints, summary.json, curves.png), the
held-out evaluations add eval_outcomes.jsonl (`cory.maft.outcomes`), and the algorithm keeps its stages under
`rounds/` (k is the fine-tuning round; round 0 is the base agents' evaluation):

    rounds/<k>/train_debate_r<r>.jsonl         the debate that labels round k's data, after debate round r
    rounds/<k>/data/<agent>.jsonl              each agent's fine-tuning conversations of round k
    rounds/<k>/weights/<agent>.safetensors     the agent's own weights after its fine-tuning in round k
    rounds/<k>/weights/<agent>.json            that fine-tuning's statistics (loss, examples)
    rounds/<k>/eval_debate_r<r>.jsonl          the held-out debate after round k, after debate round r

Every file is written under a temporary name and renamed into place, so a file that exists is complete. Every stage
is seeded by (seed, stage) and starts from weights that a checkpoint or an earlier cached stage fixes, so a file
left by a killed start holds exactly what recomputing it would give: a run resumed from its last checkpoint reads
the stages it finished after that checkpoint back instead of redoing them, and continues as an uninterrupted run.
A stage file that does not read back whole (cut, edited, a debate with a wrong number of problems, non-finite
weights) is said in one line naming it, removed and computed again: seeded, the stage gives what the file held.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from cory import runtime
from cory.errors import writing
from cory.maft.debate import DebateRecord


def write_json_atomic(path: Path, text: str) -> None:
    with writing(path):  # a failed flush names no file: name the stage file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_json_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _discard(path: Path, err: BaseException) -> None:
    """A stage file that does not read back whole (a disk error, an edit): said in one line and removed, so that
    its stage is computed again, which gives what it held (every stage is seeded by its own key)."""
    first = (str(err).strip().splitlines() or [""])[0]
    runtime.say(f"[maft] {path} is damaged ({type(err).__name__}: {first}); computing its stage again")
    path.unlink(missing_ok=True)


class RunStore:
    """The stage files of one run folder (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)

    def round_dir(self, k: int) -> Path:
        return self.run_dir / "rounds" / str(k)

    def debate(
        self, k: int, split: str, debate_round: int, problems: int, compute: Callable[[], list[DebateRecord]]
    ) -> list[DebateRecord]:
        """The records after debate round `debate_round` of round k's `split` debate on `problems` problems: read if
        saved (and whole), else computed."""
        path = self.round_dir(k) / f"{split}_debate_r{debate_round}.jsonl"
        if path.exists():
            try:
                records = [DebateRecord.from_dict(row) for row in read_jsonl(path)]
                if len(records) != problems:
                    raise ValueError(f"{len(records)} records for {problems} problems")
                return records
            except (ValueError, KeyError, TypeError, AttributeError) as err:  # damaged or edited after it was written
                _discard(path, err)
        records = compute()
        write_jsonl(path, [record.to_dict() for record in records])
        return records

    def save_data(self, k: int, agent: str, chats: list) -> None:
        """Agent `agent`'s fine-tuning conversations of round k (a file already there holds the same ones)."""
        path = self.round_dir(k) / "data" / f"{agent}.jsonl"
        if not path.exists():
            write_jsonl(path, [{"messages": chat} for chat in chats])

    def weights(self, k: int, agent: str) -> Path:
        return self.round_dir(k) / "weights" / f"{agent}.safetensors"

    def saved_weights(self, k: int, agent: str) -> Path | None:
        """The agent's saved weights of round k when they are whole (they parse, every tensor is finite, and their
        statistics file reads); None when there are none. Damaged ones are said, removed, and computed again."""
        path = self.weights(k, agent)
        if not path.exists():
            return None
        try:
            tensors = load_file(str(path))
            if not all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point()):
                raise ValueError("non-finite weights")
            json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        except Exception as err:  # noqa: BLE001 - safetensors, JSON or a missing file: the stage is redone
            _discard(path, err)
            path.with_suffix(".json").unlink(missing_ok=True)
            return None
        return path

    def save_weights_stats(self, k: int, agent: str, stats: dict) -> None:
        write_json_atomic(self.weights(k, agent).with_suffix(".json"), json.dumps(stats))

    def weights_stats(self, k: int, agent: str) -> dict:
        path = self.weights(k, agent).with_suffix(".json")
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
