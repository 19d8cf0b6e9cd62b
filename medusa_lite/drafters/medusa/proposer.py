"""The Medusa heads as a proposer: their top-k guesses on a fixed :class:`Tree`, or on the tree a
:class:`DynamicTree` picks each step from the heads' confidence, sized around what earlier proposers
(the lookups) already put in the draft.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import torch

from medusa_lite.proposers.base import Candidates, Proposer, StepLimits, as_proposers
from medusa_lite.proposers.datastore import Datastore
from medusa_lite.proposers.lookup import DEFAULT_DATASTORE_TOKENS, DEFAULT_LOOKUP_TOKENS, default_lookups
from medusa_lite.trees.draft import HEADS_SOURCE, DraftTree, draft_tree, first_path, graft_chain
from medusa_lite.trees.dynamic_tree import DynamicTree, chain_ranks
from medusa_lite.trees.tree import Tree, as_tree, check_topk_fits

if TYPE_CHECKING:
    from medusa_lite.decoding.model import MedusaModel

NO_CHAIN = torch.zeros(0, dtype=torch.long)


def tree_tokens(tree: Tree, root_token: torch.Tensor, guesses: torch.Tensor) -> torch.Tensor:
    """Tree tokens [N]: the root, then at a node of depth d and rank r ``guesses[d - 1, r]`` (head d's r-th best)."""
    depths, ranks = tree.node_depths[1:].to(guesses.device), tree.node_ranks[1:].to(guesses.device)
    return torch.cat([root_token.view(1), guesses[depths - 1, ranks]])


def head_guesses(model: MedusaModel, hidden: torch.Tensor, root_token: torch.Tensor, tree: Tree) -> torch.Tensor:
    """Tree tokens [N]: the root, then at each node of depth d head d's guess of that node's rank."""
    if tree.depth == 0:
        return root_token.view(1)
    guesses = model.head_topk(
        hidden, max(tree.topk_per_depth()), tree.depth, next_tokens=root_token.view(())
    )  # [depth, k]
    return tree_tokens(tree, root_token, guesses)


def dynamic_step_tree(
    model: MedusaModel,
    hidden: torch.Tensor,
    root_token: torch.Tensor,
    policy: DynamicTree,
    chain: torch.Tensor,
    chain_length: int | None = None,
) -> tuple[Tree, torch.Tensor]:
    """(this step's tree, its tokens [N]): the policy's choice from the heads' confidence in their guesses.

    ``chain``: the guesses already in the draft along its first path; ``chain_length``: the nodes
    already in the draft besides the root (default: the chain's length).
    """
    depth = min(policy.depth, model.num_heads)
    if depth == 0 or policy.max_nodes == 1:
        return policy.choose([]), root_token.view(1)
    ranks = min(policy.max_nodes - 1, model.guess_vocab_size)  # all nodes may be siblings
    guesses, probabilities = model.head_topk_probabilities(
        hidden, ranks, depth, next_tokens=root_token.view(())
    )  # [depth, k]
    length = chain.numel() if chain_length is None else chain_length
    tree = policy.choose(probabilities.tolist(), chain_ranks(guesses, chain), length)
    return tree, tree_tokens(tree, root_token, guesses)


def useful_nodes(policy: DynamicTree, depth: int, rows_before: int) -> int:
    """The most nodes (root included) ``policy`` can ever choose for heads ``depth`` deep after ``rows_before`` rows.

    A step accepts at most ``depth`` of the heads' guesses, so a tree is only chosen over the bare
    root while ``tokens_per_cost * (cost(its rows) - cost(rows_before)) < depth``: nodes past that
    would never be kept, and reserving room or ranking paths for them is wasted.
    """
    budget = depth / policy.tokens_per_cost + policy.cost(rows_before)
    low, high = 0, policy.max_nodes - 1  # guesses: the largest count with cost(1 + count) < budget
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if policy.cost(1 + middle) < budget else (low, middle - 1)
    return 1 + low


@dataclass(frozen=True)
class MedusaHeadsProposer(Proposer):
    """The Medusa heads' guesses on a :class:`Tree`, or on the tree a :class:`DynamicTree` picks each
    step (sized jointly with the nodes earlier proposers put in the draft). ``tree``: a Tree, a
    DynamicTree, a list of rank paths, or None for ``model.tree``. Proposes nothing for a model without heads."""

    tree: Tree | DynamicTree | Sequence[Sequence[int]] | None = None
    name: ClassVar[str] = HEADS_SOURCE

    def resolved(self, limits: StepLimits) -> Tree | DynamicTree:
        model = limits.model
        tree = (as_tree(self.tree, model.num_heads) if self.tree is not None else model.tree).pruned(model.num_heads)
        if isinstance(tree, Tree):
            check_topk_fits(tree, model.guess_vocab_size)
            return tree
        tree = limits.batch_priced(tree)
        depth = min(tree.depth, model.num_heads, math.inf if limits.max_depth is None else limits.max_depth)
        nodes = useful_nodes(tree, depth, limits.rows_before) if depth > 0 else 1
        return tree if nodes >= tree.max_nodes else replace(tree, max_nodes=nodes)

    def begin(self, model, prompt, limits):
        return MedusaHeadsProposer(self.resolved(limits))

    @property
    def pricing(self) -> DynamicTree | None:
        return self.tree if isinstance(self.tree, DynamicTree) else None

    def max_nodes(self, limits):
        if limits.model.heads is None:
            return 0
        tree = self.resolved(limits)
        return (tree.pruned(limits.max_depth) if limits.max_depth is not None else tree).num_nodes - 1

    def propose(self, step):
        if step.model.heads is None:
            return None
        tree = self.tree.pruned(step.max_depth)
        if isinstance(tree, DynamicTree):
            chain = first_path(step.draft)
            tree, tokens = dynamic_step_tree(step.model, step.hidden, step.root, tree, chain, step.draft.num_nodes - 1)
        else:
            tokens = head_guesses(step.model, step.hidden, step.root, tree)
        return Candidates(tokens[1:], tree.parents[1:], shape=tree)


def default_proposers(
    tree: Tree | DynamicTree | Sequence[Sequence[int]] | None = None,
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS,
    datastore: Datastore | bool | None = True,
    datastore_tokens: int = DEFAULT_DATASTORE_TOKENS,
) -> tuple[Proposer, ...]:
    """The lookups (:func:`default_lookups`), then the heads on ``tree`` (None: ``model.tree``), sized around them."""
    return (default_lookups(lookup_tokens, datastore, datastore_tokens), MedusaHeadsProposer(tree))


def model_proposers(model: MedusaModel) -> tuple[Proposer, ...]:
    """The proposers ``generate`` uses for ``model`` when given none: ``model.proposers``, else the default set."""
    return default_proposers() if model.proposers is None else as_proposers(model.proposers)


def heads_draft(
    model: MedusaModel,
    hidden: torch.Tensor,
    root_token: torch.Tensor,
    tree: Tree | DynamicTree,
    lookup_chain: torch.Tensor | None = None,
) -> DraftTree:
    """The heads' guesses on ``tree`` (or the tree a dynamic policy picks), plus a lookup chain grafted on
    (what calibration times: one proposal of the heads outside ``generate``)."""
    chain = lookup_chain if lookup_chain is not None else NO_CHAIN
    if isinstance(tree, DynamicTree):
        tree, tokens = dynamic_step_tree(model, hidden, root_token, tree, chain)
    else:
        tokens = head_guesses(model, hidden, root_token, tree)
    draft = draft_tree(tree, tokens)
    return graft_chain(draft, chain) if chain.numel() else draft
