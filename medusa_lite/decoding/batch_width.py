"""How wide a batch's step is: the width at which the rows' drafts are expected to commit the most tokens per cost.

A batch's step verifies every row's draft in one forward, as wide as its widest row
(:mod:`medusa_lite.decoding.batch`), so a step of width w costs ``cost(w)``: one forward verifying w rows of
every row, in plain batched steps (measured on this machine: :mod:`medusa_lite.decoding.batch_costs`). A row cut
to w keeps its first w nodes (:func:`~medusa_lite.trees.draft.draft_prefix`, a tree of their own) and is expected
to commit ``1 +`` the acceptance probabilities of its first w - 1 nodes. The step takes the width that maximises
the batch's expected tokens per cost, ``sum over rows of expected tokens(w) / cost(w)``; width 1 is a plain
batched step (one token a row for about 1), so a step speculates only where the rows' guesses are expected to buy
more than their rows cost. Before the rows propose, :func:`speculation_may_pay` says whether any could: when no
width could pay for the rows' proposals, the step is a plain one and no proposer runs.

A node's acceptance probability is the product, along its path, of how often nodes of the same kind (their
source, depth and rank among their siblings: :data:`NodeKind`) were accepted when their parent was, in this
batch's earlier steps. The counts start from even odds (:data:`PRIOR_ACCEPTED`, :data:`PRIOR_REJECTED`) and fade
by a constant factor a step (:data:`RATE_MEMORY_STEPS`), so a rate follows the text, and a kind the steps stopped
verifying drifts back toward even odds and is tried again. A proposer's own confidence (the heads' softmax)
already chose its nodes; these rates put every source's nodes, the lookups' included, on one scale: what this
batch accepted.

Exactness is untouched: any cut of a draft is a smaller tree verified exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from medusa_lite.trees.draft import DraftTree

# (source, depth, rank among its siblings): nodes that are accepted about as often as each other.
NodeKind = tuple[str, int, int]
# A kind never verified is taken as even odds: one accepted and one rejected node of weight 1.
PRIOR_ACCEPTED = 1.0
PRIOR_REJECTED = 1.0
# Each step the counts fade by 1 - 1 / RATE_MEMORY_STEPS: about the last 32 steps speak, so a rate follows the text
# and a kind not verified for ~20 steps is halfway back to the prior.
RATE_MEMORY_STEPS = 32


def sibling_ranks(parents: Sequence[int]) -> list[int]:
    """Each node's rank among its parent's children, in node order (the root: 0)."""
    seen: dict[int, int] = {}
    ranks = [0]
    for parent in parents[1:]:
        ranks.append(seen.get(parent, 0))
        seen[parent] = ranks[-1] + 1
    return ranks


def node_kinds(draft: DraftTree) -> list[NodeKind]:
    """Every node's kind (the root's included, never used): its source, depth and rank among its siblings."""
    ranks = sibling_ranks(draft.parents.tolist())
    return list(zip(draft.sources, draft.node_depths.tolist(), ranks))


@dataclass(frozen=True)
class AcceptanceRates:
    """How often each kind of node was accepted when its parent was: faded counts of such nodes (``offered``) and of
    those accepted (``accepted``). Immutable: the loop keeps the latest."""

    offered: Mapping[NodeKind, float] = field(default_factory=dict)
    accepted: Mapping[NodeKind, float] = field(default_factory=dict)

    def rate(self, kind: NodeKind) -> float:
        accepted = self.accepted.get(kind, 0.0)
        return (accepted + PRIOR_ACCEPTED) / (self.offered.get(kind, 0.0) + PRIOR_ACCEPTED + PRIOR_REJECTED)

    def path_probabilities(self, draft: DraftTree) -> list[float]:
        """Each node's estimated probability of being accepted (the root: 1): its rate times its parent's."""
        parents = draft.parents.tolist()
        probabilities = [1.0]
        for node, kind in enumerate(node_kinds(draft)[1:], start=1):
            probabilities.append(probabilities[parents[node]] * self.rate(kind))
        return probabilities

    def after_step(self, verified: Sequence[tuple[DraftTree, torch.Tensor]]) -> AcceptanceRates:
        """The rates after a step: the counts faded, then every verified node whose parent was accepted counted
        (``verified``: each row's draft as verified and its accepted path, the root first)."""
        keep = 1.0 - 1.0 / RATE_MEMORY_STEPS
        offered = {kind: keep * count for kind, count in self.offered.items()}
        accepted = {kind: keep * count for kind, count in self.accepted.items()}
        for draft, path in verified:
            on_path = set(path.tolist())
            parents = draft.parents.tolist()
            for node, kind in enumerate(node_kinds(draft)[1:], start=1):
                if parents[node] in on_path:
                    offered[kind] = offered.get(kind, 0.0) + 1.0
                    accepted[kind] = accepted.get(kind, 0.0) + (node in on_path)
        return AcceptanceRates(offered, accepted)


def expected_tokens(probabilities: Sequence[float]) -> list[float]:
    """[k - 1]: the tokens a row commits in expectation when cut to its first k nodes (k = 1 .. its nodes): the bonus
    token, plus its kept guesses' acceptance probabilities (``probabilities``: the root's first)."""
    totals, total = [], 0.0
    for probability in probabilities:
        total += probability
        totals.append(total)
    return totals


def best_width(expected: Sequence[Sequence[float]], cost: Callable[[int], float], least: int = 1) -> int:
    """The step's width, at least ``least``: the w maximising the rows' expected tokens over ``cost(w)``
    (``expected[b][k - 1]``: row b's when cut to k nodes, :func:`expected_tokens`; a row narrower than w keeps its
    own). The narrowest of equals."""
    widest = max([least, *(len(row) for row in expected)])
    best, best_value = least, -1.0
    for width in range(least, widest + 1):
        value = sum(row[min(width, len(row)) - 1] for row in expected) / cost(width)
        if value > best_value:
            best, best_value = width, value
    return best


def likeliest_chain(rates: AcceptanceRates, depth: int) -> list[float]:
    """[depth + 1]: the path probabilities of a chain whose every guess is as likely as the likeliest first-ranked kind
    of its depth seen so far (a depth never seen: even odds), the root's first: more than any row's draft is
    expected to be worth."""
    best: dict[int, float] = {}
    for kind in rates.offered:
        _, node_depth, rank = kind
        if rank == 0:
            best[node_depth] = max(best.get(node_depth, 0.0), rates.rate(kind))
    even = PRIOR_ACCEPTED / (PRIOR_ACCEPTED + PRIOR_REJECTED)
    probabilities = [1.0]
    for d in range(1, depth + 1):
        probabilities.append(probabilities[-1] * best.get(d, even))
    return probabilities


def speculation_may_pay(
    rates: AcceptanceRates, cost: Callable[[int], float], proposal_cost: float, widest: int
) -> bool:
    """Whether the batch's rows are worth asking for guesses this step: whether, were every row's draft the
    :func:`likeliest_chain`, some width up to ``widest`` would commit more tokens per cost than a plain batched step,
    its proposals' cost (``proposal_cost``: every row's, in plain batched steps) counted. When not, the step is a plain
    one and no proposer runs; as the rates fade toward even odds the rows are asked again."""
    expected = expected_tokens(likeliest_chain(rates, widest - 1))
    plain = 1.0 / cost(1)
    return any(expected[width - 1] / (cost(width) + proposal_cost) > plain for width in range(2, widest + 1))
