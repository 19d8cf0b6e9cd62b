"""tests/exact_distribution.py for any prompt, length and proposers: the target's exact distribution, samples.

The exact joint distribution of the first ``new_tokens`` tokens is enumerated with full forwards
of the target; ``sampled_counts`` draws them with ``generate`` and any of its arguments
(``proposers=...``); ``chi_square_p_value`` and ``ALPHA`` are tests/exact_distribution.py's. A test
using these shows its power with a negative control: a wrong rule, the same test, which must reject.
"""

from __future__ import annotations

import torch
from exact_distribution import ALPHA, chi_square_p_value  # noqa: F401  (re-exported for the proposer tests)

from medusa_lite import SamplingSettings, generate, logits_to_probs


def exact_distribution(
    base, prompt: torch.Tensor, new_tokens: int, settings: SamplingSettings
) -> dict[tuple[int, ...], float]:
    """P(first ``new_tokens`` tokens after ``prompt`` [1, L]) by enumerating every continuation."""
    vocab = base.config.vocab_size
    probs = {(): 1.0}
    for _ in range(new_tokens):
        prefixes = list(probs)
        continuations = torch.tensor(prefixes, dtype=torch.long).view(len(prefixes), -1)
        batch = torch.cat([prompt.repeat(len(prefixes), 1), continuations], dim=1)
        with torch.no_grad():
            next_probs = logits_to_probs(base(batch).logits[:, -1], settings)
        probs = {
            prefix + (t,): probs[prefix] * float(next_probs[i, t])
            for i, prefix in enumerate(prefixes)
            for t in range(vocab)
        }
    return probs


def sampled_counts(
    model, prompt: torch.Tensor, new_tokens: int, settings: SamplingSettings, n: int, seed: int, **generate_kwargs
) -> dict:
    """How often each continuation of ``new_tokens`` tokens came out of ``n`` calls of ``generate``."""
    generator = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        out = generate(
            model,
            prompt,
            new_tokens,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            generator=generator,
            eos_token_id=[],
            **generate_kwargs,
        )
        outcome = tuple(out.sequences[0, prompt.shape[1] :].tolist())
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts
