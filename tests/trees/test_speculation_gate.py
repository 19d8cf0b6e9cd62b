"""Never slower than plain decoding: the per-prompt fall-back rule (:class:`SpeculationGate`) and
the loop's plain steps, priced by the dynamic tree's step costs."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import OracleMedusaModel, plain_greedy, random_heads, tiny_base_model

from medusa_lite import DynamicTree, MedusaModel, generate
from medusa_lite.trees.dynamic_tree import (
    FIRST_PAUSE_STEPS,
    MAX_PAUSE_STEPS,
    PRIOR_GAIN,
    RECENT_STEP_WEIGHT,
    SpeculationGate,
)

# Steep costs: every verified row costs half a plain step more, and asking the heads a fifth of one.
STEEP = DynamicTree(8, tuple(1.0 + 0.5 * r for r in range(14)), proposal_cost=0.2)
GENTLE = DynamicTree(8, (1.0, 1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12), proposal_cost=0.01)


def test_paying_steps_keep_speculating():
    gate = SpeculationGate()
    for _ in range(300):
        gate = gate.after_speculative_step(tokens=2, cost=1.2)
        assert gate.speculates
    assert gate.gain == pytest.approx(0.8, abs=1e-2)  # the average of tokens - cost


def test_losing_steps_pause_then_try_again_with_doubling_pauses():
    gate = SpeculationGate()
    losing_steps = 0
    while gate.speculates:
        gate = gate.after_speculative_step(tokens=1, cost=1.3)
        losing_steps += 1
    # From the prior gain, each losing step moves the average a RECENT_STEP_WEIGHT of the way to -0.3.
    weight = (1 - RECENT_STEP_WEIGHT) ** losing_steps
    assert (
        PRIOR_GAIN * weight - 0.3 * (1 - weight)
        < 0
        <= PRIOR_GAIN * weight / (1 - RECENT_STEP_WEIGHT) - 0.3 * (1 - weight / (1 - RECENT_STEP_WEIGHT))
    )
    pauses = []
    for _ in range(6):
        pauses.append(gate.pause)
        for _ in range(gate.pause):
            assert not gate.speculates
            gate = gate.after_plain_step()
        assert gate.speculates
        gate = gate.after_speculative_step(tokens=1, cost=1.3)  # the try fails
    assert pauses == [min(FIRST_PAUSE_STEPS * 2**i, MAX_PAUSE_STEPS) for i in range(6)]


def test_speculation_comes_back_when_it_pays_again():
    gate = SpeculationGate()
    while gate.speculates:
        gate = gate.after_speculative_step(tokens=1, cost=1.3)
    for _ in range(gate.pause):
        gate = gate.after_plain_step()
    assert gate.gain == 0  # the losing stretch is forgotten: the try is judged by itself
    gate = gate.after_speculative_step(tokens=4, cost=1.3)  # the text turned predictable
    assert gate.speculates and gate.next_pause == FIRST_PAUSE_STEPS


def test_useless_heads_on_a_costly_machine_fall_back_to_plain_steps():
    """Random heads never guess right: with steep costs most steps become plain ones; the output is plain greedy's."""
    base = tiny_base_model("llama", vocab_size=96, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    prompt = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(5))
    out = generate(model, prompt, 120, tree=STEEP, lookup_tokens=0, datastore=False)
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 120))
    stats = out.stats
    # Each speculative step here loses at least the proposal's cost (a step's gain <= -0.2): the prior
    # gain is spent within `exploring` steps, then only the tries after each (doubling) pause speculate.
    loss = STEEP.proposal_cost
    exploring = math.ceil(math.log(loss / (PRIOR_GAIN + loss)) / math.log(1 - RECENT_STEP_WEIGHT))
    tries = math.ceil(math.log2(MAX_PAUSE_STEPS / FIRST_PAUSE_STEPS)) + 1 + stats.steps // MAX_PAUSE_STEPS
    assert stats.plain_steps > 0 and stats.steps - stats.plain_steps <= exploring + tries
    assert stats.mean_verified_rows < 1.5


def test_speculation_pauses_and_comes_back_within_one_prompt():
    """The same model with prompt lookup: its text falls into a loop, which lookup copies, so speculation
    pays again after the pauses of the unpredictable start."""
    base = tiny_base_model("llama", vocab_size=96, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    prompt = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(5))
    out = generate(model, prompt, 120, tree=STEEP, lookup_tokens=6, datastore=False)
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 120))
    tokens = out.stats.tokens_per_step
    assert out.stats.plain_steps > 0 and tokens[:5] == [1] * 5  # paused after an unpredictable start
    assert sum(tokens[-5:]) >= 5 * 5 and out.stats.target_calls < 0.8 * out.stats.new_tokens  # and came back


class ConfidentOracle(OracleMedusaModel):
    """Oracle heads whose softmax puts nearly all mass on the right guess."""

    def head_logits(self, hidden, num_heads=None, next_tokens=None):
        return 50.0 * super().head_logits(hidden, num_heads, next_tokens)


def test_confident_heads_never_pause():
    base = tiny_base_model("llama", vocab_size=96, seed=7)
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(8))
    expected = plain_greedy(base, prompt, 60)
    oracle = ConfidentOracle(base, random_heads(base, num_heads=4), expected[0])
    out = generate(oracle, prompt, 60, tree=GENTLE, lookup_tokens=0, datastore=False)
    assert torch.equal(out.sequences, expected)
    assert out.stats.plain_steps == 0 and out.stats.mean_tokens_per_step > 4


def test_a_static_tree_has_no_costs_and_never_pauses():
    base = tiny_base_model("llama", vocab_size=96, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    prompt = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(5))
    out = generate(model, prompt, 40, tree=[[0], [1], [0, 0]], lookup_tokens=0, datastore=False)
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 40))
    assert out.stats.plain_steps == 0 and 3 < out.stats.mean_verified_rows <= 4
