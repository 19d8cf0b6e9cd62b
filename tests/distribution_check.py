"""tests/exact_distribution.py for any prompt, length and proposers: the target's exact distribution, samples.

The exact joint distribution of the first ``new_tokens`` tokens is enumerated with full forwards
of the target; ``sampled_counts`` draws them with ``generate`` and any of its arguments
(``proposers=...``); ``chi_square_p_value`` and ``ALPHA`` are tests/exact_distribution.py's. A test
using these shows its power with a negative control: a wrong rule, the same test, which must reject.
"""

from __future__ import annotations

from collections import Counter

from exact_distribution import (  # noqa: F401  (ALPHA, chi_square_p_value re-exported for the proposer tests)
    ALPHA,
    chi_square_p_value,
    continuation,
    sampled_outputs,
)
from exact_distribution import enumerated_distribution as exact_distribution  # noqa: F401  (re-exported)


def sampled_counts(model, prompt, new_tokens: int, settings, n: int, seed: int, **generate_kwargs) -> dict:
    """How often each continuation of ``new_tokens`` tokens came out of ``n`` calls of ``generate``."""
    return Counter(
        continuation(out, prompt)
        for out in sampled_outputs(model, prompt, new_tokens, settings, n, seed, **generate_kwargs)
    )
