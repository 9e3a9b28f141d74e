"""Hand-made test data shared by the IMDB and reward tests: template reviews and a tiny saved classifier."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from cory.models import byte_tokenizer

POSITIVE = ["wonderful", "brilliant", "moving", "delightful", "superb", "charming"]
NEGATIVE = ["awful", "boring", "dreadful", "clumsy", "tedious", "painful"]
SUBJECTS = ["acting", "script", "ending", "music", "pacing"]


def write_reviews_csv(path: Path, n_per_label: int = 30, short_imdb: int = 0) -> Path:
    """A CSV (text,label,source) of template reviews (> 200 chars) starting with a unique word `id{label}x{i}`,
    plus `short_imdb` imdb reviews of ≤ 200 chars and three rows from another source (both to be dropped)."""
    rows = []
    for label, words in ((1, POSITIVE), (0, NEGATIVE)):
        for i, (word, subject) in zip(range(n_per_label), itertools.cycle(itertools.product(words, SUBJECTS))):
            text = (
                f"id{label}x{i} This film was {word}. The {subject} felt {word} from start to finish, and I left "
                f"the cinema thinking how {word} it all was. Honestly the {subject} and the cast were {word}; "
                f"{word} is the only word for it, and I will be telling my friends about it for weeks."
            )
            rows.append({"text": text, "label": label, "source": "imdb"})
    rows += [{"text": f"short{i} This film was fine.", "label": 1, "source": "imdb"} for i in range(short_imdb)]
    rows += [{"text": rows[0]["text"].replace("id1x0", f"rt{i}"), "label": 1, "source": "rt"} for i in range(3)]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label", "source"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def save_tiny_classifier(folder: Path, id2label: dict[int, str]) -> None:
    """A randomly initialised 1-layer DistilBERT sequence classifier with the byte tokenizer, saved to disk."""
    tokenizer = byte_tokenizer()
    config = DistilBertConfig(
        vocab_size=len(tokenizer),
        dim=16,
        n_layers=1,
        n_heads=2,
        hidden_dim=32,
        max_position_embeddings=64,
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    DistilBertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
