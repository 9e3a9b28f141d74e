"""Supervised fine-tuning of one agent with TRL's `SFTTrainer`, loss on the assistant tokens only (docs/method.md §7).

Conversations are tokenised here with the tokenizer's own chat template, the very template generation renders its
prompts with (`cory.maft.agents`), so training and sampling see the same text by construction. The assistant mask
covers every assistant turn, its content and the end-of-turn tokens the template closes it with (so the model learns
to stop): the one answer of a generation agent's example, every answer of a critic's multi-turn conversation.

Why pre-tokenised data: TRL 1.16's `assistant_only_loss=True` needs a chat template with `{% generation %}` markers
and patches only the templates it knows (SmolLM2's is not among them). `SFTTrainer` also accepts `input_ids` plus an
`assistant_masks` column and then sets the labels outside the mask to -100, which is the same loss for any template
that renders a conversation's prefixes as prefixes (checked for every example).

`SFTTrainer` trains whatever `requires_grad` says: the active LoRA adapter of a `PeftModel` (PEFT freezes the base and
the other adapters) or every weight of a full copy. TRL is imported lazily: it costs seconds.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from torch import nn
from transformers import PreTrainedTokenizerBase

from cory.errors import ConfigError
from cory.maft.debate import Chat


@dataclass(frozen=True)
class SFTSettings:
    """The `algorithm.sft` block. The paper's numbers (2 epochs, lr ≈ 1e-4 for LoRA, max length 2048) live in YAML."""

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "epochs": "(0, inf)",
        "learning_rate": "(0, inf)",
        "max_length": "[1, inf)",
        "batch_size": "[1, inf)",
        "gradient_accumulation_steps": "[1, inf)",
        "warmup": "[0, 1)",
        "weight_decay": "[0, inf)",
    }

    epochs: float
    learning_rate: float
    max_length: int
    batch_size: int
    gradient_accumulation_steps: int
    lr_scheduler: str
    warmup: float  # fraction of the steps with a linear warm-up
    weight_decay: float
    gradient_checkpointing: bool

    def __post_init__(self) -> None:
        checks = {
            "epochs": self.epochs > 0,
            "learning_rate": self.learning_rate > 0,
            "max_length": self.max_length >= 1,
            "batch_size": self.batch_size >= 1,
            "gradient_accumulation_steps": self.gradient_accumulation_steps >= 1,
            "warmup": 0 <= self.warmup < 1,
            "weight_decay": self.weight_decay >= 0,
        }
        for key, ok in checks.items():
            if not ok:
                raise ConfigError(f"algorithm.sft.{key}={getattr(self, key)}: out of range")
        from transformers.trainer_utils import SchedulerType

        allowed = [kind.value for kind in SchedulerType]
        if self.lr_scheduler not in allowed:  # else the trainer refuses it mid-round, after a whole debate
            raise ConfigError(f"algorithm.sft.lr_scheduler={self.lr_scheduler!r}: allowed {', '.join(allowed)}")


def render(tokenizer: PreTrainedTokenizerBase, chat: Chat, add_generation_prompt: bool) -> str:
    """The chat as text under the tokenizer's chat template; generation and training both go through here."""
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of rendered text: the template writes any special tokens itself, so none are added."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_tokens(tokenizer: PreTrainedTokenizerBase, chat: Chat) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and its 0/1 assistant mask (same length).

    Assistant turn i spans from the end of `render(chat[:i], add_generation_prompt=True)`, the prompt generation
    answered, to the end of `render(chat[:i + 1])`.

    Raises:
        ValueError: the template does not render a prefix of the conversation as a token prefix of the whole.
    """
    ids = encode(tokenizer, render(tokenizer, chat, add_generation_prompt=False))
    mask = [0] * len(ids)
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        start = encode(tokenizer, render(tokenizer, chat[:i], add_generation_prompt=True))
        end = encode(tokenizer, render(tokenizer, chat[: i + 1], add_generation_prompt=False))
        if ids[: len(start)] != start or ids[: len(end)] != end:
            raise ValueError(
                "the chat template does not render the start of a conversation as a prefix of the whole, so the "
                "assistant tokens cannot be located; set algorithm.agent_models.chat_template to one that does"
            )
        mask[len(start) : len(end)] = [1] * (len(end) - len(start))
    return ids, mask


def sft_trainer(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    chats: list[Chat],
    settings: SFTSettings,
    *,
    seed: int,
    output_dir: str,
    use_cpu: bool,
    bf16: bool,
):
    """TRL's `SFTTrainer` over `chats`, tokenised here with their assistant masks (labels are -100 elsewhere).

    `seed` fixes the data order and dropout, so a restarted run retrains an agent exactly as the first start did.
    `use_cpu`/`bf16` follow the hardware group (TRL's bf16 default fails on a CPU). Nothing is saved in
    `output_dir` (no checkpoints, no reports); the caller saves the weights it needs.
    """
    import datasets
    from trl import SFTConfig, SFTTrainer

    rows = [dict(zip(("input_ids", "assistant_masks"), chat_tokens(tokenizer, chat))) for chat in chats]
    args = SFTConfig(
        output_dir=output_dir,
        num_train_epochs=settings.epochs,
        learning_rate=settings.learning_rate,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        max_length=settings.max_length,
        lr_scheduler_type=settings.lr_scheduler,
        warmup_steps=settings.warmup,
        weight_decay=settings.weight_decay,
        gradient_checkpointing=settings.gradient_checkpointing,
        seed=seed,
        data_seed=seed,
        use_cpu=use_cpu,
        bf16=bf16,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    bars_were_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # dataset preparation would draw four bars per agent
    try:
        return SFTTrainer(
            model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer
        )
    finally:
        if not bars_were_off:
            datasets.enable_progress_bars()


def train_sft(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    chats: list[Chat],
    settings: SFTSettings,
    *,
    seed: int,
    use_cpu: bool,
    bf16: bool,
) -> dict[str, float]:
    """Fine-tune `model`'s trainable parameters on `chats`; returns the mean loss and the data's size."""
    from transformers import PrinterCallback

    with tempfile.TemporaryDirectory() as scratch:
        trainer = sft_trainer(
            model, tokenizer, chats, settings, seed=seed, output_dir=scratch, use_cpu=use_cpu, bf16=bf16
        )
        trainer.remove_callback(PrinterCallback)  # it prints the final statistics; they are returned instead
        result = trainer.train()
    model.eval()
    return {
        "loss": float(result.training_loss),
        "examples": float(len(chats)),
        "assistant_tokens": float(sum(label != -100 for row in trainer.train_dataset for label in row["labels"])),
    }
