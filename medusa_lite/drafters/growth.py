"""Draft trees grown by a drafter's confidence, and the sequential drafter's KV cache.

:func:`grow_by_confidence` and :func:`proposal_by_cost` serve every drafter that guesses depth d
from its own depth d - 1 (the sequential drafter here, Hydra-style heads in
:mod:`medusa_lite.drafters.hydra.proposer`); each supplies only how a frontier node is expanded.

The sequential drafter's cache holds one entry per committed pair (target feature h_i, token x_{i+1}); see
:mod:`medusa_lite.drafters.sequential.drafter` for the positions. A step (EAGLE-2's draft tree):

1. the last committed entry's output gives the root's children: its top-k tokens are depth 1;
2. at each further depth the ``topk`` likeliest frontier nodes (by cumulative draft log
   probability) are expanded in one drafter forward (each attends to the committed cache and its
   own expanded ancestors), each giving its own top-k children;
3. all candidates are ranked by cumulative probability and the best are kept (how many: the
   caller's rule, e.g. the measured cost of verifying rows); a child's probability never
   exceeds its parent's, so the kept set is a tree.

The candidates are a deterministic function of the committed text, so the usual exact acceptance
rule applies (greedy: the target's tokens; sampling: the target's distribution). After
verification :func:`commit_pairs` appends the accepted pairs with the target's true features; the
draft entries of a step are never written into the cache, so nothing needs rolling back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from medusa_lite.drafters.sequential.drafter import SequentialDrafter, masked_attention
from medusa_lite.proposers import base as proposers
from medusa_lite.proposers.base import StepContext
from medusa_lite.trees.draft import DraftTree
from medusa_lite.trees.dynamic_tree import DynamicTree


@dataclass(frozen=True)
class DrafterCache:
    """The drafter's keys/values of the committed pairs [kv_heads, L, head_dim] (L = committed tokens - 1)."""

    keys: torch.Tensor
    values: torch.Tensor

    @classmethod
    def empty(cls, drafter: SequentialDrafter, device: torch.device, dtype: torch.dtype) -> DrafterCache:
        shape = (drafter.config.num_key_value_heads, 0, drafter.config.head_dim)
        return cls(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))

    @property
    def length(self) -> int:
        return self.keys.shape[-2]


@dataclass(frozen=True)
class RootDraft:
    """What the last committed pair gave: the feature depth 2 reads and the root's children's logits [G]."""

    feature: torch.Tensor  # [H]
    logits: torch.Tensor  # [G]


def commit_pairs(
    drafter: SequentialDrafter,
    cache: DrafterCache,
    features: torch.Tensor,
    tokens: torch.Tensor,
    embed: nn.Module,
    lm_head: nn.Module,
) -> tuple[DrafterCache, RootDraft]:
    """Append pairs (features [n, W] of the target, the tokens [n] that followed them) to the cache.

    W: the drafter's ``config.feature_width`` (H, or H per feature layer).

    Returns the longer cache and the last pair's output (the next step's root draft). The n rows
    attend to the whole cache and causally among themselves: one forward, the prefix never rerun.
    """
    n, length = tokens.numel(), cache.length
    positions = torch.arange(length, length + n, device=tokens.device)
    allowed = torch.ones(n, length + n, dtype=torch.bool, device=tokens.device)
    allowed[:, length:] = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()

    def attend(q, k, v):
        return masked_attention(q, torch.cat([cache.keys, k], dim=-2), torch.cat([cache.values, v], dim=-2), allowed)

    step = drafter(drafter.target_feature(features.to(cache.keys.dtype)), embed(tokens), positions, attend)
    longer = DrafterCache(torch.cat([cache.keys, step.keys], dim=-2), torch.cat([cache.values, step.values], dim=-2))
    last = step.features[-1]
    return longer, RootDraft(last, drafter.project(last, lm_head).float())


@dataclass
class Candidates:
    """All drafted nodes of a step, the root first (index 0): tokens, parents, depths, cumulative log probabilities."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    scores: list[float]

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.scores.append(score)
        return len(self.tokens) - 1


def expand_nodes(
    drafter: SequentialDrafter,
    cache: DrafterCache,
    draft_keys: torch.Tensor,
    draft_values: torch.Tensor,
    features: torch.Tensor,
    token_embeds: torch.Tensor,
    position: int,
    ancestor_slots: list[list[int]],
):
    """Expand m draft nodes of one depth [m, H]: each attends to the committed cache, its expanded
    ancestors (``ancestor_slots[i]``: rows of ``draft_keys``) and itself, at ``position``."""
    m, committed, drafted = features.shape[0], cache.length, draft_keys.shape[-2]
    allowed = torch.zeros(m, committed + drafted + m, dtype=torch.bool, device=features.device)
    allowed[:, :committed] = True
    rows = [row for row, slots in enumerate(ancestor_slots) for _ in slots] + list(range(m))
    columns = [committed + s for slots in ancestor_slots for s in slots]
    columns += [committed + drafted + row for row in range(m)]
    allowed[rows, columns] = True  # each row's expanded ancestors, and itself

    def attend(q, k, v):
        keys = torch.cat([cache.keys, draft_keys, k], dim=-2)
        values = torch.cat([cache.values, draft_values, v], dim=-2)
        return masked_attention(q, keys, values, allowed)

    return drafter(features, token_embeds, torch.full((m,), position, device=features.device), attend)


# expand(candidates, frontier nodes, level) -> the children's logits [len(frontier), G], one row per node
Expansion = Callable[["Candidates", list[int], int], torch.Tensor]


def grow_by_confidence(
    root_logits: torch.Tensor,
    root_token: int,
    guess_ids: Callable[[torch.Tensor], torch.Tensor],
    expand: Expansion,
    depth: int,
    topk: int,
    expansion_price: float = 0.0,
) -> Candidates:
    """A draft tree to ``depth`` grown by a drafter's confidence (EAGLE-2): depth 1 is the ``topk`` likeliest
    guesses of ``root_logits`` [G]; each further depth ``expand``s the ``topk`` likeliest frontier nodes (by
    cumulative log probability), each offering its ``topk`` likeliest children. ``guess_ids`` maps logit indices
    to token ids (a draft vocabulary's).

    ``expansion_price``: expected tokens one more expansion must be able to buy. The nodes of each
    depth below a frontier are together at most as likely as the frontier (a child's path
    probability never exceeds its parent's), so each further depth adds at most ``frontier mass``
    expected tokens for one expansion's price: growth stops where the frontier's mass is below the
    price (growing j more depths buys at most j x mass for j x price, whatever j).
    """
    candidates = Candidates([root_token], [0], [0], [0.0])
    k = min(topk, root_logits.shape[-1])
    first = torch.log_softmax(root_logits, dim=-1).topk(k)
    frontier = [
        candidates.add(int(t), 0, float(s)) for t, s in zip(guess_ids(first.indices).tolist(), first.values.tolist())
    ]
    for level in range(1, depth):
        frontier_mass = sum(math.exp(candidates.scores[node]) for node in frontier)
        if frontier_mass < expansion_price:
            break
        children = torch.log_softmax(expand(candidates, frontier, level).float(), dim=-1).topk(k)  # [m, k]
        parent_scores = torch.tensor([candidates.scores[node] for node in frontier], device=children.values.device)
        totals = (children.values + parent_scores[:, None]).tolist()
        child_tokens = guess_ids(children.indices).tolist()
        added = [
            candidates.add(int(token), node, score)
            for row, node in enumerate(frontier)
            for token, score in zip(child_tokens[row], totals[row])
        ]
        frontier = sorted(added, key=lambda node: (-candidates.scores[node], node))[:k]
    return candidates


def path_tokens(candidates: Candidates, node: int) -> list[int]:
    """The tokens from the root to ``node``, both included."""
    tokens = []
    while node != 0:
        tokens.append(candidates.tokens[node])
        node = candidates.parents[node]
    return [candidates.tokens[0], *reversed(tokens)]


def grow_candidates(
    drafter: SequentialDrafter,
    cache: DrafterCache,
    root: RootDraft,
    root_token: int,
    embed: nn.Module,
    lm_head: nn.Module,
    depth: int,
    topk: int,
    expansion_price: float = 0.0,
) -> Candidates:
    """The sequential drafter's candidates to ``depth`` (:func:`grow_by_confidence`): expanding a node feeds (its
    parent's output feature, its token) at its position, attending to the committed cache and its expanded
    ancestors; the root's children come from the last committed pair's output (``root``)."""
    output: dict[int, torch.Tensor] = {0: root.feature}  # expanded node (the root: the last pair) -> its feature
    slot: dict[int, int] = {}  # expanded node -> its row among this step's draft keys
    draft = [cache.keys[..., :0, :], cache.values[..., :0, :]]  # this step's expanded nodes' keys and values

    def expand(candidates: Candidates, frontier: list[int], level: int) -> torch.Tensor:
        ancestor_slots = []
        for node in frontier:
            ancestors, ancestor = [], candidates.parents[node]
            while ancestor != 0:
                ancestors.append(slot[ancestor])
                ancestor = candidates.parents[ancestor]
            ancestor_slots.append(ancestors)
        tokens = torch.tensor([candidates.tokens[node] for node in frontier], device=cache.keys.device)
        features = torch.stack([output[candidates.parents[node]] for node in frontier])
        step = expand_nodes(
            drafter, cache, draft[0], draft[1], features, embed(tokens), cache.length - 1 + level, ancestor_slots
        )
        for row, node in enumerate(frontier):
            slot[node] = draft[0].shape[-2] + row
            output[node] = step.features[row]
        draft[0], draft[1] = torch.cat([draft[0], step.keys], dim=-2), torch.cat([draft[1], step.values], dim=-2)
        return drafter.project(step.features, lm_head)

    return grow_by_confidence(root.logits, root_token, drafter.guess_ids, expand, depth, topk, expansion_price)


def candidate_count_limit(topk: int, depth: int) -> int:
    """The most candidates a tree grown by :func:`grow_by_confidence` makes: ``topk`` at depth 1, ``topk`` x
    ``topk`` per further depth."""
    return topk + max(depth - 1, 0) * topk * topk if depth > 0 else 0


def ranked_nodes(candidates: Candidates) -> list[int]:
    """Non-root candidates, most confident first; ties keep creation order, so parents precede children."""
    return sorted(range(1, len(candidates.tokens)), key=lambda node: (-candidates.scores[node], node))


def best_count_by_cost(
    confidences: list[float],
    max_nodes: int,
    cost: Callable[[int], float] | None,
    tokens_per_cost: float,
    extra_rows: int = 0,
) -> int:
    """How many of the ranked nodes to verify: ``max_nodes - 1`` without a cost, else the count maximising
    expected tokens (1 + the kept confidences) minus ``tokens_per_cost`` x cost(rows), as the dynamic tree does."""
    limit = min(max_nodes - 1, len(confidences))
    if cost is None:
        return limit
    expected, best_value, best_count = 1.0, 1.0 - tokens_per_cost * cost(1 + extra_rows), 0
    for count in range(1, limit + 1):
        expected += confidences[count - 1]
        value = expected - tokens_per_cost * cost(1 + count + extra_rows)
        if value > best_value:
            best_value, best_count = value, count
    return best_count


def proposal_by_cost(
    candidates: Candidates, step: StepContext, costs: DynamicTree | None, source: str
) -> proposers.Candidates:
    """The step's proposal from a grown tree: its ``step.max_nodes`` likeliest nodes, or with ``costs`` (a
    :class:`DynamicTree`'s row costs and ``tokens_per_cost``) as many as pay for their rows, counting the rows the
    proposers before it already use (:func:`best_count_by_cost`). Kept nodes form a tree: a child is never likelier
    than its parent."""
    ranked = ranked_nodes(candidates)
    confidences = [math.exp(candidates.scores[node]) for node in ranked]
    cost = None if costs is None else costs.cost
    tokens_per_cost = None if costs is None else costs.tokens_per_cost
    count = best_count_by_cost(
        confidences, step.max_nodes + 1, cost, tokens_per_cost, extra_rows=step.draft.num_nodes - 1
    )
    kept = sorted(ranked[:count], key=lambda node: (candidates.depths[node], node))
    index = {node: i + 1 for i, node in enumerate(kept)}
    index[0] = 0
    tokens = torch.tensor([candidates.tokens[node] for node in kept], dtype=torch.long, device=step.root.device)
    return proposers.Candidates(tokens, [index[candidates.parents[node]] for node in kept], source=source)


def tree_of_candidates(candidates: Candidates, kept: list[int], device: torch.device) -> DraftTree:
    """The :class:`DraftTree` of the root and the ``kept`` nodes (an ancestor-closed set), shallow first."""
    order = [0] + sorted(kept, key=lambda node: (candidates.depths[node], node))
    index = {node: i for i, node in enumerate(order)}
    parents = [index[candidates.parents[node]] for node in order]
    mask = torch.eye(len(order), dtype=torch.bool)
    for i in range(1, len(order)):
        mask[i] |= mask[parents[i]]
    return DraftTree(
        tokens=torch.tensor([candidates.tokens[node] for node in order], dtype=torch.long, device=device),
        parents=torch.tensor(parents, dtype=torch.long),
        node_depths=torch.tensor([candidates.depths[node] for node in order], dtype=torch.long),
        ancestor_mask=mask,
        sources=("root",) + ("drafter",) * (len(order) - 1),
    )
