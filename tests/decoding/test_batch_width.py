"""One width for a batch's step (medusa_lite.decoding.batch_width): chosen by what the rows' drafts are expected to
commit per cost, from the acceptance the batch has seen; no proposer asked when no width could pay; rows exact."""

from __future__ import annotations

import pytest
import torch
from batch_checks import PAD, assert_each_row_as_alone
from tiny_models import random_heads, tiny_base_model

import medusa_lite.decoding.batch
import medusa_lite.decoding.generate
from medusa_lite import DynamicTree, MedusaModel, generate
from medusa_lite.bench.measure import left_padded
from medusa_lite.decoding.batch_width import (
    PRIOR_ACCEPTED,
    PRIOR_REJECTED,
    AcceptanceRates,
    best_width,
    expected_tokens,
    likeliest_chain,
    node_kinds,
    sibling_ranks,
    speculation_may_pay,
)
from medusa_lite.trees.draft import draft_tree, graft
from medusa_lite.trees.dynamic_tree import BatchCosts
from medusa_lite.trees.tree import Tree

VOCAB = 96
NEW_TOKENS = 16
EVEN = PRIOR_ACCEPTED / (PRIOR_ACCEPTED + PRIOR_REJECTED)


def heads_and_lookup_draft():
    """Root 0; heads' nodes 1 (rank 0) and 2 (rank 1) at depth 1, 3 under 1; a lookup chain 4 -> 5 under the root."""
    heads = draft_tree(Tree.from_paths([(0,), (1,), (0, 0)]), torch.tensor([7, 10, 11, 12]), "heads")
    lookup = draft_tree(Tree.from_paths([(0,), (0, 0)]), torch.tensor([7, 20, 21]), "prompt_lookup")
    return graft(heads, lookup)


def test_every_node_has_a_kind_its_source_depth_and_rank_among_siblings():
    assert sibling_ranks([0, 0, 0, 1, 0, 4]) == [0, 0, 1, 0, 2, 0]
    draft = heads_and_lookup_draft()
    assert node_kinds(draft)[1:] == [
        ("heads", 1, 0),
        ("heads", 1, 1),
        ("heads", 2, 0),
        ("prompt_lookup", 1, 2),
        ("prompt_lookup", 2, 0),
    ]


def test_rates_count_only_nodes_whose_parent_was_accepted_and_fade_back_to_even_odds():
    draft = heads_and_lookup_draft()
    rates = AcceptanceRates()
    assert rates.rate(("heads", 1, 0)) == EVEN
    assert rates.path_probabilities(draft) == [1.0, EVEN, EVEN, EVEN * EVEN, EVEN, EVEN * EVEN]
    learned = rates
    for _ in range(20):
        learned = learned.after_step([(draft, torch.tensor([0, 1, 3]))])  # the heads' first chain, every time
    assert learned.rate(("heads", 1, 0)) > 0.9 and learned.rate(("heads", 2, 0)) > 0.9
    assert learned.rate(("heads", 1, 1)) < 0.1 and learned.rate(("prompt_lookup", 1, 2)) < 0.1
    assert ("prompt_lookup", 2, 0) not in learned.offered, "its parent was never accepted: nothing learnt of it"
    probabilities = learned.path_probabilities(draft)
    assert probabilities[3] == pytest.approx(probabilities[1] * learned.rate(("heads", 2, 0)))
    faded = learned
    for _ in range(200):
        faded = faded.after_step([])
    assert faded.rate(("heads", 1, 1)) == pytest.approx(EVEN, abs=0.01), "a kind not seen again drifts back"


def test_the_width_buys_the_most_expected_tokens_per_cost():
    sure, unsure = [1.0, 0.95, 0.9, 0.85], [1.0, 0.1, 0.01]
    expected = [expected_tokens(sure), expected_tokens(unsure)]
    assert expected[0] == pytest.approx([1.0, 1.95, 2.85, 3.7])
    assert best_width(expected, lambda width: 1.0) == 4, "free rows: every row as wide as it goes"
    assert best_width(expected, lambda width: 1.0 + 10 * (width - 1)) == 1, "dear rows: a plain step"
    assert best_width(expected, lambda width: 1.0 + 0.3 * (width - 1)) == 4
    assert best_width(expected, lambda width: 1.0 + 10 * (width - 1), least=3) == 3, "a row with side rows sets it"
    assert best_width([[1.0], [1.0]], lambda width: 1.0) == 1, "the narrowest of equals"


def test_proposers_are_asked_only_while_some_width_could_pay():
    cheap, dear = (lambda width: 1.0 + 0.1 * (width - 1)), (lambda width: 1.0 + 10.0 * (width - 1))
    rates = AcceptanceRates()
    assert likeliest_chain(rates, 2) == [1.0, EVEN, EVEN * EVEN]
    assert speculation_may_pay(rates, cheap, 0.05, 6) and not speculation_may_pay(rates, dear, 0.05, 6)
    assert not speculation_may_pay(rates, cheap, 10.0, 6), "proposals dearer than anything they could buy"
    draft = heads_and_lookup_draft()
    losing = rates
    for _ in range(30):
        losing = losing.after_step([(draft, torch.tensor([0]))])  # nothing ever accepted
    assert not speculation_may_pay(losing, cheap, 0.05, 6)
    waited = losing
    while not speculation_may_pay(waited, cheap, 0.05, 6):
        waited = waited.after_step([])
    assert losing != waited, "the rows are asked again once the rates have faded"


# -- in a batch -----------------------------------------------------------------------------------------------------
def repetitive_prompts() -> list[torch.Tensor]:
    """Prompts that repeat themselves, so prompt lookup finds a chain for every row every step."""
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (length,), generator=generator).repeat(3) for length in (4, 6, 3, 5)]


def priced_by(monkeypatch, row_cost, proposal_cost: float = 0.0) -> None:
    def costs_for(model, batch_size):
        return lambda max_rows: BatchCosts(batch_size, tuple(row_cost(r) for r in range(1, max_rows + 1)), 1.0)

    monkeypatch.setattr(medusa_lite.decoding.generate, "batch_costs_for", costs_for)


def counted_proposals(monkeypatch) -> list[int]:
    asked: list[int] = []
    propose = medusa_lite.decoding.batch.propose_draft

    def counting(*args):
        asked.append(1)
        return propose(*args)

    monkeypatch.setattr(medusa_lite.decoding.batch, "propose_draft", counting)
    return asked


@pytest.mark.parametrize("lookups", [True, False])
def test_dear_rows_make_plain_steps_with_no_proposer_asked_and_rows_stay_exact(lookups, monkeypatch):
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    rows = repetitive_prompts()
    ids, mask = left_padded(rows, PAD)
    settings = dict(attention_mask=mask, tree=DynamicTree(6, (1.0,) * 16), datastore=False, eos_token_id=[])
    settings["lookup_tokens"] = 6 if lookups else 0
    asked = counted_proposals(monkeypatch)

    priced_by(monkeypatch, lambda rows: 1.0 + 10.0 * (rows - 1))
    dear = generate(model, ids, NEW_TOKENS, **settings)
    assert_each_row_as_alone(dear, base, rows, NEW_TOKENS, [])
    assert dear.stats.verified_rows == dear.stats.steps, "no width pays: every step verifies the roots alone"
    assert not asked, "no width could pay, yet the rows' proposers were asked"
    assert dear.stats.plain_steps == dear.stats.steps

    priced_by(monkeypatch, lambda rows: 1.0)
    free = generate(model, ids, NEW_TOKENS, **settings)
    assert_each_row_as_alone(free, base, rows, NEW_TOKENS, [])
    assert asked and free.stats.verified_rows > 2 * free.stats.steps, "free rows: the drafts verified whole"
    if lookups:
        assert free.stats.lookup_steps > 0
