"""Negative controls for the sampling tests: biased acceptance rules their statistic must reject.

``test_sampling_exact`` compares NUM_SAMPLES samples of the first NEW_TOKENS tokens with the
target's exact distribution (chi-square at ALPHA). These tests of the tests run speculative
sampling on the same tiny target, with a draft chain of the target's own likeliest tokens (a good
drafter, like trained heads) and three acceptance rules:

- the exact rule medusa-lite uses (sample t ~ p at each node, descend while t is the guess, the
  first t that is not is the bonus: a draw from the residual): a positive control, it must pass;
- a bonus token redrawn from the full distribution p after a rejected guess (instead of from p
  without the rejected guess): biased towards the guess, it must be rejected;
- Medusa's typical acceptance (accept a guess whose probability exceeds
  min(epsilon, delta * exp(-entropy)), epsilon 0.09 and delta 0.3 as in Medusa; the bonus from
  the full distribution): biased, it must be rejected.

Each rule is written as the distribution of one step's emitted tokens, so the harness both samples
it (seeded) and enumerates its exact output distribution, whose distance from the target's is
stated: the statistic rejects biases of that size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
from exact_distribution import (
    ALPHA,
    LOGIT_SCALE,
    NEW_TOKENS,
    NUM_SAMPLES,
    PROMPT,
    VOCAB,
    chi_square_p_value,
    exact_distribution,
)
from tiny_models import tiny_base_model

from medusa_lite import SamplingSettings, logits_to_probs

DRAFT_DEPTH = 3  # guesses per step, fewer where NEW_TOKENS leaves less room (as generate prunes the tree)
TYPICAL_EPSILON, TYPICAL_DELTA = 0.09, 0.3  # Medusa's posterior_threshold and posterior_alpha defaults
SETTINGS = SamplingSettings(1.0)

Prefix = tuple[int, ...]
Table = dict[Prefix, list[float]]
# (table, prefix, guesses) -> {tokens one step emits: probability}
StepRule = Callable[[Table, Prefix, Prefix], dict[Prefix, float]]


@pytest.fixture(scope="module")
def base():
    """The target of test_sampling_exact (same seed and sharpness)."""
    return tiny_base_model("llama", vocab_size=VOCAB, seed=42, logit_scale=LOGIT_SCALE)


@pytest.fixture(scope="module")
def table(base) -> Table:
    """The target's next-token distribution after PROMPT + every prefix shorter than NEW_TOKENS."""
    prefixes = [prefix for length in range(NEW_TOKENS) for prefix in itertools.product(range(VOCAB), repeat=length)]
    result = {}
    for prefix in prefixes:
        ids = torch.cat([PROMPT, torch.tensor([prefix], dtype=torch.long).view(1, -1)], dim=1)
        with torch.no_grad():
            result[prefix] = logits_to_probs(base(ids).logits[0, -1], SETTINGS).tolist()
    return result


def likeliest_chain(table: Table, prefix: Prefix) -> Prefix:
    """The draft: the target's likeliest token, DRAFT_DEPTH times (pruned so no guess passes NEW_TOKENS)."""
    depth = min(DRAFT_DEPTH, NEW_TOKENS - len(prefix) - 1)
    guesses: Prefix = ()
    for _ in range(depth):
        p = table[prefix + guesses]
        guesses += (max(range(VOCAB), key=p.__getitem__),)
    return guesses


def exact_step(table: Table, prefix: Prefix, guesses: Prefix) -> dict[Prefix, float]:
    """Sample t ~ p at each node; descend while t is the guess; the first other t is the bonus."""
    step, reach = {}, 1.0
    for i in range(len(guesses) + 1):
        p = table[prefix + guesses[:i]]
        for t in range(VOCAB):
            if i == len(guesses) or t != guesses[i]:
                step[guesses[:i] + (t,)] = reach * p[t]
        if i < len(guesses):
            reach *= p[guesses[i]]
    return step


def full_distribution_bonus_step(table: Table, prefix: Prefix, guesses: Prefix) -> dict[Prefix, float]:
    """Accept guess g with probability p(g); after a rejection redraw the bonus from the full p (biased)."""
    step: dict[Prefix, float] = {}
    reach = 1.0
    for i in range(len(guesses) + 1):
        p = table[prefix + guesses[:i]]
        reject = 1.0 if i == len(guesses) else 1.0 - p[guesses[i]]
        for t in range(VOCAB):
            block = guesses[:i] + (t,)
            step[block] = step.get(block, 0.0) + reach * reject * p[t]
        if i < len(guesses):
            reach *= p[guesses[i]]
    return step


def typical_acceptance_step(table: Table, prefix: Prefix, guesses: Prefix) -> dict[Prefix, float]:
    """Medusa's typical acceptance: keep a guess whose probability passes the entropy threshold; bonus from full p."""
    accepted = 0
    while accepted < len(guesses):
        p = table[prefix + guesses[:accepted]]
        entropy = -sum(q * math.log(q) for q in p if q > 0)
        if p[guesses[accepted]] <= min(TYPICAL_EPSILON, TYPICAL_DELTA * math.exp(-entropy)):
            break
        accepted += 1
    p = table[prefix + guesses[:accepted]]
    return {guesses[:accepted] + (t,): p[t] for t in range(VOCAB)}


def rule_distribution(table: Table, rule: StepRule) -> dict[Prefix, float]:
    """P(first NEW_TOKENS tokens) under ``rule``, by enumerating every step's outcomes."""
    done: dict[Prefix, float] = {}
    frontier = {(): 1.0}
    while frontier:
        prefix, probability = frontier.popitem()
        for block, q in rule(table, prefix, likeliest_chain(table, prefix)).items():
            longer = (prefix + block)[:NEW_TOKENS]
            target = done if len(longer) == NEW_TOKENS else frontier
            target[longer] = target.get(longer, 0.0) + probability * q
    return done


def sample_rule(table: Table, rule: StepRule, n: int, seed: int) -> dict[Prefix, int]:
    """``n`` seeded runs of speculative sampling under ``rule``: counts of their first NEW_TOKENS tokens."""
    generator = torch.Generator().manual_seed(seed)
    counts: dict[Prefix, int] = {}
    for _ in range(n):
        prefix: Prefix = ()
        while len(prefix) < NEW_TOKENS:
            step = rule(table, prefix, likeliest_chain(table, prefix))
            blocks = list(step)
            pick = int(
                torch.multinomial(torch.tensor([step[b] for b in blocks], dtype=torch.float64), 1, generator=generator)
            )
            prefix = (prefix + blocks[pick])[:NEW_TOKENS]
        counts[prefix] = counts.get(prefix, 0) + 1
    return counts


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def test_the_exact_rule_enumerates_to_the_target_and_passes(base, table):
    """Positive control: the harness is right, so a rejection below is the rule's bias, not the harness's."""
    exact = exact_distribution(base, SETTINGS)
    assert (
        total_variation(rule_distribution(table, exact_step), exact) < 1e-6
    )  # float32 forwards, one by one or batched
    counts = sample_rule(table, exact_step, NUM_SAMPLES, seed=1)
    assert chi_square_p_value(counts, exact, NUM_SAMPLES) > ALPHA


def test_the_draft_is_accepted_often(table):
    """The controls' precondition: guesses are accepted (else no rule's bias would show)."""
    first_step = exact_step(table, (), likeliest_chain(table, ()))
    accepted = sum(q * (len(block) - 1) for block, q in first_step.items())
    assert accepted > 0.5, f"the first step accepts {accepted:.2f} guesses on average"


@pytest.mark.parametrize(
    "rule", [full_distribution_bonus_step, typical_acceptance_step], ids=["bonus-from-full-p", "typical-acceptance"]
)
def test_a_biased_rule_is_rejected(base, table, rule):
    exact = exact_distribution(base, SETTINGS)
    biased = rule_distribution(table, rule)
    assert sum(biased.values()) == pytest.approx(1.0)
    distance = total_variation(biased, exact)
    assert distance > 0.01, (
        f"{rule.__name__} is not biased here (total variation {distance:.4f}): the control shows nothing"
    )
    p_value = chi_square_p_value(sample_rule(table, rule, NUM_SAMPLES, seed=2), exact, NUM_SAMPLES)
    assert p_value < ALPHA, (
        f"the sampling tests' statistic missed {rule.__name__} (total variation {distance:.3f}, p={p_value:.2e})"
    )
