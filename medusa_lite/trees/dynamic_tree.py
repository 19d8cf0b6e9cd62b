"""Dynamic trees: each step's candidate tree sized to the heads' confidence and the cost of rows.

A static tree verifies the same guesses every step, but the heads know when they are sure: after
"The capital of France is" head 1's best guess may carry probability 0.9, in the middle of a
free-form sentence 0.2. A dynamic tree (EAGLE-2's idea, here over Medusa heads' softmax) ranks
this step's paths of top-k ranks by path confidence, the product of the heads' probabilities
along the path (:func:`~medusa_lite.trees.tree.ranked_paths`), and keeps the first n of them. The sum
of the kept paths' confidences estimates the guesses the step will accept.

How many: verifying more rows costs more, by a table measured on the machine that decodes
(``row_costs``, in plain decoding steps: :mod:`medusa_lite.trees.costs`, which ``medusa_lite.load``
applies; never another machine's). Decoding maximises tokens per unit of cost over the whole
generation; a step serves that ratio best when it maximises ``expected tokens - tokens_per_cost *
cost(rows)``, with ``tokens_per_cost`` the ratio decoding achieves (Dinkelbach's method for ratio
objectives). The rows counted include the prompt-lookup / datastore chain grafted on afterwards,
less the chain's tokens that coincide with kept nodes (they share rows).

Exactness is untouched: the acceptance rule gives the target's distribution for any candidates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from medusa_lite.errors import TreeError
from medusa_lite.trees.tree import Path, Tree, ranked_paths

# Most nodes (root included) a dynamic step verifies before the lookup chain. Replay on held-out
# self-distilled prompts (benchmarks/dynamic_tree/): 8 and 16 predict the same speed-up; 8 keeps
# the rows within what the packed weights serve fast.
DEFAULT_MAX_NODES = 8
# Expected tokens one unit of step cost must buy (a one-row step costs 1). The replay's best
# policies achieve ~1.9-2.0 tokens per unit; 1.5-3.0 all predict within 0.02x of the best.
DEFAULT_TOKENS_PER_COST = 2.0
# Costs of a policy whose machine has not been measured yet: each row costs a whole step, so no
# guess pays and every step is a plain one until medusa_lite.trees.costs measures this machine.
UNMEASURED_ROW_COSTS = (1.0,)


@dataclass(frozen=True)
class BatchCosts:
    """What the steps of ``batch_size`` sequences decoded side by side cost on this machine
    (:func:`medusa_lite.decoding.batch_costs.batch_step_costs`): ``row_costs[r - 1]``, one forward verifying r
    rows of every sequence, in plain batched steps (one new token for every sequence); ``plain_step_ratio``, a
    plain batched step over a one-sequence plain step (the unit of a policy's ``proposal_cost``)."""

    batch_size: int
    row_costs: tuple[float, ...]
    plain_step_ratio: float


@dataclass(frozen=True)
class DynamicTree:
    """A per-step tree policy: up to ``max_nodes`` nodes, sized by ``row_costs`` and ``tokens_per_cost``.

    ``row_costs[r - 1]``: the cost of a decoding step verifying r rows, in plain one-token steps
    (:mod:`medusa_lite.trees.costs`); past the table, cost grows in proportion to rows. ``proposal_cost``:
    what asking the model's proposer (the heads, or a sequential drafter) costs in the same unit.
    ``max_depth``: the deepest guess allowed (None: as deep as the heads go); :meth:`pruned` sets it
    near a length limit.
    """

    max_nodes: int
    row_costs: tuple[float, ...]
    tokens_per_cost: float = DEFAULT_TOKENS_PER_COST
    max_depth: int | None = None
    proposal_cost: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.max_nodes, bool) or not isinstance(self.max_nodes, int) or self.max_nodes < 1:
            raise TreeError(f"a dynamic tree needs max_nodes >= 1 (the root), got {self.max_nodes!r}")
        costs = tuple(self.row_costs)
        if not costs or not all(is_positive_number(cost) for cost in costs):
            raise TreeError(
                f"row_costs must be a non-empty list of positive step costs by verified rows, got {list(costs)!r}"
            )
        costs = tuple(float(cost) for cost in costs)
        object.__setattr__(self, "row_costs", costs[:1] + monotone(costs[1:]))
        if not is_positive_number(self.tokens_per_cost):
            raise TreeError(f"tokens_per_cost must be a positive number, got {self.tokens_per_cost!r}")
        if not (self.proposal_cost == 0 or is_positive_number(self.proposal_cost)):
            raise TreeError(f"proposal_cost must be a number >= 0, got {self.proposal_cost!r}")

    @property
    def num_nodes(self) -> int:
        """The most nodes a step verifies, the root included (what caches and packed weights are sized for)."""
        return self.max_nodes

    @property
    def depth(self) -> int:
        """The deepest guess a step may make (a chain of all its nodes, unless pruned)."""
        deepest = self.max_nodes - 1
        return deepest if self.max_depth is None else min(deepest, self.max_depth)

    def as_dict(self) -> dict:
        """The policy with its costs, as results record it (``max_depth`` is set at run time, not stored)."""
        return {**self.portable_dict(), "row_costs": list(self.row_costs), "proposal_cost": self.proposal_cost}

    def portable_dict(self) -> dict:
        """What a tree file's ``"dynamic"`` entry keeps: no costs, which belong to the machine that decodes."""
        return {"max_nodes": self.max_nodes, "tokens_per_cost": self.tokens_per_cost}

    def with_costs(self, row_costs: Sequence[float], proposal_cost: float = 0.0) -> DynamicTree:
        """The same policy priced by other step costs (this machine's, :mod:`medusa_lite.trees.costs`)."""
        return replace(self, row_costs=tuple(row_costs), proposal_cost=proposal_cost)

    def for_batch(self, batch_size: int, measured: BatchCosts | None = None) -> DynamicTree:
        """The policy for one of ``batch_size`` sequences decoded side by side, priced in plain steps of the batch.

        A batched step runs one forward over every sequence's rows, and each sequence asks the proposer once.
        ``measured``: what such steps cost on this machine (:mod:`medusa_lite.decoding.batch_costs`), used as they
        are. Without it they are estimated from this policy's one-sequence costs: when each sequence verifies r rows
        the step costs about ``cost(batch_size * r)``, against ``cost(batch_size)`` for a plain batched step (an
        estimate that misses a change of path past the rows measured, and prices attention over each sequence's
        own cache as one sequence's). As the batch fills the machine the ratio nears r, and the policy chooses
        fewer nodes, down to plain decoding.
        """
        if batch_size == 1:
            return self
        if measured is not None:
            if measured.batch_size != batch_size:
                raise TreeError(f"costs measured for batches of {measured.batch_size}, not {batch_size}")
            proposals = self.proposal_cost * batch_size / measured.plain_step_ratio
            return replace(self, row_costs=measured.row_costs, proposal_cost=proposals)
        plain = self.cost(batch_size)
        row_costs = tuple(self.cost(batch_size * rows) / plain for rows in range(1, len(self.row_costs) + 1))
        return replace(self, row_costs=row_costs, proposal_cost=self.proposal_cost * batch_size / plain)

    def describe(self) -> str:
        return f"dynamic tree of up to {self.max_nodes} nodes (depth {self.depth})"

    def pruned(self, max_depth: int) -> DynamicTree:
        return self if max_depth >= self.depth else replace(self, max_depth=max_depth)

    def check_fits(self, num_heads: int) -> None:
        """Any number of heads fits: a step guesses only as deep as the heads it is given."""

    def cost(self, rows: int) -> float:
        """Relative cost of verifying ``rows`` rows."""
        known = len(self.row_costs)
        return self.row_costs[rows - 1] if rows <= known else self.row_costs[-1] * rows / known

    def step_cost(self, rows: int, asked_proposer: bool) -> float:
        """A whole step's cost in plain steps: verifying ``rows`` rows, plus the heads' proposal if they were asked."""
        return self.cost(rows) + (self.proposal_cost if asked_proposer else 0.0)

    def choose(
        self,
        rank_probability: Sequence[Sequence[float]],
        chain_ranks: Sequence[int | None] = (),
        chain_length: int = 0,
    ) -> Tree:
        """This step's tree from ``rank_probability[d][r]``, head d+1's probability for its rank-r guess.

        ``chain_length``: tokens in the lookup chain to be grafted onto the tree; ``chain_ranks[d]``
        the rank of its (d+1)-th token among head d+1's guesses (None when not among them), so the
        chain's tokens that the tree already holds are not counted twice.
        """
        ranked = ranked_paths(rank_probability[: self.depth], self.max_nodes - 1)
        chain_paths = chain_prefixes(chain_ranks)
        kept: set[Path] = set()
        expected, shared = 1.0, 0  # the bonus token; chain tokens on kept nodes
        best_value, best_count = expected - self.tokens_per_cost * self.cost(1 + chain_length), 0
        for count, (probability, path) in enumerate(ranked, start=1):
            kept.add(path)
            expected += probability
            while shared < len(chain_paths) and chain_paths[shared] in kept:
                shared += 1
            value = expected - self.tokens_per_cost * self.cost(1 + count + chain_length - shared)
            if value > best_value:
                best_value, best_count = value, count
        return tree_of_paths(tuple(path for _, path in ranked[:best_count]))


def is_positive_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def monotone(costs: tuple[float, ...]) -> tuple[float, ...]:
    """The closest non-decreasing costs in least squares (pool-adjacent-violators).

    A step never gets cheaper by verifying more rows on one path; measured costs sometimes do, by
    timing noise, and averaging the offending neighbours removes that without favouring either.
    :class:`DynamicTree` applies it from two rows on: a one-row step may take a slower path than
    few-row products (PyTorch's one-row linear against the packed kernel, :mod:`medusa_lite.trees.costs`).
    """
    blocks: list[list[float]] = []  # [sum, count] of pooled neighbours
    for cost in costs:
        blocks.append([cost, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return tuple(total / count for total, count in blocks for _ in range(int(count)))


def chain_ranks(guesses: torch.Tensor, chain: torch.Tensor) -> list[int | None]:
    """For the lookup chain's (d+1)-th token, its rank among head d+1's ``guesses`` [depth, k], or None."""
    depth = min(guesses.shape[0], chain.numel())
    hits = guesses[:depth] == chain[:depth, None].to(guesses.device)
    ranks = torch.where(hits.any(dim=-1), hits.to(torch.uint8).argmax(dim=-1), -1).tolist()  # one host sync
    return [rank if rank >= 0 else None for rank in ranks]


def chain_prefixes(chain_ranks: Sequence[int | None]) -> list[Path]:
    """The tree paths the lookup chain's first 1, 2, ... tokens would occupy, up to its first token no head guessed."""
    prefixes: list[Path] = []
    for rank in chain_ranks:
        if rank is None:
            break
        prefixes.append((prefixes[-1] if prefixes else ()) + (int(rank),))
    return prefixes


@lru_cache(maxsize=4096)
def tree_of_paths(paths: tuple[Path, ...]) -> Tree:
    """The :class:`Tree` of best-first ranked paths (each path's parent comes earlier), built once per shape."""
    return Tree(tuple(sorted(paths, key=lambda path: (len(path), path))))


def row_costs_from_table(table: Sequence[dict], rows: int) -> tuple[float, ...]:
    """Per-row costs 1..``rows`` from a calibration table of ``{"num_nodes", "relative_cost"}`` entries.

    Row counts between measured sizes take the next larger size's cost (never an underestimate);
    past the largest they grow in proportion.
    """
    measured = sorted((int(entry["num_nodes"]), float(entry["relative_cost"])) for entry in table)
    if not measured:
        raise TreeError("the calibration table is empty: no measured step costs to size a dynamic tree with")
    largest, largest_cost = measured[-1]
    costs = []
    for count in range(1, rows + 1):
        above = [cost for size, cost in measured if size >= count]
        costs.append(above[0] if above else largest_cost * count / largest)
    return tuple(costs)


# -- never slower than plain decoding ----------------------------------------------------------
# Weight of the newest step in the running gain (an exponential average over about 32 steps).
# Acceptance comes in bursts: over 8 steps the average fell below 0 in stretches of text where
# speculation still paid over the whole answer (docs/results.md, "Measurements behind the code's
# choices").
RECENT_STEP_WEIGHT = 1 / 32
# The gain assumed before any step is seen: speculation gets some steps to show what it buys
# (about 10 steps where each loses 0.7 of a plain step, 25 where each loses 0.2).
PRIOR_GAIN = 0.25
# After speculation stops paying: plain steps before trying again, doubled after each failed try.
FIRST_PAUSE_STEPS = 4
MAX_PAUSE_STEPS = 64


@dataclass(frozen=True)
class SpeculationGate:
    """Whether this generation's next step speculates or takes a plain one-token step (EAGLE's and
    the seed articles' "fall back" rule, per prompt).

    ``gain``: an exponential average over recent speculative steps of tokens committed minus the
    step's cost in plain steps (:meth:`DynamicTree.step_cost`); a plain step commits one token for
    a cost of one, a gain of 0. Once the average falls below 0 speculation is losing against plain
    decoding on this text and machine, so the next ``pause`` steps are plain; then one step tries
    again, its gain counted from 0 (the average of the losing stretch forgotten): if it pays,
    speculation goes on, if not the pause doubles (up to :data:`MAX_PAUSE_STEPS`). Immutable: the
    loop keeps the current one.
    """

    gain: float = PRIOR_GAIN
    pause: int = 0  # plain steps left before the next try
    next_pause: int = FIRST_PAUSE_STEPS

    @property
    def speculates(self) -> bool:
        return self.pause == 0

    def after_plain_step(self) -> SpeculationGate:
        """One plain step less to wait; when the pause is over the gain starts afresh at 0 (break-even):
        the text has moved on, so the next try is judged by what it buys itself, not by the steps
        that caused the pause."""
        pause = max(self.pause - 1, 0)
        return replace(self, pause=pause, gain=self.gain if pause else 0.0)

    def after_speculative_step(self, tokens: int, cost: float) -> SpeculationGate:
        """The gate after a speculative step that committed ``tokens`` tokens at ``cost`` plain steps."""
        gain = (1 - RECENT_STEP_WEIGHT) * self.gain + RECENT_STEP_WEIGHT * (tokens - cost)
        if gain >= 0:
            return SpeculationGate(gain, 0, FIRST_PAUSE_STEPS)
        return SpeculationGate(gain, self.next_pause, min(2 * self.next_pause, MAX_PAUSE_STEPS))
