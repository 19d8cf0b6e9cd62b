"""The target's next-token distribution and drawing from it.

``logits_to_probs`` applies temperature, then top-k, then top-p, in the order transformers'
``generate`` applies its warpers, so medusa-lite samples from exactly the distribution that
``model.generate(do_sample=True, temperature=..., top_k=..., top_p=...)`` samples from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from medusa_lite.errors import GenerationInputError
from medusa_lite.values import as_integer, as_real, describe


@dataclass(frozen=True)
class SamplingSettings:
    """``temperature == 0`` means greedy decoding (``top_k`` and ``top_p`` are then unused)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        # Numbers may come as numpy scalars or 0-d tensors (medusa_lite.values); stored as Python numbers.
        t = as_real(self.temperature)
        if t is None or not math.isfinite(t) or t < 0:
            raise GenerationInputError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {describe(self.temperature)}"
            )
        object.__setattr__(self, "temperature", t)
        if self.top_k is not None:
            k = as_integer(self.top_k)
            if k is None or k <= 0:
                raise GenerationInputError(f"top_k must be a positive integer or None, got {describe(self.top_k)}")
            object.__setattr__(self, "top_k", k)
        if self.top_p is not None:
            p = as_real(self.top_p)
            if p is None or math.isnan(p) or not 0 < p <= 1:
                raise GenerationInputError(f"top_p must be in (0, 1] or None, got {describe(self.top_p)}")
            object.__setattr__(self, "top_p", p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def divided_by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` up to a constant per row (which softmax, top-k and top-p ignore).

    The row's maximum is subtracted first, so every score is <= 0 and a tiny temperature can only
    send scores to -inf (probability 0), never to +inf (softmax NaN): as the temperature goes to 0
    the distribution goes to the argmax, ties shared. A temperature below float32's smallest
    number divides by 0 in float32; the row's best logits (0 after the shift) stay 0 then.
    """
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    return torch.where(shifted == 0, shifted, shifted / temperature)


def logits_to_probs(logits: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """Rows of logits [..., V] -> rows of probabilities after temperature, top-k and top-p."""
    scores = divided_by_temperature(logits.float(), settings.temperature)
    if settings.top_k is not None and settings.top_k < scores.shape[-1]:
        kth_best = torch.topk(scores, settings.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_best, -math.inf)
    if settings.top_p is not None and settings.top_p < 1:
        # As transformers' TopPLogitsWarper: drop the smallest tokens whose total mass is <= 1 - top_p,
        # always keeping the most likely token.
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - settings.top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, -math.inf)
    return scores.softmax(dim=-1)


def pick_tokens(
    logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token per row of logits [N, V]: the argmax (greedy) or an independent sample."""
    if settings.greedy:
        # In float32, like transformers' greedy search (also the faster argmax on CPU: docs/results.md).
        return logits.float().argmax(dim=-1)
    probs = logits_to_probs(logits, settings)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
