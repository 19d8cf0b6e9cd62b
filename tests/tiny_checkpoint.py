"""A tiny random model, its tokenizer and fresh heads saved to disk, as the commands and ``load`` read them."""

from __future__ import annotations

from pathlib import Path

from tiny_models import tiny_base_model
from tiny_tokenizer import make_tiny_tokenizer

from medusa_lite import MedusaModel

NUM_HEADS = 3
TOPK_ACCURACY = [[0.6, 0.2, 0.1], [0.4, 0.15, 0.1], [0.3, 0.1, 0.05]]
# Spec-Bench-shaped questions (one with two turns) for the benchmark's tests.
QUESTIONS = [
    {
        "question_id": 1,
        "category": "writing",
        "turns": ["Write a short poem about the sea and the moon.", "Now shorter."],
    },
    {"question_id": 2, "category": "qa", "turns": ["What is the capital city of France?"]},
    {"question_id": 3, "category": "writing", "turns": ["Describe a busy market in the morning."]},
]


def save_tiny_checkpoint(folder: Path, *, training_summary: dict | None = None) -> tuple[Path, Path]:
    """A tiny llama + ChatML tokenizer in ``folder/model``, fresh (identity) heads in ``folder/heads``.

    Fresh heads guess the target's own next token, which a tiny random model often repeats, so
    some guesses are accepted and the acceptance path is exercised.
    """
    tokenizer = make_tiny_tokenizer()
    base = tiny_base_model(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, logit_scale=4.0)
    base.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    heads = MedusaModel.with_new_heads(base, NUM_HEADS).heads
    heads.config.training_summary = dict(training_summary or {})
    heads.save_pretrained(folder / "heads")
    return folder / "model", folder / "heads"
