"""One forward of the target over a whole candidate tree, and the cache compaction after it.

Tree attention needs no modeling code of our own: the tree's tokens go in as one sequence,
each at position ``prefix_len + depth``, with an additive 4D mask that lets a node see the
whole cached prefix, itself and its ancestors, and nothing else (less what lies outside a sliding
window: :mod:`medusa_lite.decoding.windows`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from medusa_lite.decoding.model import MedusaModel, TargetOutput, text_config
from medusa_lite.decoding.windows import additive, step_masks
from medusa_lite.trees.tree import Tree


def tree_allowed(tree: Tree, prefix_len: int) -> torch.Tensor:
    """[N, prefix_len + N] True where a node may attend: the whole prefix, itself and its ancestors."""
    return torch.cat([torch.ones(tree.num_nodes, prefix_len, dtype=torch.bool), tree.ancestor_mask], dim=1)


def tree_attention_mask(tree: Tree, prefix_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask [1, 1, N, prefix_len + N] of a full-attention target: 0 where allowed, dtype-min elsewhere."""
    return additive(tree_allowed(tree, prefix_len), dtype, device)


def step_forward(model: MedusaModel, cache: DynamicCache, tokens: torch.Tensor, positions: torch.Tensor, allowed):
    """The target over one step's rows ``tokens`` [Q] at ``positions`` [Q], each seeing what ``allowed`` lets it."""
    device = tokens.device
    return model.target_forward(
        tokens[None],
        position_ids=positions.to(device)[None],
        attention_mask=step_masks(text_config(model.base_model), allowed, positions, model.base_model.dtype, device),
        cache=cache,
        use_cache=True,
    )


def verify_tree(model: MedusaModel, cache: DynamicCache, tree: Tree, candidates: torch.Tensor) -> TargetOutput:
    """Target logits and hidden states at every tree node [N, ...], in one forward."""
    prefix_len = cache.get_seq_length()
    positions = prefix_len + tree.node_depths
    return step_forward(model, cache, candidates, positions, tree_allowed(tree, prefix_len)).select(0)


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


def step_rows_allowed(tree: Tree, side) -> torch.Tensor:
    """[N + M, N + M] True where a step's row may attend among the step's own rows, for a draft of N nodes followed
    by M side rows (``side`` None: none): draft rows see themselves and their ancestors, no side row; side rows see
    the root (draft node 0) and the side rows ``side.mask`` allows, no other draft node."""
    if side is None:
        return tree.ancestor_mask
    nodes, count = tree.num_nodes, side.tokens.numel()
    allowed = torch.zeros(nodes + count, nodes + count, dtype=torch.bool)
    allowed[:nodes, :nodes] = tree.ancestor_mask
    allowed[nodes:, 0] = True
    allowed[nodes:, nodes:] = side.mask
    return allowed


def side_rows_allowed(tree: Tree, side, prefix_len: int) -> torch.Tensor:
    """[N + M, prefix_len + N + M] True where a row may attend: the whole cached prefix, then
    :func:`step_rows_allowed`."""
    local = step_rows_allowed(tree, side)
    return torch.cat([torch.ones(local.shape[0], prefix_len, dtype=torch.bool), local], dim=1)


def verify_with_side_rows(model: MedusaModel, cache: DynamicCache, tree: Tree, candidates: torch.Tensor, side):
    """(target logits and hidden states at every tree node [N, ...], logits at the side rows [M, V]), in one forward.

    The side rows' keys and values enter the cache after the draft's, so
    :func:`keep_accepted_in_cache` (which keeps the prefix and accepted draft nodes) drops them.
    """
    prefix_len = cache.get_seq_length()
    nodes = tree.num_nodes
    positions = torch.cat([tree.node_depths, side.offsets.cpu()]) + prefix_len
    tokens = torch.cat([candidates, side.tokens.to(candidates.device)])
    out = step_forward(model, cache, tokens, positions, side_rows_allowed(tree, side, prefix_len))
    return out.select((0, slice(None, nodes))), out.logits[0, nodes:]
