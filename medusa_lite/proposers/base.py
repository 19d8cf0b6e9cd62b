"""Proposers: every source of guesses feeds one draft tree, which the target verifies exactly.

A :class:`Proposer` is given this step's context (:class:`StepContext`: the committed tokens,
the target's last hidden state, the root token, the draft so far, its node budget) and returns
:class:`Candidates`: guesses hanging from the root, each with the distribution q it was drawn
from when it was drawn at random. ``generate`` checks them (:class:`ProposerError` names the
proposer), merges them into the step's draft as a trie, verifies the draft in one forward,
accepts exactly (:mod:`medusa_lite.decoding.acceptance`) and then tells every proposer what was accepted
(:meth:`Proposer.accepted`), so a proposer with state (a draft model's KV cache) keeps in step.

Proposers run in the order given; each sees the draft the earlier ones built (the heads' dynamic
tree sizes itself around the lookup chain already there). Which lookup wins is data:
:class:`FirstOf` asks its members in order and keeps the first that proposes anything.

A proposer's :meth:`~Proposer.max_nodes` is the most nodes it adds in a step; their sum plus the
root is the step's row budget (:func:`row_budgets`), what the KV cache and packed weights are
sized for. Configured proposers are specifications; :meth:`~Proposer.begin` returns the one that
runs for one generation (the same object when it keeps no state).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

import torch

from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.errors import GenerationInputError, MedusaError
from medusa_lite.trees.draft import DraftTree, Draw, draft_tree, graft
from medusa_lite.trees.dynamic_tree import BatchCosts, DynamicTree
from medusa_lite.trees.tree import Tree

if TYPE_CHECKING:
    from medusa_lite.decoding.model import MedusaModel

# A drawn node's q must sum to 1 within this (float32 softmax rounding over a large vocabulary).
PROBABILITY_SUM_TOLERANCE = 1e-3


class ProposerError(MedusaError, ValueError):
    """A proposer returned malformed candidates (shape, ids, depth, duplicates, q) or broke its budget."""


@dataclass(frozen=True)
class StepLimits:
    """What bounds a proposer's share of a step: the model, the deepest guess allowed (None: no
    bound known yet, e.g. when packing weights at load time), the rows proposers before it may use
    (root included), and how many sequences are decoded side by side (a step verifies one draft for each:
    :mod:`medusa_lite.decoding.batch`); ``batch_costs(max_rows)``: what such a batch's steps cost on this machine,
    up to ``max_rows`` rows a sequence (None: estimated from one sequence's, :meth:`DynamicTree.for_batch`)."""

    model: MedusaModel
    max_depth: int | None
    rows_before: int = 1
    batch_size: int = 1
    batch_costs: Callable[[int], BatchCosts] | None = None

    def batch_priced(self, policy: DynamicTree) -> DynamicTree:
        """``policy`` priced for one sequence of the batch, in plain steps of the batch."""
        if self.batch_size == 1:
            return policy
        measured = None if self.batch_costs is None else self.batch_costs(len(policy.row_costs))
        return policy.for_batch(self.batch_size, measured)


@dataclass(frozen=True)
class TargetStates:
    """The target's hidden states at m consecutive committed positions, oldest first: the final (post-norm) ones
    [m, H], and the layers the running proposers asked for (:attr:`Proposer.feature_layers`), each [m, H],
    keyed by their index into the model's ``hidden_states``."""

    final: torch.Tensor
    layers: Mapping[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, output, layers: Sequence[int], rows=slice(None)) -> TargetStates:
        """The states at ``rows`` (an index into the sequence) of an unbatched
        :class:`~medusa_lite.decoding.model.TargetOutput`, with its ``layers``."""
        return cls(output.hidden[rows], {i: output.layers[i][rows] for i in layers})

    def features(self, layers: Sequence[int] | None) -> torch.Tensor:
        """[m, H x len(layers)]: those layers side by side, in that order (None: the final states alone)."""
        return self.final if layers is None else torch.cat([self.layers[i] for i in layers], dim=-1)

    def then(self, later: TargetStates) -> TargetStates:
        """These states followed by ``later``'s (the same layers)."""
        return TargetStates(
            torch.cat([self.final, later.final]), {i: torch.cat([x, later.layers[i]]) for i, x in self.layers.items()}
        )

    def emptied(self) -> TargetStates:
        return TargetStates(self.final[:0], {i: x[:0] for i, x in self.layers.items()})


@dataclass(frozen=True)
class StepContext:
    """What a proposer sees in one decoding step."""

    model: MedusaModel
    history: torch.Tensor  # [L] the prompt and every committed token; the last one is the root
    root: torch.Tensor  # [1] the token the target produced last (node 0 of the draft)
    hidden: torch.Tensor  # [H] the target's last hidden state (the one that produced the root)
    draft: DraftTree  # what the proposers before this one proposed
    max_depth: int  # the deepest guess allowed this step (length limit)
    max_nodes: int  # the most nodes this proposer may add this step (its share of the row budget)
    settings: SamplingSettings  # the target's sampling settings (a sampling proposer's q should use them)
    generator: torch.Generator | None = None
    # the target's hidden states that produced the last m committed tokens (history[-m:]) since the
    # proposers were last asked: the whole prompt's at the first step (what a drafter reading the
    # target's features, medusa_lite.drafters.sequential.proposer, appends to its own cache)
    fresh: TargetStates | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What verification kept: the draft, its accepted node indices (root first) and the committed tokens."""

    draft: DraftTree
    path: torch.Tensor  # [a + 1] node indices, the root first
    tokens: torch.Tensor  # [a + 1] the accepted guesses, then the bonus token (before any EOS cut)
    side_logits: torch.Tensor | None = None  # [M, V] the target's logits at this proposer's side rows, if it had any


@dataclass(frozen=True)
class SideRows:
    """Extra rows a proposer has the target run in the verification forward (lookahead decoding's
    Jacobi window): ``tokens`` [M] at ``offsets`` [M] positions after the root, each attending to the
    cached text, the root and the side rows ``mask`` [M, M] allows. No draft node attends to them
    and the cache keeps none of them; their logits come back in :attr:`StepOutcome.side_logits`."""

    tokens: torch.Tensor
    offsets: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True)
class Candidates:
    """Guesses hanging from the step's root: node i + 1 holds ``tokens[i]`` and is a child of node
    ``parents[i]`` (0 = the root, j = ``tokens[j - 1]``; so ``parents[i] <= i``).

    ``q``: None (every guess deterministic), or per node None or the distribution [V] (float, the
    target's vocabulary) its token was sampled from, given its ancestors and the siblings drawn
    before it (sample siblings without replacement: remove each drawn token from q and
    renormalise before the next). Siblings must hold distinct tokens.
    ``source``: the label in stats (None: the proposer's ``name``). ``shape``: set by the heads,
    whose guesses fill a fixed :class:`Tree`: its precomputed mask is reused and its rows go first.
    """

    tokens: torch.Tensor
    parents: Sequence[int] | torch.Tensor
    q: Sequence[torch.Tensor | None] | None = None
    source: str | None = None
    shape: Tree | None = field(default=None, repr=False)

    @classmethod
    def chain(
        cls, tokens: torch.Tensor, q: Sequence[torch.Tensor | None] | None = None, source: str | None = None
    ) -> Candidates:
        """One chain from the root: each token the child of the one before."""
        return cls(tokens, list(range(tokens.numel())), q, source)

    def __len__(self) -> int:
        return self.tokens.numel() if isinstance(self.tokens, torch.Tensor) else 0


class Proposer:
    """One source of guesses. Subclasses set ``name`` and implement :meth:`max_nodes` and :meth:`propose`."""

    name: ClassVar[str] = "proposer"

    def begin(self, model: MedusaModel, prompt: torch.Tensor, limits: StepLimits) -> Proposer:
        """The proposer that runs for one generation of ``prompt`` (self when it keeps no state).

        Called before the prefill; should check its settings against ``model`` and stay cheap.
        """
        return self

    def max_nodes(self, limits: StepLimits) -> int:
        """The most nodes :meth:`propose` adds in one step (what the cache and packed weights reserve)."""
        raise NotImplementedError

    def propose(self, step: StepContext) -> Candidates | None:
        """This step's guesses, or None."""
        raise NotImplementedError

    def side_rows(self, step: StepContext) -> SideRows | None:
        """Rows to run beside this step's draft in the same forward (:class:`SideRows`), or None (the default)."""
        return None

    def accepted(self, outcome: StepOutcome) -> None:
        """Called after every verification with what was accepted (roll back a cache, update statistics)."""

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target's layers (indices into its ``hidden_states``) this proposer reads in :attr:`StepContext.fresh`
        besides the final hidden state; ``generate`` keeps only the layers some proposer asks for."""
        return ()

    @property
    def pricing(self) -> DynamicTree | None:
        """The measured step costs this proposer sizes its guesses by (a :class:`DynamicTree`'s ``row_costs`` and
        its ``proposal_cost``), or None. ``generate``'s speculation gate prices steps with the first one found."""
        return None


# -- checking and merging what a proposer returns ---------------------------------------------
def as_draft(candidates: Candidates, step: StepContext, name: str) -> DraftTree:
    """The draft of ``candidates`` (root + nodes), checked; a :class:`ProposerError` naming ``name`` if malformed."""

    def refuse(problem: str) -> ProposerError:
        return ProposerError(f"proposer {name!r} returned malformed candidates: {problem}")

    if not isinstance(candidates, Candidates):
        raise refuse(f"expected medusa_lite.Candidates or None, got {type(candidates).__name__}")
    tokens = candidates.tokens
    if (
        not isinstance(tokens, torch.Tensor)
        or tokens.dim() != 1
        or tokens.dtype.is_floating_point
        or tokens.dtype == torch.bool
    ):
        raise refuse(f"tokens must be a 1-D tensor of integer ids, got {describe(tokens)}")
    count = tokens.numel()
    if count > step.max_nodes:
        raise refuse(f"{count} nodes, more than the {step.max_nodes} it may add per step (its max_nodes)")
    tokens = tokens.to(device=step.root.device, dtype=torch.long)
    vocab_size = step.model.vocab_size
    if count and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        bad = int(tokens.min()) if int(tokens.min()) < 0 else int(tokens.max())
        raise refuse(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    parents = candidates.parents.tolist() if isinstance(candidates.parents, torch.Tensor) else list(candidates.parents)
    if len(parents) != count:
        raise refuse(f"{len(parents)} parents for {count} tokens")
    depths, seen = [0], set()
    for i, (parent, token) in enumerate(zip(parents, tokens.tolist())):
        if isinstance(parent, bool) or not isinstance(parent, int) or not 0 <= parent <= i:
            raise refuse(f"node {i + 1}'s parent must be an earlier node in 0..{i} (0 = the root), got {parent!r}")
        if (parent, token) in seen:
            raise refuse(
                f"token {token} appears twice among the children of node {parent} (siblings must be distinct)"
            )
        seen.add((parent, token))
        depths.append(depths[parent] + 1)
    if count and max(depths) > step.max_depth:
        raise refuse(
            f"a guess at depth {max(depths)}, past the {step.max_depth} this step allows "
            "(the context or max_new_tokens)"
        )
    draws = checked_draws(candidates.q, tokens, parents, vocab_size, refuse)
    source = candidates.source or name
    if candidates.shape is not None:
        if candidates.shape.num_nodes != count + 1 or candidates.shape.parents[1:].tolist() != parents:
            raise refuse("shape does not match the candidates' parents")
        return replace(draft_tree(candidates.shape, torch.cat([step.root, tokens]), source), draws=draws)
    parent_tensor = torch.tensor([0] + parents, dtype=torch.long)
    mask = torch.eye(count + 1, dtype=torch.bool)
    for j in range(1, count + 1):
        mask[j] |= mask[parents[j - 1]]
    sources = ("root",) + (source,) * count
    return DraftTree(torch.cat([step.root, tokens]), parent_tensor, torch.tensor(depths), mask, sources, draws)


def checked_draws(q, tokens: torch.Tensor, parents: list[int], vocab_size: int, refuse) -> tuple[Draw, ...]:
    """The candidates' drawn nodes as :class:`Draw` entries, each q checked: a distribution that can draw its token."""
    if q is None:
        return ()
    if isinstance(q, torch.Tensor) or len(q) != tokens.numel():
        raise refuse(
            f"q must be a sequence of one entry per node ({tokens.numel()}), each None or a [{vocab_size}] tensor"
        )
    draws = []
    for i, distribution in enumerate(q):
        if distribution is None:
            continue
        if (
            not isinstance(distribution, torch.Tensor)
            or not distribution.dtype.is_floating_point
            or tuple(distribution.shape) != (vocab_size,)
        ):
            raise refuse(
                f"q of node {i + 1} must be a float tensor of shape [{vocab_size}], got {describe(distribution)}"
            )
        distribution = distribution.float()
        total = float(distribution.sum())
        if (
            not bool(torch.isfinite(distribution).all())
            or float(distribution.min()) < 0
            or abs(total - 1) > PROBABILITY_SUM_TOLERANCE
        ):
            raise refuse(
                f"q of node {i + 1} is not a probability distribution (sum {total:.4g}, all finite and >= 0 required)"
            )
        token = int(tokens[i])
        if float(distribution[token]) <= 0:
            raise refuse(
                f"node {i + 1}'s token {token} has probability 0 under its q, so it cannot have been drawn from it"
            )
        draws.append(Draw(parents[i], i + 1, distribution))
    return tuple(draws)


def describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__


def add_candidates(draft: DraftTree, candidates: Candidates | None, step: StepContext, name: str) -> DraftTree:
    """``draft`` with a proposer's checked candidates merged in (a fixed-shape tree's rows first, reusing its mask)."""
    if candidates is None or (isinstance(candidates, Candidates) and len(candidates) == 0 and not candidates.q):
        return draft
    proposed = as_draft(candidates, step, name)
    return graft(proposed, draft) if candidates.shape is not None else graft(draft, proposed)


def row_budgets(
    proposers: Sequence[Proposer],
    model: MedusaModel,
    max_depth: int | None,
    batch_size: int = 1,
    batch_costs: Callable[[int], BatchCosts] | None = None,
) -> list[int]:
    """Each proposer's most nodes per step (per sequence of a batch of ``batch_size``, priced by ``batch_costs``: see
    :class:`StepLimits`), in order (the one place the step's row budget is computed)."""
    budgets, rows = [], 1
    for proposer in proposers:
        count = proposer.max_nodes(StepLimits(model, max_depth, rows, batch_size, batch_costs))
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ProposerError(f"proposer {proposer.name!r}: max_nodes must return an integer >= 0, got {count!r}")
        budgets.append(count)
        rows += count
    return budgets


def step_rows(proposers: Sequence[Proposer], model: MedusaModel, max_depth: int | None = None) -> int:
    """The most rows one step verifies: the root plus every proposer's most nodes."""
    return 1 + sum(row_budgets(proposers, model, max_depth))


def depth_cap(count: int, max_depth: int | None) -> int:
    return count if max_depth is None else max(min(count, max_depth), 0)


def propose_draft(proposers: Sequence[Proposer], budgets: Sequence[int], step: StepContext) -> DraftTree:
    """This step's draft: each proposer in turn adds its checked candidates to what the earlier ones proposed."""
    draft = step.draft
    for proposer, budget in zip(proposers, budgets):
        context = replace(step, draft=draft, max_nodes=budget)
        draft = add_candidates(draft, proposer.propose(context), context, proposer.name)
    return draft


def as_proposers(proposers) -> tuple[Proposer, ...]:
    """A proposer or a sequence of them as a tuple; a clear error for anything else."""
    proposers = (proposers,) if isinstance(proposers, Proposer) else tuple(proposers)
    for proposer in proposers:
        if not isinstance(proposer, Proposer):
            raise GenerationInputError(
                f"proposers must be medusa_lite.Proposer instances, got {type(proposer).__name__}"
            )
    return proposers


@dataclass(frozen=True)
class FirstOf(Proposer):
    """The first of ``members`` (asked in order) that proposes anything; its nodes keep its name as source."""

    members: tuple[Proposer, ...]
    name: ClassVar[str] = "first_of"

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))
        for member in self.members:
            if not isinstance(member, Proposer):
                raise GenerationInputError(
                    f"FirstOf members must be medusa_lite.Proposer instances, got {type(member).__name__}"
                )

    def begin(self, model, prompt, limits):
        return FirstOf(tuple(member.begin(model, prompt, limits) for member in self.members))

    def max_nodes(self, limits):
        return max((member.max_nodes(limits) for member in self.members), default=0)

    def propose(self, step):
        for member in self.members:
            candidates = member.propose(step)
            if candidates is not None and len(candidates):
                return replace(candidates, source=candidates.source or member.name)
        return None

    def accepted(self, outcome):
        for member in self.members:
            member.accepted(outcome)


def check_token_count(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GenerationInputError(f"{name} must be an integer >= 0 (0 turns that lookup off), got {value!r}")
