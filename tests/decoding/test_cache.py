"""``medusa_lite.decoding.cache``: a dynamic KV cache whose layers append into buffers reserved up front."""

from __future__ import annotations

import torch
from tiny_models import random_heads, tiny_base_model
from transformers import DynamicCache

from medusa_lite import MedusaModel
from medusa_lite.decoding.cache import ReservedLayer, reserved_cache
from medusa_lite.decoding.verify import keep_accepted_in_cache


def entries(length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, length, 8, generator=generator), torch.randn(1, 2, length, 8, generator=generator)


def test_appending_writes_in_place_and_matches_concatenation():
    layer = ReservedLayer(capacity=16)
    keys, values = entries(5, 0)
    layer.update(keys, values)
    buffer = layer.key_buffer.data_ptr()
    more_keys, more_values = entries(3, 1)
    out_keys, out_values = layer.update(more_keys, more_values)
    assert layer.key_buffer.data_ptr() == buffer  # no new allocation
    assert torch.equal(out_keys, torch.cat([keys, more_keys], dim=-2)) and torch.equal(
        out_values, torch.cat([values, more_values], dim=-2)
    )
    assert layer.get_seq_length() == 8


def test_past_capacity_the_buffers_grow_and_keep_every_entry():
    layer = ReservedLayer(capacity=4)
    parts = [entries(3, seed) for seed in range(4)]
    for keys, values in parts:
        out_keys, out_values = layer.update(keys, values)
    assert layer.capacity >= 12 and layer.get_seq_length() == 12
    assert torch.equal(out_keys, torch.cat([keys for keys, _ in parts], dim=-2))
    assert torch.equal(out_values, torch.cat([values for _, values in parts], dim=-2))


def test_compaction_then_append_behaves_like_a_dynamic_cache():
    """Keep the prefix + accepted nodes, append again: the same entries as transformers' DynamicCache."""
    base = tiny_base_model("llama", vocab_size=50, seed=3)
    model = MedusaModel(base, random_heads(base, 2))
    ours, theirs = reserved_cache(model, capacity=12), DynamicCache()
    for cache in (ours, theirs):
        model.target_forward(torch.tensor([[1, 2, 3, 4, 5, 6]]), cache=cache, use_cache=True)
        model.target_forward(torch.tensor([[7, 8, 9, 10]]), cache=cache, use_cache=True)  # a 4-node "tree"
        keep_accepted_in_cache(cache, prefix_len=6, accepted_nodes=torch.tensor([0, 2]))
        model.target_forward(torch.tensor([[11, 12, 13, 14, 15]]), cache=cache, use_cache=True)  # grows past 12
    assert ours.get_seq_length() == theirs.get_seq_length() == 13
    for mine, reference in zip(ours.layers, theirs.layers, strict=True):
        torch.testing.assert_close(mine.keys, reference.keys, rtol=0, atol=0)
        torch.testing.assert_close(mine.values, reference.values, rtol=0, atol=0)
