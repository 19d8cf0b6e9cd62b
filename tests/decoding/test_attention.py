"""``medusa_lite.decoding.attention``: SDPA running masked grouped-query attention, keys/values not copied per head."""

from __future__ import annotations

import pytest
import torch
from tiny_models import plain_greedy, random_heads, tiny_base_model
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from medusa_lite import MedusaModel, default_tree, generate
from medusa_lite.decoding.attention import TREE_SDPA, runs_gqa_inside_sdpa, tree_sdpa_attention_forward

HEADS, KV_HEADS, HEAD_DIM = 6, 2, 16


class FakeAttention(torch.nn.Module):
    """What the attention functions read off a transformers attention layer."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def tree_like_inputs(queries: int, cached: int, kv_heads: int = KV_HEADS):
    generator = torch.Generator().manual_seed(queries * 100 + cached)
    query = torch.randn(1, HEADS, queries, HEAD_DIM, generator=generator)
    key = torch.randn(1, kv_heads, cached + queries, HEAD_DIM, generator=generator)
    value = torch.randn(1, kv_heads, cached + queries, HEAD_DIM, generator=generator)
    allowed = torch.rand(queries, cached + queries, generator=generator) > 0.4
    allowed[:, 0] = True  # every query sees at least one key
    mask = torch.zeros(1, 1, queries, cached + queries).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return query, key, value, mask


@pytest.mark.parametrize("queries, cached", [(1, 7), (4, 30), (10, 200)])
def test_masked_gqa_equals_transformers_sdpa(queries, cached):
    query, key, value, mask = tree_like_inputs(queries, cached)
    module = FakeAttention(HEADS // KV_HEADS)
    assert runs_gqa_inside_sdpa(module, query, mask, {})
    ours, _ = tree_sdpa_attention_forward(module, query, key, value, mask, scaling=HEAD_DIM**-0.5)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=HEAD_DIM**-0.5)
    assert ours.shape == theirs.shape == (1, queries, HEADS, HEAD_DIM)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["no mask", "one group", "position bias"])
def test_other_calls_are_transformers_sdpa_unchanged(case):
    query, key, value, mask = tree_like_inputs(4, 20, kv_heads=HEADS if case == "one group" else KV_HEADS)
    module = FakeAttention(1 if case == "one group" else HEADS // KV_HEADS)
    mask = None if case == "no mask" else mask
    extra = {"position_bias": torch.zeros(1, HEADS, 4, 24)} if case == "position bias" else {}
    assert not runs_gqa_inside_sdpa(module, query, mask, extra)
    ours, _ = tree_sdpa_attention_forward(module, query, key, value, mask, **extra)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, **extra)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("attn_implementation", [TREE_SDPA, "sdpa"])
def test_gqa_model_decodes_exactly_with_either_backend(attn_implementation):
    base = tiny_base_model(
        "qwen2",
        vocab_size=90,
        seed=31,
        attn_implementation=attn_implementation,
        num_attention_heads=4,
        num_key_value_heads=1,
    )
    model = MedusaModel(base, random_heads(base, num_heads=3))
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    assert torch.equal(generate(model, prompt, 30, tree=default_tree(3)).sequences, plain_greedy(base, prompt, 30))


def test_plain_generate_is_the_same_under_both_backends():
    prompt = torch.tensor([[2, 7, 1, 8, 2, 8]])
    outputs = [
        plain_greedy(tiny_base_model("llama", vocab_size=70, seed=5, attn_implementation=name), prompt, 20)
        for name in (TREE_SDPA, "sdpa")
    ]
    assert torch.equal(*outputs)
