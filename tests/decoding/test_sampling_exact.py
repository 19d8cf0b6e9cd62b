"""Sampling is distribution-exact: medusa-lite's outputs follow the target's own distribution.

The statistical test: on a 3-token vocabulary the exact distribution of the first 4 generated
tokens (81 outcomes) is enumerated from the target with full forwards; 3,000 medusa-lite samples
are compared to it with a chi-square goodness-of-fit test at alpha = 1e-3 (bins with expected
count < 5 merged). False alarm rate per test: 0.1%. Power is shown, not assumed: the same test
applied to samples from a slightly wrong distribution (temperature off by 20%, the kind of bias
Medusa's "typical acceptance" introduces) must reject, see ``test_chi_square_has_power``.
"""

import itertools

import pytest
import torch
from exact_distribution import (
    ALPHA,
    LOGIT_SCALE,
    NEW_TOKENS,
    NUM_SAMPLES,
    PARTIAL_TREE,
    PROMPT,
    VOCAB,
    chi_square_p_value,
    exact_distribution,
    sample_counts,
)
from tiny_models import random_heads, tiny_base_model
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from medusa_lite import DynamicTree, MedusaModel, SamplingSettings, Tree, generate, logits_to_probs
from medusa_lite.decoding.generate import accepted_path
from medusa_lite.decoding.sampling import pick_tokens
from medusa_lite.proposers.datastore import Datastore

FULL_TREE = Tree.from_paths([p for depth in (1, 2) for p in itertools.product(range(VOCAB), repeat=depth)])
NO_TREE = Tree.from_paths([])
# Up to 6 nodes, each row 0.05 dearer, a node kept when its path is > 2.5% likely: shapes vary per step.
DYNAMIC_TREE = DynamicTree(6, tuple(1.0 + 0.05 * rows for rows in range(16)), tokens_per_cost=0.5)


@pytest.fixture(scope="module")
def model():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=42, logit_scale=LOGIT_SCALE)
    return MedusaModel(base, random_heads(base, num_heads=3, seed=43))


# Random documents: on 3 tokens every 2-gram occurs, so the datastore proposes whenever the text
# itself has no 2-token match (the first steps).
DATASTORE = Datastore.from_documents(
    [torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(seed)) for seed in range(8)], VOCAB
)


@pytest.mark.parametrize(
    "settings, tree, lookup_tokens, datastore",
    [
        (SamplingSettings(1.0), FULL_TREE, 0, None),
        (SamplingSettings(0.7), PARTIAL_TREE, 0, None),
        (SamplingSettings(0.7, top_k=2), PARTIAL_TREE, 0, None),
        (SamplingSettings(1.0, top_p=0.8), FULL_TREE, 0, None),
        # Prompt-lookup chains: alone, and grafted onto (partly merging with) the heads' tree.
        (SamplingSettings(1.0), NO_TREE, 3, None),
        (SamplingSettings(0.7), PARTIAL_TREE, 3, None),
        # Datastore chains where the text has no 2-token match, prompt lookup elsewhere.
        (SamplingSettings(0.7), PARTIAL_TREE, 3, DATASTORE),
        # A dynamic tree: each step's shape from the heads' confidence, with a lookup chain.
        (SamplingSettings(0.7), DYNAMIC_TREE, 3, None),
    ],
    ids=[
        "T1.0-full-tree",
        "T0.7-partial-tree",
        "T0.7-topk2",
        "T1.0-topp0.8",
        "T1.0-lookup-only",
        "T0.7-tree+lookup",
        "T0.7-tree+lookup+datastore",
        "T0.7-dynamic+lookup",
    ],
)
def test_medusa_sampling_matches_exact_target_distribution(model, settings, tree, lookup_tokens, datastore):
    exact = exact_distribution(model.base_model, settings)
    counts = sample_counts(
        model, settings, tree, NUM_SAMPLES, seed=1, lookup_tokens=lookup_tokens, datastore=datastore
    )
    p_value = chi_square_p_value(counts, exact, NUM_SAMPLES)
    assert p_value > ALPHA, f"medusa-lite samples differ from the target's distribution (p={p_value:.2e})"


def test_full_tree_accepts_every_guess(model):
    """With every token a child, every sample is accepted: the step emits depth + 1 tokens."""
    out = generate(
        model,
        PROMPT,
        NEW_TOKENS,
        temperature=1.0,
        tree=FULL_TREE,
        lookup_tokens=0,
        generator=torch.Generator().manual_seed(0),
        eos_token_id=[],
    )
    assert out.stats.tokens_per_step == [3] and out.stats.target_calls == 2


def test_chi_square_has_power(model):
    """The test rejects a distribution that is only slightly wrong: it is able to fail."""
    right = SamplingSettings(1.0)
    wrong = SamplingSettings(0.8)
    exact = exact_distribution(model.base_model, right)
    biased = exact_distribution(model.base_model, wrong)
    total_variation = 0.5 * sum(abs(exact[k] - biased[k]) for k in exact)
    assert total_variation < 0.1, "the alternative should be close, to show power"
    counts = sample_counts(model, wrong, FULL_TREE, NUM_SAMPLES, seed=2)
    assert chi_square_p_value(counts, exact, NUM_SAMPLES) < ALPHA


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, None, None), (0.7, 5, None), (1.3, None, 0.9), (0.5, 7, 0.6), (1.0, None, 0.05)],
)
def test_logits_to_probs_matches_transformers_warpers(temperature, top_k, top_p):
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(3)) * 3
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        warpers.append(TopPLogitsWarper(top_p))
    expected = warpers(None, logits.clone()).softmax(-1)
    torch.testing.assert_close(logits_to_probs(logits, SamplingSettings(temperature, top_k, top_p)), expected)


def test_accepted_path_follows_target_tokens():
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    # nodes: 0 root, 1 (0,), 2 (1,), 3 (0,0), 4 (0,1), 5 (1,0), 6 (0,0,0)
    candidates = torch.tensor([9, 10, 11, 12, 13, 14, 15])
    # root's target is 11 -> node 2; node 2's target 14 -> node 5; node 5 is a leaf.
    target = torch.tensor([11, 0, 14, 0, 0, 99, 0])
    assert accepted_path(tree, candidates, target).tolist() == [0, 2, 5]
    # root's target matches nothing: only the root.
    assert accepted_path(tree, candidates, torch.tensor([1, 2, 3, 4, 5, 6, 7])).tolist() == [0]
    # full depth: 10 -> 12 -> 15
    assert accepted_path(tree, candidates, torch.tensor([10, 12, 0, 15, 0, 0, 0])).tolist() == [0, 1, 3, 6]
    # a matching grandchild under a rejected child is not accepted
    assert accepted_path(tree, candidates, torch.tensor([11, 12, 0, 15, 0, 0, 0])).tolist() == [0, 2]


def test_one_step_acceptance_probability_matches_enumeration():
    """P(accept the depth-1 guess x) = p_root(x), exactly as the rule says, per child."""
    tree = Tree.from_paths([(0,), (1,)])
    candidates = torch.tensor([0, 3, 1])
    logits = torch.tensor([[0.5, 1.0, -1.0, 2.0]]).repeat(3, 1)
    settings = SamplingSettings(1.0)
    p = logits_to_probs(logits[0], settings)
    generator = torch.Generator().manual_seed(4)
    n = 20000
    outcomes = torch.zeros(3)
    for _ in range(n):
        path = accepted_path(tree, candidates, pick_tokens(logits, settings, generator))
        outcomes[path[-1]] += 1
    freq = outcomes / n
    expected = torch.tensor([1 - p[3] - p[1], p[3], p[1]])
    standard_error = (expected * (1 - expected) / n).sqrt()
    assert ((freq - expected).abs() < 5 * standard_error).all(), (freq, expected)
