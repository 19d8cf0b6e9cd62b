"""A batch's step costs (medusa_lite.decoding.batch_costs): measured once per batch size on the machine that decodes,
cached, and what prices every row's tree in a batch (heads and drafters alike), exactness unchanged."""

from __future__ import annotations

import json
import time

import pytest
import torch
from artifact_fixtures import fresh_kind_folder
from batch_checks import PAD, assert_each_row_as_alone
from concurrent_calls import results_of_concurrent_calls
from tiny_models import random_heads, tiny_base_model

import medusa_lite.decoding.batch_costs as batch_costs
import medusa_lite.decoding.generate
from medusa_lite import DynamicTree, MedusaModel, generate, load
from medusa_lite.bench.measure import left_padded
from medusa_lite.drafters.drafting import DraftingProposer
from medusa_lite.errors import TreeError
from medusa_lite.proposers.base import StepLimits
from medusa_lite.trees.dynamic_tree import BatchCosts

VOCAB = 96
NEW_TOKENS = 16
LENGTHS = (5, 9, 2, 7)
# One sequence's costs: every row nearly free, so alone a row's tree would take every node it may.
FREE_ROWS = DynamicTree(6, (1.0,) * 16, tokens_per_cost=0.01)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_LITE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def tiny_model() -> MedusaModel:
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    return MedusaModel(base, random_heads(base, num_heads=3, seed=4)).eval()


def prompts(seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (length,), generator=generator) for length in LENGTHS]


def priced_by(monkeypatch, row_cost) -> list[tuple[int, int]]:
    """Make every batch's measured costs ``row_cost(rows)``; returns the (batch size, max rows) of each measurement."""
    asked: list[tuple[int, int]] = []

    def costs_for(model, batch_size):
        def measured(max_rows: int) -> BatchCosts:
            asked.append((batch_size, max_rows))
            return BatchCosts(batch_size, tuple(row_cost(rows) for rows in range(1, max_rows + 1)), 1.0)

        return measured

    monkeypatch.setattr(medusa_lite.decoding.generate, "batch_costs_for", costs_for)
    return asked


def test_measured_costs_cover_the_rows_asked_and_are_cached_per_batch_size(cache, monkeypatch):
    model = tiny_model()
    messages: list[str] = []
    measured = batch_costs.batch_step_costs(model, 4, 10, announce=messages.append)
    assert measured.batch_size == 4 and len(measured.row_costs) == 10
    assert all(cost > 0 for cost in measured.row_costs) and measured.plain_step_ratio > 0
    assert list(measured.row_costs[1:]) == sorted(measured.row_costs[1:]), "more rows never priced cheaper"
    path = batch_costs.cost_cache_path(batch_costs.batch_cost_key(model, 4))
    assert json.loads(path.read_text())["row_costs"] == list(measured.row_costs)
    assert len(messages) == 1 and "batches of 4" in messages[0] and str(path) in messages[0]

    monkeypatch.setattr(
        batch_costs, "measure_batch_costs", lambda *args, **kwargs: pytest.fail("measured again despite the cache")
    )
    assert batch_costs.batch_step_costs(model, 4, 10, announce=messages.append) == measured
    assert batch_costs.batch_step_costs(model, 4, 6, announce=messages.append) == measured  # fewer rows: served
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        batch_costs.batch_step_costs(model, 2, 10)  # another batch size is measured on its own


def test_a_generation_measures_or_reads_its_batch_costs_once(monkeypatch):
    calls = []
    monkeypatch.setattr(batch_costs, "batch_step_costs", lambda *args: calls.append(args) or BatchCosts(4, (1.0,), 1))
    costs_for = batch_costs.batch_costs_for("the model", 4)
    assert costs_for(10) == costs_for(10) and calls == [("the model", 4, 10)]


def test_a_stale_or_foreign_batch_cache_is_not_read(cache):
    model = tiny_model()
    key = batch_costs.batch_cost_key(model, 2)
    path = batch_costs.cost_cache_path(key)
    path.parent.mkdir(parents=True)
    good = {"format": batch_costs.BATCH_COSTS_FORMAT, "batch_size": 2, "row_costs": [1.0] * 10}
    good |= {"plain_step_ratio": 0.5, "key": key}
    for broken in ("{not json", json.dumps({**good, "format": "old"}), json.dumps({**good, "key": {"cpu": "x"}})):
        path.write_text(broken)
        assert batch_costs.read_cached_batch_costs(path, key, 10) is None
    path.write_text(json.dumps(good))
    assert batch_costs.read_cached_batch_costs(path, key, 10) == BatchCosts(2, (1.0,) * 10, 0.5)
    assert batch_costs.read_cached_batch_costs(path, key, 11) is None, "fewer rows than asked"


def test_a_forward_times_no_more_rows_than_the_limit():
    limit = batch_costs.MAX_CALIBRATION_BATCH_ROWS
    assert batch_costs.timed_row_counts(1, 20)[-1] == 20
    for batch in (2, 16, 64, 200):
        sizes = batch_costs.timed_row_counts(batch, 20)
        assert sizes[:2] == [1, 2] and all(size <= 2 or size * batch <= limit for size in sizes), (batch, sizes)


def test_measured_batch_costs_price_the_policy_as_they_are():
    policy = DynamicTree(8, (1.0, 0.4, 0.45, 0.5), tokens_per_cost=2.0, proposal_cost=0.03)
    measured = BatchCosts(4, (1.05, 1.2, 1.4, 1.7), plain_step_ratio=0.5)
    priced = policy.for_batch(4, measured)
    assert priced.row_costs == measured.row_costs and (priced.max_nodes, priced.tokens_per_cost) == (8, 2.0)
    assert priced.proposal_cost == pytest.approx(0.03 * 4 / 0.5), "four proposals, in plain batched steps"
    assert policy.for_batch(1, None) is policy
    with pytest.raises(TreeError, match="batches of 4, not 2"):
        policy.for_batch(2, measured)
    asked = []
    limits = StepLimits(None, None, batch_size=4, batch_costs=lambda rows: asked.append(rows) or measured)
    assert limits.batch_priced(policy) == priced and asked == [len(policy.row_costs)]
    assert StepLimits(None, None, batch_costs=pytest.fail).batch_priced(policy) is policy, "one sequence: as is"


def test_the_batch_costs_size_every_rows_tree_and_rows_stay_exact(monkeypatch):
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    rows = prompts()
    ids, mask = left_padded(rows, PAD)
    settings = dict(attention_mask=mask, tree=FREE_ROWS, lookup_tokens=0, datastore=False, eos_token_id=[])

    asked = priced_by(monkeypatch, lambda rows: 1.0)  # rows free in a batch too: trees as large as allowed
    cheap = generate(model, ids, NEW_TOKENS, **settings)
    assert_each_row_as_alone(cheap, base, rows, NEW_TOKENS, [])
    assert cheap.stats.verified_rows > 3 * cheap.stats.steps, "free rows should buy large trees"
    assert set(asked) == {(len(rows), len(FREE_ROWS.row_costs))}, "priced for the batch, up to the policy's rows"

    priced_by(monkeypatch, lambda rows: 1.0 + 10.0 * (rows - 1))  # every extra row costs ten plain steps
    dear = generate(model, ids, NEW_TOKENS, **settings)
    assert_each_row_as_alone(dear, base, rows, NEW_TOKENS, [])
    assert dear.stats.verified_rows == dear.stats.steps, "no guess pays: every row's step is the root alone"


@pytest.mark.parametrize("kind", ["hydra", "sequential"])
def test_a_drafter_is_priced_for_the_batch(kind, tmp_path, monkeypatch):
    target = tiny_base_model("qwen2", vocab_size=VOCAB, seed=3)
    target.save_pretrained(tmp_path / "target")
    model, _ = load(tmp_path / "target", heads=fresh_kind_folder(kind, target, tmp_path / kind), datastore=False)
    rows = prompts(seed=2)
    ids, mask = left_padded(rows, PAD)
    asked = priced_by(monkeypatch, lambda rows: 1.0 + 10.0 * (rows - 1))
    (drafter,) = [proposer for proposer in model.proposers if isinstance(proposer, DraftingProposer)]
    out = generate(model, ids, NEW_TOKENS, attention_mask=mask, proposers=[drafter], eos_token_id=[])
    assert_each_row_as_alone(out, target, rows, NEW_TOKENS, [])
    assert asked and all(batch == len(rows) for batch, _ in asked), "the drafter was not priced for the batch"
    assert out.stats.verified_rows == out.stats.steps, "at ten plain steps a row, the drafter should add none"


def test_requests_arriving_together_wait_for_one_measurement(cache, monkeypatch):
    """Four threads asking for one batch size's missing costs at once: one measures (the others timing the machine
    while it is loaded would measure the load), the rest read what it cached."""
    model = tiny_model()
    key = batch_costs.batch_cost_key(model, 4)
    measurements: list[int] = []

    def slow_measurement(model, batch_size, max_rows):
        measurements.append(batch_size)
        time.sleep(0.3)  # long enough for every thread to find the entry missing
        costs = BatchCosts(batch_size, tuple(1.0 + 0.1 * r for r in range(max_rows)), 1.2)
        return batch_costs.MeasuredBatchCosts(costs, 10.0, key, 0.3)

    monkeypatch.setattr(batch_costs, "measure_batch_costs", slow_measurement)
    results = results_of_concurrent_calls(lambda: batch_costs.batch_step_costs(model, 4, 8, announce=print), threads=4)
    assert measurements == [4], f"measured {len(measurements)} times"
    assert len(results) == 4 and all(result == results[0] for result in results)
