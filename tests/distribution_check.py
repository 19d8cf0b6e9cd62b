"""Exact-distribution checks on tiny vocabularies: the target's distribution of the first tokens, a chi-square test.

As in test_sampling_exact: the exact joint distribution of the first ``new_tokens`` tokens is
enumerated with full forwards of the target; samples are compared to it with Pearson's
chi-square at ``ALPHA`` (bins expected below ``MIN_EXPECTED`` pooled). A test using these shows
its power with a negative control: a slightly wrong rule, the same test, which must reject.
"""

from __future__ import annotations

import torch

from medusa_lite import SamplingSettings, generate, logits_to_probs

ALPHA = 1e-3
MIN_EXPECTED = 5.0


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


def chi_square_p_value(counts: dict, expected_probs: dict, n: int) -> float:
    """Pearson chi-square p-value, merging bins whose expected count is below MIN_EXPECTED."""
    observed, expected, pooled_observed, pooled_expected = [], [], 0.0, 0.0
    for outcome, p in expected_probs.items():
        if n * p < MIN_EXPECTED:
            pooled_observed += counts.get(outcome, 0)
            pooled_expected += n * p
        else:
            observed.append(counts.get(outcome, 0))
            expected.append(n * p)
    if pooled_expected > 0:
        observed.append(pooled_observed)
        expected.append(pooled_expected)
    assert sum(observed) == n, "a sample fell outside the enumerated outcomes"
    o, e = torch.tensor(observed, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    statistic = ((o - e) ** 2 / e).sum()
    degrees = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64), statistic / 2))


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
