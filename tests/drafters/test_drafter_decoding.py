"""Decoding with the sequential drafter: exact (greedy identity, sampling chi-square) and really sequential."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from exact_distribution import (
    ALPHA,
    NEW_TOKENS,
    NUM_SAMPLES,
    PROMPT,
    VOCAB,
    chi_square_p_value,
    continuation,
    exact_distribution,
    sampled_outputs,
)
from tiny_models import FAMILIES, plain_greedy, tiny_base_model

from medusa_lite import DynamicTree, MedusaModel, SamplingSettings, generate
from medusa_lite.drafters.growth import DrafterCache, commit_pairs
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.drafters.sequential.proposer import SequentialDrafterProposer
from medusa_lite.errors import IncompatibleHeadsError
from medusa_lite.proposers.lookup import default_lookups

# Tiny targets have 2 layers, so 3 hidden states: all three, as EAGLE-3 reads a low, a middle and a high one.
THREE_LAYERS = [0, 1, 2]


def random_drafter(
    base, *, depth: int = 3, seed: int = 2, scale: float = 0.3, feature_layers: list[int] | None = None
) -> SequentialDrafter:
    drafter = SequentialDrafter(DrafterConfig.for_model(base, depth=depth, feature_layers=feature_layers))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            if "norm" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return drafter.eval()


def successor_pair(family: str, depth: int = 4, vocab_size: int = 128):
    """A target whose greedy next token is always (token + 1) mod V, and a drafter that drafts the same rule.

    The target's attention and MLP outputs are zeroed, so its final hidden state is the normalised
    embedding of the current token; its lm_head row t + 1 points along token t's embedding. The
    drafter reads only the token half of its input (feature and attention ignored) and shares the
    target's embedding and lm_head: depth d's guess is the successor of the token drafted at
    depth d - 1, so a drafter that did not feed its own draft forward could not be right past depth 1.
    """
    base = tiny_base_model(family, vocab_size=vocab_size)
    embed = base.get_input_embeddings().weight
    with torch.no_grad():
        for layer in base.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        base.get_output_embeddings().weight.copy_((embed / embed.norm(dim=-1, keepdim=True)).roll(1, dims=0) * 10)
    drafter = SequentialDrafter(DrafterConfig.for_model(base, depth=depth))
    hidden = drafter.config.hidden_size
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.zero_()
        for norm in (
            drafter.feature_norm,
            drafter.token_norm,
            drafter.attention_norm,
            drafter.mlp_norm,
            drafter.output_norm,
        ):
            norm.weight.fill_(1.0)
        drafter.fuse.weight[:, hidden:] = torch.eye(hidden)
    return base, drafter.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_drafter_accepts_its_whole_depth_when_it_is_right(family):
    """Oracle: depth 2..4 are right only by reading the depth-1..3 draft; every step accepts all 4 guesses."""
    base, drafter = successor_pair(family)
    model = MedusaModel(base, None, proposers=(SequentialDrafterProposer(drafter, topk=2, max_new_nodes=8),))
    prompt = torch.tensor([[3, 9, 27]])
    out = generate(model, prompt, 20, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 20, eos_token_id=None))
    assert out.sequences[0, 3:].tolist() == [(28 + i) % 128 for i in range(20)]
    assert out.stats.tokens_per_step[:3] == [5, 5, 5], out.stats.tokens_per_step


@pytest.mark.parametrize("feature_layers", [None, THREE_LAYERS], ids=["final", "three-layers"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_is_the_targets_with_drafter_and_lookups(family, feature_layers):
    base = tiny_base_model(family, logit_scale=4.0)
    drafter = random_drafter(base, feature_layers=feature_layers)
    model = MedusaModel(
        base, None, proposers=(default_lookups(), SequentialDrafterProposer(drafter, topk=3, max_new_nodes=10))
    )
    for prompt in (
        torch.tensor([[5, 17, 5, 17, 99]]),
        torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(7)),
    ):
        out = generate(model, prompt, 40, eos_token_id=[])
        assert torch.equal(out.sequences, plain_greedy(base, prompt, 40, eos_token_id=None))
        assert out.stats.verified_rows > 3 * len(out.stats.tokens_per_step), (
            "the drafter must have proposed nodes every step"
        )


@pytest.mark.parametrize("feature_layers", [None, [1, 0]], ids=["final", "layers-1-0"])
def test_drafter_cache_after_generation_equals_one_pass_over_the_text(feature_layers):
    """Rolled back to the accepted path every step: the cache holds exactly the committed pairs, each made from
    the target layers the drafter reads, in its order."""
    base = tiny_base_model("llama", logit_scale=4.0)
    drafter = random_drafter(base, feature_layers=feature_layers)
    runs = []

    @dataclasses.dataclass(frozen=True)
    class Recording(SequentialDrafterProposer):
        def begin(self, model, prompt, limits):
            run = super().begin(model, prompt, limits)
            runs.append(run)
            return run

    model = MedusaModel(base, None, proposers=(Recording(drafter, topk=3),))
    out = generate(model, torch.tensor([[1, 2, 3, 4]]), 25, eos_token_id=[])
    tokens = out.sequences[0]
    cache = runs[0].cache
    length = cache.length  # pairs taken in by the last step: the tokens committed before it, less the last one
    assert 4 <= length < tokens.numel() - 1 and length >= tokens.numel() - 1 - (drafter.config.depth + 1)
    with torch.no_grad():
        states = base(tokens[None], output_hidden_states=True).hidden_states
        layers = feature_layers or [-1]
        hidden = torch.cat([states[i][0] for i in layers], dim=-1)
        whole, _ = commit_pairs(
            drafter,
            DrafterCache.empty(drafter, tokens.device, torch.float32),
            hidden[:length],
            tokens[1 : length + 1],
            base.get_input_embeddings(),
            base.get_output_embeddings(),
        )
    torch.testing.assert_close(cache.keys, whole.keys, rtol=1e-4, atol=1e-4)


def test_a_drafter_for_another_model_is_refused():
    base = tiny_base_model("llama")
    other = tiny_base_model("llama", vocab_size=64)
    model = MedusaModel(base, None, proposers=(SequentialDrafterProposer(random_drafter(other)),))
    with pytest.raises(IncompatibleHeadsError, match="vocab size 64"):
        generate(model, torch.tensor([[1, 2]]), 4)


def test_a_drafter_reading_layers_the_model_lacks_is_refused():
    base = tiny_base_model("llama")
    model = MedusaModel(
        base, None, proposers=(SequentialDrafterProposer(random_drafter(base, feature_layers=[1, 5])),)
    )
    with pytest.raises(IncompatibleHeadsError, match=r"layers \[1, 5\].*only 3 hidden states"):
        generate(model, torch.tensor([[1, 2]]), 4)


@pytest.fixture(scope="module")
def sampling_model():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=42, logit_scale=5.0)
    return base, random_drafter(base, depth=3, seed=44, scale=0.5)


@pytest.fixture(scope="module")
def multilayer_sampling_model(sampling_model):
    base, _ = sampling_model
    return base, random_drafter(base, depth=3, seed=45, scale=0.5, feature_layers=THREE_LAYERS)


def drafter_counts(base, proposers, settings, n, seed):
    """(how often each continuation came out, the draft rows verified beside the roots) over ``n`` samples."""
    model = MedusaModel(base, None, proposers=proposers)
    runs = list(sampled_outputs(model, PROMPT, NEW_TOKENS, settings, n, seed))
    rows = sum(out.stats.verified_rows - len(out.stats.tokens_per_step) for out in runs)
    return Counter(continuation(out, PROMPT) for out in runs), rows


COSTS = DynamicTree(6, tuple(1.0 + 0.05 * rows for rows in range(16)), tokens_per_cost=0.5)


@pytest.mark.parametrize(
    "settings, proposer_kwargs, with_lookups",
    [
        (SamplingSettings(1.0), dict(topk=3, max_new_nodes=9), False),
        (SamplingSettings(0.7, top_k=2), dict(topk=2, max_new_nodes=5, costs=COSTS), True),
        (SamplingSettings(1.0, top_p=0.8), dict(topk=2, max_new_nodes=6), True),
    ],
    ids=["T1.0-full", "T0.7-topk2-costed+lookups", "T1.0-topp0.8+lookups"],
)
def test_drafter_sampling_matches_exact_target_distribution(sampling_model, settings, proposer_kwargs, with_lookups):
    """3,000 samples of the first 4 tokens vs the enumerated target distribution, chi-square at alpha 1e-3
    (the same test rejects a 20% temperature error: test_drafter_chi_square_has_power below)."""
    base, drafter = sampling_model
    proposers = ((default_lookups(3, datastore=None),) if with_lookups else ()) + (
        SequentialDrafterProposer(drafter, **proposer_kwargs),
    )
    counts, drafted_rows = drafter_counts(base, proposers, settings, NUM_SAMPLES, seed=1)
    assert drafted_rows > NUM_SAMPLES, "the drafter must have proposed guesses"
    p_value = chi_square_p_value(counts, exact_distribution(base, settings), NUM_SAMPLES)
    assert p_value > ALPHA, f"drafter samples differ from the target's distribution (p={p_value:.2e})"


def test_multilayer_drafter_sampling_matches_exact_target_distribution(multilayer_sampling_model):
    """As above (same samples, alpha and power) for a drafter reading three target layers, at T = 0.7 with top-p."""
    base, drafter = multilayer_sampling_model
    settings = SamplingSettings(0.7, top_p=0.9)
    proposers = (SequentialDrafterProposer(drafter, topk=3, max_new_nodes=9),)
    counts, drafted_rows = drafter_counts(base, proposers, settings, NUM_SAMPLES, seed=3)
    assert drafted_rows > NUM_SAMPLES, "the drafter must have proposed guesses"
    p_value = chi_square_p_value(counts, exact_distribution(base, settings), NUM_SAMPLES)
    assert p_value > ALPHA, f"drafter samples differ from the target's distribution (p={p_value:.2e})"


def test_drafter_chi_square_has_power(sampling_model):
    """Samples from T=0.8 through the drafter path are rejected against the T=1.0 distribution."""
    base, drafter = sampling_model
    counts, _ = drafter_counts(
        base,
        (SequentialDrafterProposer(drafter, topk=3, max_new_nodes=9),),
        SamplingSettings(0.8),
        NUM_SAMPLES,
        seed=2,
    )
    assert chi_square_p_value(counts, exact_distribution(base, SamplingSettings(1.0)), NUM_SAMPLES) < ALPHA
