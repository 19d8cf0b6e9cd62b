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


@dataclass(frozen=True)
class SamplingSettings:
    """``temperature == 0`` means greedy decoding (``top_k`` and ``top_p`` are then unused)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or math.isnan(t) or math.isinf(t) or t < 0:
            raise GenerationInputError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k <= 0):
            raise GenerationInputError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or math.isnan(p) or not 0 < p <= 1):
            raise GenerationInputError(f"top_p must be in (0, 1] or None, got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """Rows of logits [..., V] -> rows of probabilities after temperature, top-k and top-p."""
    scores = logits.float() / settings.temperature
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


def pick_tokens(logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of logits [N, V]: the argmax (greedy) or an independent sample."""
    if settings.greedy:
        # In float32, like transformers' greedy search (also ~2x faster than a bf16 argmax on CPU).
        return logits.float().argmax(dim=-1)
    probs = logits_to_probs(logits, settings)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
