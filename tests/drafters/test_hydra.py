"""Hydra-style heads: decoding exact (greedy identity, sampling chi-square), really sequential, loaded by kind."""

from __future__ import annotations

import json
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

from medusa_lite import DynamicTree, MedusaModel, SamplingSettings, generate, load
from medusa_lite.drafters.hydra.heads import HYDRA_KIND, HydraConfig, HydraHeads
from medusa_lite.drafters.hydra.proposer import HydraProposer
from medusa_lite.errors import GenerationInputError, HeadsFileError, IncompatibleHeadsError
from medusa_lite.proposers.lookup import default_lookups

POLICY = DynamicTree(7, tuple(1.0 + 0.1 * rows for rows in range(12)), tokens_per_cost=1.0)


def hydra_config(base, num_heads: int = 3, **overrides) -> HydraConfig:
    return HydraConfig(
        num_heads=num_heads,
        hidden_size=base.config.hidden_size,
        vocab_size=base.get_output_embeddings().weight.shape[0],
        **overrides,
    )


def random_heads(base, *, num_heads: int = 3, seed: int = 2, scale: float = 0.3, **overrides) -> HydraHeads:
    heads = HydraHeads(hydra_config(base, num_heads, **overrides))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return heads.eval()


def successor_pair(family: str, num_heads: int = 4, vocab_size: int = 128):
    """A target whose greedy next token is always (token + 1) mod V, and heads that guess the same rule.

    The target's attention and MLP outputs are zeroed, so its final hidden state is the normalised
    embedding of the current token; its lm_head row t + 1 points along token t's embedding. Head k
    reads only the last of its k path tokens (its reader a multiple of the identity on that slot,
    scaled so that the guesses are confident; its block the identity): its guess is the successor of
    the token drafted at depth k - 1, so heads that did not read the drafted path could not be right
    past depth 1.
    """
    base = tiny_base_model(family, vocab_size=vocab_size)
    embed = base.get_input_embeddings().weight
    with torch.no_grad():
        for layer in base.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        base.get_output_embeddings().weight.copy_((embed / embed.norm(dim=-1, keepdim=True)).roll(1, dims=0) * 10)
    heads = HydraHeads(hydra_config(base, num_heads))
    hidden = heads.config.hidden_size
    sharpen = 3.0 / embed.norm(dim=-1).mean()  # logits of ~30 for the successor
    with torch.no_grad():
        for k, reader in enumerate(heads.readers, start=1):
            reader.weight.zero_()
            reader.weight[:, k * hidden : (k + 1) * hidden] = torch.eye(hidden) * sharpen
    return base, heads.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_accept_their_whole_depth_when_they_are_right(family):
    """Oracle: depths 2..4 are right only by reading the depth-1..3 draft; every step accepts all 4 guesses."""
    base, heads = successor_pair(family)
    model = MedusaModel(base, None, proposers=(HydraProposer(heads, topk=2, max_new_nodes=8),))
    prompt = torch.tensor([[3, 9, 27]])
    out = generate(model, prompt, 20, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 20, eos_token_id=None))
    assert out.sequences[0, 3:].tolist() == [(28 + i) % 128 for i in range(20)]
    assert out.stats.tokens_per_step[:3] == [5, 5, 5], out.stats.tokens_per_step


@pytest.mark.parametrize("draft_vocab_size", [None, 96], ids=["full-vocab", "draft-vocab"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_is_the_targets_with_hydra_heads_and_lookups(family, draft_vocab_size):
    base = tiny_base_model(family, logit_scale=4.0)
    heads = random_heads(base, draft_vocab_size=draft_vocab_size)
    if draft_vocab_size is not None:
        heads.set_draft_vocab(torch.randperm(128, generator=torch.Generator().manual_seed(3))[:draft_vocab_size])
    model = MedusaModel(base, None, proposers=(default_lookups(), HydraProposer(heads, topk=3, max_new_nodes=10)))
    for prompt in (
        torch.tensor([[5, 17, 5, 17, 99]]),
        torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(7)),
    ):
        out = generate(model, prompt, 40, eos_token_id=[])
        assert torch.equal(out.sequences, plain_greedy(base, prompt, 40, eos_token_id=None))
        assert out.stats.verified_rows > 3 * len(out.stats.tokens_per_step), "the heads must have proposed nodes"


def test_teacher_forced_forward_equals_each_head_on_its_path():
    base = tiny_base_model("llama")
    heads = random_heads(base, num_heads=3)
    hidden = torch.randn(5, heads.config.hidden_size)
    path = base.get_input_embeddings()(torch.randint(0, 128, (5, 3)))
    with torch.no_grad():
        every = heads(hidden, path)
        for k in (1, 2, 3):
            torch.testing.assert_close(every[:, k - 1], heads.head(k, hidden, path[:, :k]))
        with pytest.raises(ValueError, match="head 2 reads 2 path tokens, got 3"):
            heads.head(2, hidden, path)


def test_heads_for_another_model_are_refused():
    base = tiny_base_model("llama")
    other = tiny_base_model("llama", vocab_size=64)
    model = MedusaModel(base, None, proposers=(HydraProposer(random_heads(other)),))
    with pytest.raises(IncompatibleHeadsError, match="vocab size 64"):
        generate(model, torch.tensor([[1, 2]]), 4)


def test_the_proposer_refuses_bad_settings():
    heads = random_heads(tiny_base_model("llama"), num_heads=3)
    with pytest.raises(GenerationInputError, match="deeper than the heads"):
        HydraProposer(heads, depth=4)
    with pytest.raises(GenerationInputError, match="topk must be an integer >= 1"):
        HydraProposer(heads, topk=0)
    with pytest.raises(GenerationInputError, match="needs medusa_lite.drafters.hydra.heads.HydraHeads"):
        HydraProposer(object())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hydra-artifact")
    base = tiny_base_model("qwen2", logit_scale=4.0)
    base.save_pretrained(root / "target")
    heads = random_heads(base, num_heads=3, draft_vocab_size=100)
    heads.set_draft_vocab(torch.arange(100))
    heads.save_pretrained(root / "hydra")
    return root / "target", root / "hydra", base


def test_load_picks_hydra_heads_by_their_kind_and_decodes_exactly(folders):
    target, hydra, base = folders
    assert json.loads((hydra / "config.json").read_text())["kind"] == HYDRA_KIND
    model, _ = load(target, heads=hydra, tree=POLICY, datastore=False)
    (proposer,) = [p for p in model.proposers if isinstance(p, HydraProposer)]
    assert model.heads is None and proposer.costs is not None and proposer.draft_lm_head is not None
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(6))
    out = generate(model, prompt, 30, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 30, eos_token_id=None))
    assert out.stats.verified_rows > len(out.stats.tokens_per_step), "the heads proposed nodes"


def test_an_unknown_kind_or_a_corrupt_config_is_named(folders, tmp_path):
    target, hydra, _ = folders
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((hydra / name).read_bytes())
    config = json.loads((hydra / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "kind": "eagle-9"}))
    with pytest.raises(HeadsFileError, match="records kind 'eagle-9'.*'hydra-heads'"):
        load(target, heads=tmp_path, datastore=False)
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_heads": 0}))
    with pytest.raises(HeadsFileError, match="num_heads must be a positive integer"):
        load(target, heads=tmp_path, datastore=False)
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_heads": 4}))
    with pytest.raises(HeadsFileError, match="readers.3"):
        load(target, heads=tmp_path, datastore=False)


@pytest.fixture(scope="module")
def sampling_model():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=42, logit_scale=5.0)
    return base, random_heads(base, num_heads=3, seed=44, scale=0.5)


def hydra_counts(base, proposers, settings, n, seed):
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
def test_hydra_sampling_matches_exact_target_distribution(sampling_model, settings, proposer_kwargs, with_lookups):
    """3,000 samples of the first 4 tokens vs the enumerated target distribution, chi-square at alpha 1e-3
    (the same test rejects a 20% temperature error: test_hydra_chi_square_has_power below)."""
    base, heads = sampling_model
    proposers = ((default_lookups(3, datastore=None),) if with_lookups else ()) + (
        HydraProposer(heads, **proposer_kwargs),
    )
    counts, drafted_rows = hydra_counts(base, proposers, settings, NUM_SAMPLES, seed=1)
    assert drafted_rows > NUM_SAMPLES, "the heads must have proposed guesses"
    p_value = chi_square_p_value(counts, exact_distribution(base, settings), NUM_SAMPLES)
    assert p_value > ALPHA, f"Hydra samples differ from the target's distribution (p={p_value:.2e})"


def test_hydra_chi_square_has_power(sampling_model):
    """Samples from T=0.8 through the Hydra path are rejected against the T=1.0 distribution."""
    base, heads = sampling_model
    counts, _ = hydra_counts(
        base, (HydraProposer(heads, topk=3, max_new_nodes=9),), SamplingSettings(0.8), NUM_SAMPLES, seed=2
    )
    assert chi_square_p_value(counts, exact_distribution(base, SamplingSettings(1.0)), NUM_SAMPLES) < ALPHA
