"""The exact acceptance rule: which path of a verified draft to keep, and the bonus token.

At every draft node the target gives p, its next-token distribution there (after temperature,
top-k, top-p). Walking down from the root, at each node:

1. Drawn children (:class:`~medusa_lite.trees.draft.Draw`, token x ~ q), in the order they were drawn:
   accept x with probability min(1, p(x) / q(x)); on rejection continue with the residual
   p <- norm(max(p - q, 0)) (SpecInfer's recursive rejection sampling; EAGLE's for a tree). Each
   step keeps the identity min(q, p) + max(p - q, 0) = p: accepting x outputs exactly p's mass
   that q covers, the residual exactly the rest, so the token leaving the node has distribution p.
2. Then draw t from what is left of p and descend to the child holding t, if there is one
   (deterministic children, and drawn ones that were rejected but hold t: their rows were
   verified for exactly that token); otherwise t is the step's bonus token.

Deterministic guesses alone (no draws) reduce to "draw t ~ p at every node, descend while t is
a child" (:func:`accepted_path`), which draws all nodes' tokens in one call; greedy decoding
(p one-hot at the argmax) makes every rule the same: follow the argmax. Both are exact: every
emitted token is distributed as the target's next token given exactly the tokens before it.
"""

from __future__ import annotations

import torch

from medusa_lite.decoding.sampling import SamplingSettings, logits_to_probs, pick_tokens
from medusa_lite.trees.draft import DraftTree


def accepted_path(tree, candidates: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Node indices root..deepest of the longest path whose every guess equals the target's token.

    Node j's guess is right when it equals the target's token at its parent; a node is accepted
    when it and all its ancestors are right. Siblings hold distinct guesses, so the accepted
    nodes form one chain; node indices grow with depth, so sorting them orders the chain.
    """
    parents = tree.parents.to(candidates.device)
    right = candidates == target_tokens[parents]
    right[0] = True
    ancestors = tree.ancestor_mask.to(candidates.device)
    accepted = ~(ancestors & ~right[None, :]).any(dim=-1)
    deepest = int(torch.argmax(torch.where(accepted, tree.node_depths.to(candidates.device), -1)))
    return torch.nonzero(ancestors[deepest]).squeeze(-1)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): what p still has to give after a draw from q was rejected.

    When p <= q everywhere (p == q) a rejection has probability 0; p is returned unchanged.
    """
    residual = (p - q).clamp_(min=0)
    total = residual.sum()
    return residual / total if total > 0 else p


def accepts_draw(p_x: float, q_x: float, uniform: float) -> bool:
    """Accept a token drawn from q with probability min(1, p(x) / q(x)), given a uniform draw in [0, 1)."""
    return uniform * q_x < p_x


def accept_at_node(
    p: torch.Tensor, draws: list[tuple[int, int, torch.Tensor]], children: dict[int, int], generator
) -> tuple[int | None, int]:
    """(the child to descend to or None, the token leaving the node) under target distribution ``p``.

    ``draws``: (child, its token, q) in draw order; ``children``: token -> child node.
    """
    for child, token, q in draws:
        uniform = float(torch.rand((), generator=generator, device=p.device))
        if accepts_draw(float(p[token]), float(q[token]), uniform):
            return child, token
        p = residual_distribution(p, q)
    token = int(torch.multinomial(p, 1, generator=generator))
    return children.get(token), token


def walk_with_draws(draft: DraftTree, probs: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted node indices root..deepest, the bonus token [1]) for a draft holding drawn nodes."""
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    children: dict[int, dict[int, int]] = {}
    for j in range(1, draft.num_nodes):
        children.setdefault(parents[j], {})[tokens[j]] = j
    draws: dict[int, list] = {}
    for draw in draft.draws:
        draws.setdefault(draw.parent, []).append(
            (draw.node, tokens[draw.node], draw.q.to(probs.device, torch.float32))
        )
    path, node = [0], 0
    while True:
        child, token = accept_at_node(probs[node], draws.get(node, []), children.get(node, {}), generator)
        if child is None:
            device = draft.tokens.device
            return torch.tensor(path, dtype=torch.long, device=device), torch.tensor(
                [token], dtype=torch.long, device=device
            )
        path.append(child)
        node = child


def accept(
    draft: DraftTree, logits: torch.Tensor, settings: SamplingSettings, generator=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted node indices root..deepest, the bonus token [1]) from the target's logits at every node [N, V]."""
    if settings.greedy or not draft.draws:
        target_tokens = pick_tokens(logits, settings, generator)
        path = accepted_path(draft, draft.tokens, target_tokens)
        return path, target_tokens[path[-1:]]
    return walk_with_draws(draft, logits_to_probs(logits, settings), generator)
