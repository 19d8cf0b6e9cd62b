"""What every decoding loop shares (one sequence: :mod:`medusa_lite.decoding.generate`; a batch:
:mod:`medusa_lite.decoding.batch`): the statistics of a call, the proposers it runs, the speculation gate's
bookkeeping and where a step's tokens end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from medusa_lite.decoding.inputs import as_datastore, check_lookup_tokens
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.decoding.options import ScoreOptions, first_stop, processed_scores
from medusa_lite.drafters.medusa.proposer import MedusaHeadsProposer, default_proposers, model_proposers
from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.base import Proposer, SideRows, StepLimits, as_proposers, row_budgets
from medusa_lite.proposers.lookup import DEFAULT_DATASTORE_TOKENS, DEFAULT_LOOKUP_TOKENS
from medusa_lite.trees.draft import DATASTORE_SOURCE, LOOKUP_SOURCES, DraftTree
from medusa_lite.trees.dynamic_tree import BatchCosts, DynamicTree, SpeculationGate
from medusa_lite.trees.tree import Tree


@dataclass
class GenerationStats:
    """What happened during one ``generate`` call.

    Convention: ``mean_accepted_tokens`` = new tokens / calls of the target, the prefill
    included, so plain decoding scores exactly 1.00 and the bonus token is counted.
    ``mean_tokens_per_step`` leaves the prefill and its token out: tokens per verification step,
    what Spec-Bench and the Medusa/EAGLE papers report as "mean accepted tokens".
    """

    tree_nodes: int
    tree_depth: int
    new_tokens: int = 0
    target_calls: int = 0
    tokens_per_step: list[int] = field(default_factory=list)  # per verification step, bonus included
    accepted_at_depth: list[int] = field(default_factory=list)  # [d-1]: steps that accepted a guess at depth d
    lookup_steps: int = 0  # steps whose accepted path used a guess only a lookup (prompt or datastore) made
    datastore_steps: int = 0  # of those, steps whose lookup chain came from the datastore
    verified_rows: int = 0  # tree + lookup rows verified, summed over steps
    plain_steps: int = 0  # steps taken without guesses because speculation was not paying (SpeculationGate)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # accepted guesses by proposer (no bonus tokens)

    @property
    def steps(self) -> int:
        """Verification steps (target calls after the prefill)."""
        return len(self.tokens_per_step)

    @property
    def mean_accepted_tokens(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        return sum(self.tokens_per_step) / self.steps if self.steps else 0.0

    @property
    def mean_verified_rows(self) -> float:
        """Rows (tree nodes + lookup guesses, the root included) the target verified per step."""
        return self.verified_rows / self.steps if self.steps else 0.0

    @property
    def acceptance_rate_by_depth(self) -> list[float]:
        return [count / self.steps if self.steps else 0.0 for count in self.accepted_at_depth]

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "steps": self.steps,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "mean_tokens_per_step": self.mean_tokens_per_step,
            "tokens_per_step": list(self.tokens_per_step),
            "accepted_at_depth": list(self.accepted_at_depth),
            "acceptance_rate_by_depth": self.acceptance_rate_by_depth,
            "lookup_steps": self.lookup_steps,
            "datastore_steps": self.datastore_steps,
            "verified_rows": self.verified_rows,
            "plain_steps": self.plain_steps,
            "accepted_by_source": dict(self.accepted_by_source),
            "mean_verified_rows": self.mean_verified_rows,
            "tree_nodes": self.tree_nodes,
            "tree_depth": self.tree_depth,
        }


@dataclass
class GenerationOutput:
    sequences: torch.Tensor  # [B, prompt + new tokens], like model.generate (B = 1 for one prompt)
    stats: GenerationStats  # a batch's: every row's counts summed (medusa_lite.decoding.batch.batch_stats)
    # With output_scores / output_logits, as model.generate returns them: one [1, V] tensor per new token.
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None
    row_stats: tuple[GenerationStats, ...] = ()  # a batch's: each row's own, in input order


# -- choosing the proposers --------------------------------------------------------------------
def resolve_proposers(
    model: MedusaModel, proposers, tree, lookup_tokens, datastore, datastore_tokens
) -> tuple[Proposer, ...]:
    """``proposers`` as given; else the shorthands' heads + lookups when any is given; else ``model.proposers``."""
    shorthands = {"tree": tree, "lookup_tokens": lookup_tokens, "datastore": datastore}
    shorthands["datastore_tokens"] = datastore_tokens
    given = [name for name, value in shorthands.items() if value is not None]
    if proposers is not None:
        if given:
            raise GenerationInputError(
                f"give either proposers= or the shorthands {', '.join(given)}= (they build the default set), not both"
            )
        return as_proposers(proposers)
    if not given:
        return model_proposers(model)
    lookup_tokens = check_lookup_tokens(DEFAULT_LOOKUP_TOKENS if lookup_tokens is None else lookup_tokens)
    datastore_tokens = DEFAULT_DATASTORE_TOKENS if datastore_tokens is None else datastore_tokens
    datastore_tokens = check_lookup_tokens(datastore_tokens, "datastore_tokens")
    datastore = as_datastore(True if datastore is None else datastore, model)
    return default_proposers(tree, lookup_tokens, datastore, datastore_tokens)


def start(
    proposers: Sequence[Proposer],
    model: MedusaModel,
    prompt: torch.Tensor,
    max_depth: int,
    batch_size: int = 1,
    batch_costs: Callable[[int], BatchCosts] | None = None,
) -> tuple[list[Proposer], list[int]]:
    """(the proposers running this generation of ``prompt``, one of ``batch_size`` decoded side by side, priced by
    ``batch_costs`` (:class:`~medusa_lite.proposers.base.StepLimits`); each one's most nodes per step)."""
    budgets = row_budgets(proposers, model, max_depth, batch_size, batch_costs)
    rows_before = [1 + sum(budgets[:i]) for i in range(len(budgets))]
    limits = [StepLimits(model, max_depth, rows, batch_size, batch_costs) for rows in rows_before]
    return [proposer.begin(model, prompt, limit) for proposer, limit in zip(proposers, limits)], budgets


def heads_tree(running: Sequence[Proposer]) -> Tree | DynamicTree:
    """The tree the heads decode with this generation (the root alone without heads), for the stats."""
    return next((p.tree for p in running if isinstance(p, MedusaHeadsProposer)), Tree(()))


def gate_after_step(gate: SpeculationGate, pricing: DynamicTree, speculated: bool, draft: DraftTree, path, room: int):
    """The speculation gate after a step: a dynamic tree prices it with this machine's step costs."""
    if not speculated:
        return gate.after_plain_step()
    asked_proposer = pricing.pruned(room).depth > 0 and pricing.max_nodes > 1
    return gate.after_speculative_step(path.numel(), pricing.step_cost(draft.num_nodes, asked_proposer))


def cut_at_eos(tokens: torch.Tensor, eos: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Tokens up to and including the first EOS, and whether one was found."""
    if eos.numel() == 0:
        return tokens, False
    hits = torch.nonzero(torch.isin(tokens, eos)).flatten()
    if hits.numel() == 0:
        return tokens, False
    return tokens[: int(hits[0]) + 1], True


def record_step(stats: GenerationStats, draft: DraftTree, path: torch.Tensor) -> None:
    """Count one verification step (guesses may reach deeper than the heads' tree)."""
    sources = [draft.sources[node] for node in path[1:].tolist()]
    accepted_guesses = len(sources)
    stats.accepted_at_depth.extend([0] * (accepted_guesses - len(stats.accepted_at_depth)))
    for depth in range(accepted_guesses):
        stats.accepted_at_depth[depth] += 1
    for source in sources:
        stats.accepted_by_source[source] = stats.accepted_by_source.get(source, 0) + 1
    stats.tokens_per_step.append(accepted_guesses + 1)
    stats.lookup_steps += any(source in LOOKUP_SOURCES for source in sources)
    stats.datastore_steps += DATASTORE_SOURCE in sources
    stats.verified_rows += draft.num_nodes


def stacked_side_rows(sides: Sequence[SideRows | None]) -> SideRows | None:
    """The proposers' side rows (None: that one has none) as one block, in order; None when none has any."""
    present = [side for side in sides if side is not None]
    if not present:
        return None
    return SideRows(
        torch.cat([side.tokens for side in present]),
        torch.cat([side.offsets for side in present]),
        torch.block_diag(*[side.mask for side in present]),
    )


def split_side_logits(sides: Sequence[SideRows | None], logits: torch.Tensor) -> list[torch.Tensor | None]:
    """The logits at :func:`stacked_side_rows`' rows, given back to each proposer (None: it had no side rows)."""
    split = iter(logits.split([side.tokens.numel() for side in sides if side is not None]))
    return [None if side is None else next(split) for side in sides]


# -- what every loop does with a running generation -------------------------------------------------
def fresh_stats(running: Sequence[Proposer]) -> GenerationStats:
    """Empty statistics for a generation run by ``running``, sized to the heads' tree."""
    shape = heads_tree(running)
    return GenerationStats(tree_nodes=shape.num_nodes, tree_depth=shape.depth, accepted_at_depth=[0] * shape.depth)


def running_pricing(running: Sequence[Proposer]) -> DynamicTree | None:
    """This machine's step costs, from the first running proposer that knows them (None: no speculation gate)."""
    return next((proposer.pricing for proposer in running if proposer.pricing is not None), None)


def running_feature_layers(running: Sequence[Proposer]) -> list[int]:
    """The target layers any running proposer reads, in order."""
    return sorted({layer for proposer in running for layer in proposer.feature_layers})


def node_scores(scoring: ScoreOptions, history: torch.Tensor, draft: DraftTree, logits: torch.Tensor) -> torch.Tensor:
    """The scores every node's token is picked from: its logits, processed with its own prefix when asked."""
    return processed_scores(scoring.processors, history, draft, logits) if scoring.processes else logits


def committed_part(
    scoring: ScoreOptions, history: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, eos: torch.Tensor
) -> tuple[torch.Tensor, bool]:
    """(the accepted ``tokens`` up to and with the first EOS or stop, whether one ended generation)."""
    tokens, ended = cut_at_eos(tokens, eos)
    if scoring.stops:
        stop = first_stop(scoring.criteria, history, tokens, scores)
        tokens, ended = (tokens, ended) if stop is None else (tokens[: stop + 1], True)
    return tokens, ended
