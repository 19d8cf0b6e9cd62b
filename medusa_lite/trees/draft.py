"""One step's draft: the candidate tree every proposer adds to, verified in one target forward.

Node 0 is the root (the token the target produced last, not yet in the KV cache); every other
node is a guess for the token after its parent. Siblings hold distinct tokens (the draft is a
trie), so the acceptance rule can follow the child equal to a token. Each node records its
``source`` (the proposer that proposed it first). A node drawn at random records how: a
:class:`Draw` holds the distribution ``q`` its token was sampled from, so the acceptance rule can
use min(1, p/q) and the residual (:mod:`medusa_lite.decoding.acceptance`); a node without a draw is a
deterministic guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROOT_SOURCE = "root"
HEADS_SOURCE = "heads"
PROMPT_LOOKUP_SOURCE = "prompt_lookup"
DATASTORE_SOURCE = "datastore"
# Sources copied from text (prompt lookup, datastore): what GenerationStats.lookup_steps counts.
LOOKUP_SOURCES = frozenset({PROMPT_LOOKUP_SOURCE, DATASTORE_SOURCE})


@dataclass(frozen=True)
class Draw:
    """Node ``node`` (a child of ``parent``) holds a token sampled from ``q`` [V].

    ``q`` is the distribution the token was drawn from given the node's ancestors and the draws
    made before it at ``parent`` (for sampling without replacement: the earlier siblings removed
    and the rest renormalised). Draws at a parent are listed in the order they were made.
    """

    parent: int
    node: int
    q: torch.Tensor


@dataclass(frozen=True)
class DraftTree:
    """The tokens verified in one step and their tree shape (duck-types :class:`~medusa_lite.trees.tree.Tree`)."""

    tokens: torch.Tensor  # [N] node 0 is the root
    parents: torch.Tensor  # [N] (the root is its own parent)
    node_depths: torch.Tensor  # [N]
    ancestor_mask: torch.Tensor  # [N, N]: mask[i, j] when node j is node i or one of its ancestors
    sources: tuple[str, ...]  # [N] who proposed each node first
    draws: tuple[Draw, ...] = ()  # the nodes drawn at random, in the order they were drawn

    @property
    def num_nodes(self) -> int:
        return self.tokens.numel()

    @property
    def depth(self) -> int:
        return int(self.node_depths.max())

    @property
    def from_lookup(self) -> torch.Tensor:
        """[N] bool: nodes that only a lookup (prompt or datastore) proposed."""
        return torch.tensor([source in LOOKUP_SOURCES for source in self.sources], dtype=torch.bool)


def root_draft(root_token: torch.Tensor) -> DraftTree:
    """The draft of a step before any proposer: the root alone."""
    return DraftTree(
        tokens=root_token.reshape(1).to(torch.long),
        parents=torch.zeros(1, dtype=torch.long),
        node_depths=torch.zeros(1, dtype=torch.long),
        ancestor_mask=torch.ones(1, 1, dtype=torch.bool),
        sources=(ROOT_SOURCE,),
    )


def draft_tree(tree, tokens: torch.Tensor, source: str = HEADS_SOURCE) -> DraftTree:
    """A static tree's shape with this step's tokens (no copies of the shape tensors)."""
    return DraftTree(
        tokens, tree.parents, tree.node_depths, tree.ancestor_mask, (ROOT_SOURCE,) + (source,) * (tokens.numel() - 1)
    )


def graft(base: DraftTree, other: DraftTree) -> DraftTree:
    """``base`` with ``other``'s nodes merged in as a trie (both share the root).

    A node of ``other`` whose token a sibling in ``base`` already holds reuses that node (keeping
    ``base``'s source); the rest become new nodes after ``base``'s, in ``other``'s order.
    ``other``'s draws are kept, pointing at the merged nodes, after ``base``'s.
    """
    if other.num_nodes == 1 and not other.draws:
        return base
    tokens, parents, depths = base.tokens.tolist(), base.parents.tolist(), base.node_depths.tolist()
    sources = list(base.sources)
    first_new = len(tokens)
    child = {(parents[j], tokens[j]): j for j in range(1, first_new)}
    where = [0] * other.num_nodes  # other's node -> merged node
    other_tokens, other_parents = other.tokens.tolist(), other.parents.tolist()
    for j in range(1, other.num_nodes):
        parent, token = where[other_parents[j]], other_tokens[j]
        node = child.get((parent, token))
        if node is None:
            node = len(tokens)
            tokens.append(token)
            parents.append(parent)
            depths.append(depths[parent] + 1)
            sources.append(other.sources[j])
            child[(parent, token)] = node
        where[j] = node
    draws = base.draws + tuple(Draw(where[draw.parent], where[draw.node], draw.q) for draw in other.draws)
    size = len(tokens)
    if size == first_new:
        return DraftTree(base.tokens, base.parents, base.node_depths, base.ancestor_mask, base.sources, draws)
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:first_new, :first_new] = base.ancestor_mask
    for j in range(first_new, size):
        mask[j] = mask[parents[j]]
        mask[j, j] = True
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long, device=base.tokens.device),
        parents=torch.tensor(parents, dtype=torch.long),
        node_depths=torch.tensor(depths, dtype=torch.long),
        ancestor_mask=mask,
        sources=tuple(sources),
        draws=draws,
    )


def chain_draft(root_token: torch.Tensor, chain: torch.Tensor, source: str) -> DraftTree:
    """A draft of one chain: the root, then ``chain``'s tokens, each the child of the one before."""
    count = chain.numel()
    return DraftTree(
        tokens=torch.cat([root_token.reshape(1).to(chain.device), chain]),
        parents=torch.arange(-1, count).clamp(min=0),
        node_depths=torch.arange(count + 1),
        ancestor_mask=torch.ones(count + 1, count + 1, dtype=torch.bool).tril(),
        sources=(ROOT_SOURCE,) + (source,) * count,
    )


def graft_chain(draft: DraftTree, chain: torch.Tensor, source: str = PROMPT_LOOKUP_SOURCE) -> DraftTree:
    """Merge ``chain`` (guesses for the tokens after the root) into ``draft`` as a trie (see :func:`graft`)."""
    return graft(draft, chain_draft(draft.tokens[:1], chain, source)) if chain.numel() else draft


def draft_prefix(draft: DraftTree, nodes: int) -> DraftTree:
    """The draft's first ``nodes`` nodes (at least the root), a tree of their own: every node comes after its parent
    and a parent's draws are listed in the order of their nodes, so the kept draws are the first ones drawn."""
    if nodes >= draft.num_nodes:
        return draft
    nodes = max(nodes, 1)
    return DraftTree(
        draft.tokens[:nodes],
        draft.parents[:nodes],
        draft.node_depths[:nodes],
        draft.ancestor_mask[:nodes, :nodes],
        draft.sources[:nodes],
        tuple(draw for draw in draft.draws if draw.node < nodes),
    )


def first_path(draft: DraftTree) -> torch.Tensor:
    """The tokens after the root along each node's first child: a chain draft's guesses in order."""
    parents = draft.parents.tolist()
    path, node = [], 0
    for j in range(1, draft.num_nodes):
        if parents[j] == node:
            path.append(j)
            node = j
    return draft.tokens[path]
