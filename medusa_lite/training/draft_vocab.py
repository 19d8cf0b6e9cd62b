"""Choosing a draft vocabulary: the D tokens the heads may guess, the most frequent response tokens.

The heads only guess; the target verifies every token. So restricting their guesses to the D
most frequent tokens of the responses they are trained on loses only the rare tokens (which the
heads would seldom guess right anyway) and makes their projection V/D times cheaper (EAGLE-3
does the same with its draft vocabulary).

The choice is deterministic: tokens are ranked by how often they are a response token in the
training split, ties broken by the smaller id. When the data hold fewer than D distinct tokens,
the never-seen tokens fill up the remaining places in id order, so the vocabulary always has the
D entries the config asks for (those fillers are never right, and cost only their rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from medusa_lite.training.data import Sample
from medusa_lite.training.errors import TrainingDataError


@dataclass
class DraftVocab:
    """The chosen token ids (most frequent first) and the share of response tokens they cover."""

    token_ids: torch.Tensor  # [D] int64
    train_coverage: float  # fraction of the training split's response tokens inside the vocabulary
    eval_coverage: (
        float | None
    )  # the same for the held-out split (None without one): an upper bound on the heads' accuracy


def response_token_counts(samples: list[Sample], vocab_size: int) -> torch.Tensor:
    """[V] how often each token id is a response (target) token in ``samples``."""
    tokens = [s.input_ids[s.loss_mask] for s in samples]
    ids = torch.cat(tokens) if tokens else torch.zeros(0, dtype=torch.long)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise TrainingDataError(
            f"the data hold token id {int(ids.max())}, outside the model's vocabulary of {vocab_size} "
            "tokens: the tokenizer does not match the model"
        )
    return torch.bincount(ids, minlength=vocab_size)


def most_frequent_tokens(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` ids with the highest counts, most frequent first, ties (and unseen ids) by id."""
    if not 1 <= size <= counts.numel():
        raise ValueError(f"a draft vocabulary of {size} tokens cannot be chosen from a vocabulary of {counts.numel()}")
    order = torch.sort(counts, descending=True, stable=True).indices  # stable: equal counts keep id order
    return order[:size].clone()


def coverage(counts: torch.Tensor, token_ids: torch.Tensor) -> float:
    """Fraction of the counted tokens that are among ``token_ids`` (1.0 when nothing was counted)."""
    total = int(counts.sum())
    return float(counts[token_ids].sum()) / total if total else 1.0


def measure_draft_vocab(
    token_ids: torch.Tensor, train: list[Sample], held_out: list[Sample], vocab_size: int
) -> DraftVocab:
    """``token_ids`` with their coverage of the training and held-out response tokens."""
    token_ids = token_ids.cpu()
    eval_coverage = coverage(response_token_counts(held_out, vocab_size), token_ids) if held_out else None
    return DraftVocab(
        token_ids=token_ids,
        train_coverage=coverage(response_token_counts(train, vocab_size), token_ids),
        eval_coverage=eval_coverage,
    )


def choose_draft_vocab(train: list[Sample], held_out: list[Sample], vocab_size: int, size: int) -> DraftVocab:
    """The draft vocabulary of ``size`` tokens for training on ``train`` (``held_out`` only measures coverage)."""
    token_ids = most_frequent_tokens(response_token_counts(train, vocab_size), size)
    return measure_draft_vocab(token_ids, train, held_out, vocab_size)
