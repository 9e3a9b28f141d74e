"""Multiagent Finetuning (docs/method.md §7): debate, majority vote, per-agent SFT, and the stage cache.

- `debate.py`: the prompts of every debate turn, the seeded majority vote and the per-agent data selection (pure).
- `metrics.py`: accuracy ± standard error, consensus, disagreement and embedding diversity, with their definitions.
- `agents.py`: the 2N agents' weights (LoRA adapters over one frozen base, or full copies) and batched generation.
- `sft.py`: supervised fine-tuning of one agent with TRL's `SFTTrainer`, loss on the assistant tokens only.
- `store.py`: the run folder's per-stage artefacts, so a killed run continues where it stopped.
- `outcomes.py`: each held-out problem's outcomes (`eval_outcomes.jsonl`), written and read back (`cory-report paired`
  compares two evaluations with them).
- `plots.py`: the run's `curves.png` (accuracy ± s.e., per-agent accuracy, diversity per fine-tuning round).

The round itself, top to bottom, is `cory/algorithms/maft.py`: the `Algorithm` the trainer runs, one fine-tuning round
per iteration. This package never imports it (nor the trainer or the entry point): it is the learner layer below.
"""
