"""One forward of the target over a whole candidate tree, and the cache compaction after it.

Tree attention needs no modeling code of our own: the tree's tokens go in as one sequence,
each at position ``prefix_len + depth``, with an additive 4D mask that lets a node see the
whole cached prefix, itself and its ancestors, and nothing else.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from medusa_lite.decoding.model import MedusaModel, TargetOutput
from medusa_lite.trees.tree import Tree


def tree_attention_mask(tree: Tree, prefix_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask [1, 1, N, prefix_len + N]: 0 where attention is allowed, dtype-min elsewhere."""
    allowed = torch.cat([torch.ones(tree.num_nodes, prefix_len, dtype=torch.bool), tree.ancestor_mask], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def verify_tree(model: MedusaModel, cache: DynamicCache, tree: Tree, candidates: torch.Tensor) -> TargetOutput:
    """Target logits and hidden states at every tree node [N, ...], in one forward."""
    prefix_len = cache.get_seq_length()
    device = candidates.device
    out = model.target_forward(
        candidates[None],
        position_ids=(prefix_len + tree.node_depths).to(device)[None],
        attention_mask=tree_attention_mask(tree, prefix_len, model.base_model.dtype, device),
        cache=cache,
        use_cache=True,
    )
    return out.select(0)


def keep_accepted_in_cache(cache: DynamicCache, prefix_len: int, accepted_nodes: torch.Tensor) -> None:
    """Drop the rejected tree nodes from the cache: keep [0, prefix_len) + the accepted nodes.

    Only the accepted nodes' keys/values move (to sit right after the prefix); the rest is cut
    by a slice, so a step costs O(accepted) copies, not O(context).
    """
    new_len = prefix_len + accepted_nodes.numel()
    source = (prefix_len + accepted_nodes).to(cache.layers[0].keys.device)
    for layer in cache.layers:
        layer.keys[..., prefix_len:new_len, :] = layer.keys[..., source, :]
        layer.values[..., prefix_len:new_len, :] = layer.values[..., source, :]
        layer.keys = layer.keys[..., :new_len, :]
        layer.values = layer.values[..., :new_len, :]


def side_rows_attention_mask(
    tree: Tree, side, prefix_len: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Additive mask [1, 1, N + M, prefix_len + N + M] for a draft of N nodes followed by M side rows.

    Draft rows see what :func:`tree_attention_mask` allows and no side row; side rows see the
    prefix, the root (draft node 0) and the side rows ``side.mask`` allows, no other draft node.
    """
    nodes, count = tree.num_nodes, side.tokens.numel()
    allowed = torch.zeros(nodes + count, prefix_len + nodes + count, dtype=torch.bool)
    allowed[:, :prefix_len] = True
    allowed[:nodes, prefix_len : prefix_len + nodes] = tree.ancestor_mask
    allowed[nodes:, prefix_len] = True
    allowed[nodes:, prefix_len + nodes :] = side.mask
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def verify_with_side_rows(model: MedusaModel, cache: DynamicCache, tree: Tree, candidates: torch.Tensor, side):
    """(target logits and hidden states at every tree node [N, ...], logits at the side rows [M, V]), in one forward.

    The side rows' keys and values enter the cache after the draft's, so
    :func:`keep_accepted_in_cache` (which keeps the prefix and accepted draft nodes) drops them.
    """
    prefix_len = cache.get_seq_length()
    device = candidates.device
    nodes = tree.num_nodes
    positions = torch.cat([tree.node_depths, side.offsets.cpu()]) + prefix_len
    out = model.target_forward(
        torch.cat([candidates, side.tokens.to(device)])[None],
        position_ids=positions.to(device)[None],
        attention_mask=side_rows_attention_mask(tree, side, prefix_len, model.base_model.dtype, device),
        cache=cache,
        use_cache=True,
    )
    return out.select((0, slice(None, nodes))), out.logits[0, nodes:]
