"""The run folder of a Multiagent Finetuning run: every finished stage is a file, so a restarted run skips it.

Layout (k is the fine-tuning round; round 0 evaluates the base agents, rounds 1..K fine-tune then evaluate):

    run_config.yaml                            the resolved config of the first start; a restart must match it
    state.json                                 the W&B run id, kept across restarts
    metrics.jsonl, samples.jsonl               one metrics row per round, a few debates per round (JsonlLogger)
    rounds/<k>/train_debate_r<r>.jsonl         the debate that labels round k's data, after debate round r
    rounds/<k>/data/<agent>.jsonl              each agent's fine-tuning conversations of round k
    rounds/<k>/weights/<agent>.safetensors     the agent's own weights after its fine-tuning in round k
    rounds/<k>/weights/<agent>.json            that fine-tuning's statistics (loss, examples)
    rounds/<k>/eval_debate_r<r>.jsonl          the held-out debate after round k, after debate round r
    rounds/<k>/row.json                        round k's logged metrics: the marker that round k is finished
    summary.json, curves.png                   written at the end

Every file is written under a temporary name and renamed into place, so a file that exists is complete. Debates are
seeded per stage, so a stage recomputed after a kill gives what the first start would have given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from cory.maft.debate import DebateRecord


def write_json_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_json_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class RunStore:
    """Files of one run folder (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)

    def round_dir(self, k: int) -> Path:
        return self.run_dir / "rounds" / str(k)

    def debate(self, k: int, split: str, debate_round: int, compute: Callable[[], list[DebateRecord]]):
        """The records after debate round `debate_round` of round k's `split` debate: read if saved, else computed."""
        path = self.round_dir(k) / f"{split}_debate_r{debate_round}.jsonl"
        if path.exists():
            return [DebateRecord.from_dict(row) for row in read_jsonl(path)]
        records = compute()
        write_jsonl(path, [record.to_dict() for record in records])
        return records

    def save_data(self, k: int, agent: str, chats: list) -> None:
        write_jsonl(self.round_dir(k) / "data" / f"{agent}.jsonl", [{"messages": chat} for chat in chats])

    def weights(self, k: int, agent: str) -> Path:
        return self.round_dir(k) / "weights" / f"{agent}.safetensors"

    def save_weights_stats(self, k: int, agent: str, stats: dict) -> None:
        write_json_atomic(self.weights(k, agent).with_suffix(".json"), json.dumps(stats))

    def weights_stats(self, k: int, agent: str) -> dict:
        path = self.weights(k, agent).with_suffix(".json")
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}

    def latest_weights(self, agents: list[str]) -> dict[str, Path]:
        """Each agent's weights from the last round that saved them (agents never fine-tuned are absent)."""
        latest: dict[str, Path] = {}
        for k in sorted(int(p.name) for p in (self.run_dir / "rounds").glob("*") if p.name.isdigit()):
            for agent in agents:
                if self.weights(k, agent).exists():
                    latest[agent] = self.weights(k, agent)
        return latest

    def row(self, k: int) -> dict | None:
        path = self.round_dir(k) / "row.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def save_row(self, k: int, row: dict) -> None:
        write_json_atomic(self.round_dir(k) / "row.json", json.dumps(row, allow_nan=True))

    def finished_rounds(self) -> int:
        """How many rounds, counted from 0, are finished."""
        k = 0
        while self.row(k) is not None:
            k += 1
        return k

    def state(self) -> dict:
        path = self.run_dir / "state.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}

    def save_state(self, state: dict) -> None:
        write_json_atomic(self.run_dir / "state.json", json.dumps(state))
