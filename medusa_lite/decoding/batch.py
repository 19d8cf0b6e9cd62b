"""Exact speculative decoding of several prompts at once: one verification forward for every row's draft.

Each row of a left-padded batch runs the loop of :mod:`medusa_lite.decoding.generate` on its own: its own
proposers (begun on its own prompt), draft, accepted path, EOS, stop criteria, options and speculation gate,
under the same acceptance rule; so each row's tokens are those its prompt decoded alone gives (greedy: the
target's argmax at every step; sampling: the target's distribution, row by row). What the rows share is the
target's forward: each step stacks every row's draft and side rows into one [B, Q] input, each row's queries at
its own positions (its prompt's first token at 0, as if it had no padding) and seeing only its own entries.

The KV cache holds one row per sequence. Row b's entries are the slots ``[padding[b], committed[b])``: its
prompt without the left padding, then every token it accepted, in order. A step writes every row's rows at
slots ``[T, T + Q)`` (T = the longest row's ``committed``); each row's accepted nodes then move to
``[committed[b], committed[b] + accepted)`` and the cache is cut after the longest row, so what a row rejected
and the slots it leaves behind a longer row are masked out until they are overwritten. A row that finishes
leaves the batch at once (its cache row dropped), so it costs no more work; its tokens are kept.

Sampling: every row draws from the one ``generator``, rows in order within a step, so a row's draws depend
on the rows beside it and a batch does not reproduce the sequences one-at-a-time calls draw with the same
seed; each row's tokens still follow the target's distribution exactly (the draws are independent).
The table of what a batch does to speculation on this machine: docs/results.md, "Batches".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from medusa_lite.cpu.prepack import packed_up_to_rows, prepacked_rows
from medusa_lite.decoding.acceptance import accept
from medusa_lite.decoding.batch_width import AcceptanceRates, best_width, expected_tokens, speculation_may_pay
from medusa_lite.decoding.cache import keep_accepted_per_sequence, keep_sequences, reserved_cache
from medusa_lite.decoding.model import MedusaModel, TargetOutput, text_config
from medusa_lite.decoding.options import ScoreOptions
from medusa_lite.decoding.sampling import SamplingSettings, pick_tokens
from medusa_lite.decoding.steps import (
    GenerationOutput,
    GenerationStats,
    committed_part,
    fresh_stats,
    gate_after_step,
    node_scores,
    record_step,
    running_feature_layers,
    running_pricing,
    split_side_logits,
    stacked_side_rows,
    start,
)
from medusa_lite.decoding.verify import step_rows_allowed
from medusa_lite.decoding.windows import layer_kind_masks
from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.base import (
    Proposer,
    SideRows,
    StepContext,
    StepOutcome,
    TargetStates,
    propose_draft,
)
from medusa_lite.trees.draft import DraftTree, draft_prefix, root_draft
from medusa_lite.trees.dynamic_tree import BatchCosts, DynamicTree, SpeculationGate


@dataclass
class Row:
    """One sequence of the batch while it decodes (the loop's state for it; nothing is kept on the model)."""

    index: int  # its row in the input
    running: list[Proposer]
    scoring: ScoreOptions
    stats: GenerationStats
    history: torch.Tensor  # its prompt without padding, then every committed token
    pricing: DynamicTree | None
    gate: SpeculationGate = field(default_factory=SpeculationGate)
    root: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    unseen: TargetStates | None = None
    finished: bool = False

    @property
    def speculates(self) -> bool:
        return self.pricing is None or self.gate.speculates


@dataclass(frozen=True)
class RowStep:
    """What one row puts into a step's forward: its draft, then its proposers' side rows (``sides``, None: none),
    stacked once (:func:`row_step`): the rows' ``tokens`` [Q], their ``offsets`` [Q] after the root's position, and
    what each may attend to among them (``allowed`` [Q, Q])."""

    draft: DraftTree
    sides: list[SideRows | None]
    stacked: SideRows | None
    tokens: torch.Tensor
    offsets: torch.Tensor
    allowed: torch.Tensor
    speculated: bool = True  # whether its proposers were asked (False: a plain step)


def row_step(draft: DraftTree, sides: list[SideRows | None], speculated: bool = True) -> RowStep:
    stacked = stacked_side_rows(sides)
    if stacked is None:
        return RowStep(draft, sides, None, draft.tokens, draft.node_depths, step_rows_allowed(draft, None), speculated)
    tokens = torch.cat([draft.tokens, stacked.tokens.to(draft.tokens.device)])
    offsets = torch.cat([draft.node_depths, stacked.offsets.cpu()])
    return RowStep(draft, sides, stacked, tokens, offsets, step_rows_allowed(draft, stacked), speculated)


def commit(row: Row, tokens: torch.Tensor, scores: torch.Tensor, eos: torch.Tensor, max_new_tokens: int) -> None:
    """Append a step's accepted tokens to the row (cut at an EOS or a stop); mark it finished when it is."""
    tokens, hit_eos = committed_part(row.scoring, row.history, tokens, scores, eos)
    row.history = torch.cat([row.history, tokens])
    row.stats.new_tokens += tokens.numel()
    row.finished = hit_eos or row.stats.new_tokens >= max_new_tokens


def within_shared_width(
    steps: Sequence[RowStep], rates: AcceptanceRates | None = None, cost: Callable[[int], float] | None = None
) -> list[RowStep]:
    """The rows' steps cut to one width.

    One forward verifies every row's step, as wide as the widest (the others padded with rows nobody sees). With
    ``cost`` (``cost(w)``: a forward verifying w rows of every row, in plain batched steps) the width is the one at
    which the rows' drafts are expected to commit the most tokens per cost, by this batch's ``rates`` of acceptance
    (:func:`~medusa_lite.decoding.batch_width.best_width`; 1: a plain batched step); without, the upper median of
    the rows' sizes. A wider row keeps its first nodes (a dynamic tree's likeliest, each after its parent:
    :func:`~medusa_lite.trees.draft.draft_prefix`), a smaller tree still verified exactly. A row with side rows keeps
    its whole step (its proposers read their rows' logits by position), so the width is at least its."""
    if cost is None:
        sizes = sorted(step.tokens.numel() for step in steps)
        width = sizes[len(sizes) // 2]
    else:
        rates = rates or AcceptanceRates()
        expected = [expected_tokens(rates.path_probabilities(step.draft)) for step in steps]
        expected = [row if step.stacked is None else row[-1:] for row, step in zip(expected, steps)]
        least = max([1, *(step.tokens.numel() for step in steps if step.stacked is not None)])
        width = best_width(expected, cost, least)
    return [
        row_step(draft_prefix(step.draft, width), step.sides, step.speculated)
        if step.stacked is None and step.tokens.numel() > width
        else step
        for step in steps
    ]


def batch_allowed(steps: Sequence[RowStep], committed: torch.Tensor, padding: torch.Tensor, prefix: int, width: int):
    """(allowed [B, width, prefix + width], query positions [B, width], key positions [B, prefix + width]) of one
    step: each row's rows see that row's entries of the cache and what :func:`step_rows_allowed` allows among its own
    rows; the filler rows after a short row's see only themselves."""
    batch = len(steps)
    slots = torch.arange(prefix)
    entries = (slots[None] >= padding.cpu()[:, None]) & (slots[None] < committed.cpu()[:, None])
    lengths = (committed - padding).cpu()  # each row's root position
    allowed = torch.zeros(batch, width, prefix + width, dtype=torch.bool)
    queries = lengths[:, None].repeat(1, width)
    for b, step in enumerate(steps):
        rows = step.tokens.numel()
        allowed[b, :rows, :prefix] = entries[b]
        allowed[b, :rows, prefix : prefix + rows] = step.allowed
        fillers = torch.arange(rows, width)
        allowed[b, fillers, prefix + fillers] = True
        queries[b, :rows] += step.offsets
    keys = torch.cat([slots[None] - padding.cpu()[:, None], queries], dim=1)
    return allowed, queries, keys


def verify_batch(
    model: MedusaModel, cache, steps: Sequence[RowStep], committed: torch.Tensor, padding: torch.Tensor
) -> TargetOutput:
    """The target's logits and hidden states at every row of every row's step [B, Q, ...], in one forward."""
    width = max(step.tokens.numel() for step in steps)
    fillers = [step.tokens[:1].repeat(width - step.tokens.numel()) for step in steps]  # seen by nothing else
    tokens = torch.stack([torch.cat([step.tokens, filler]) for step, filler in zip(steps, fillers)])
    allowed, queries, keys = batch_allowed(steps, committed, padding, cache.get_seq_length(), width)
    device, dtype = tokens.device, model.base_model.dtype
    masks = layer_kind_masks(text_config(model.base_model), allowed, queries, keys, dtype, device)
    return model.target_forward(
        tokens, position_ids=queries.to(device), attention_mask=masks, cache=cache, use_cache=True
    )


def batch_stats(rows: Sequence[Row], target_calls: int) -> GenerationStats:
    """The whole batch's statistics: every row's counts summed (``tokens_per_step``: every row's steps, so its mean
    is tokens per row per step), ``target_calls`` the batched forwards (prefill included)."""
    first = rows[0].stats
    depth = max(len(row.stats.accepted_at_depth) for row in rows)
    total = GenerationStats(
        first.tree_nodes, first.tree_depth, target_calls=target_calls, accepted_at_depth=[0] * depth
    )
    for row in rows:
        stats = row.stats
        total.new_tokens += stats.new_tokens
        total.tokens_per_step.extend(stats.tokens_per_step)
        for d, count in enumerate(stats.accepted_at_depth):
            total.accepted_at_depth[d] += count
        for source, count in stats.accepted_by_source.items():
            total.accepted_by_source[source] = total.accepted_by_source.get(source, 0) + count
        total.lookup_steps += stats.lookup_steps
        total.datastore_steps += stats.datastore_steps
        total.verified_rows += stats.verified_rows
        total.plain_steps += stats.plain_steps
    return total


def padded_sequences(ids: torch.Tensor, rows: Sequence[Row], pad_token_id: int | None) -> torch.Tensor:
    """``model.generate``'s layout: the left-padded prompts, then each row's new tokens, short rows filled with
    ``pad_token_id``."""
    width = ids.shape[1]
    news = [row.history[row.history.numel() - row.stats.new_tokens :] for row in sorted(rows, key=lambda r: r.index)]
    longest = max(new.numel() for new in news)
    if pad_token_id is None and any(new.numel() < longest for new in news):
        raise GenerationInputError(
            "rows ended at different lengths and there is no pad token to fill the shorter ones: pass pad_token_id "
            "(e.g. tokenizer.pad_token_id)"
        )
    out = ids.new_full((ids.shape[0], width + longest), 0 if pad_token_id is None else pad_token_id)
    out[:, :width] = ids
    for b, new in enumerate(news):
        out[b, width : width + new.numel()] = new
    return out


def generate_batch(
    model: MedusaModel,
    ids: torch.Tensor,
    padding: torch.Tensor,
    max_new_tokens: int,
    *,
    settings: SamplingSettings,
    proposers: Sequence[Proposer],
    eos: torch.Tensor,
    scoring_for: Callable[[int], ScoreOptions],
    generator: torch.Generator | None,
    pad_token_id: int | None,
    batch_costs: Callable[[int], BatchCosts] | None = None,
) -> GenerationOutput:
    """Decode every row of the left-padded ``ids`` [B, L] (``padding`` [B]: each row's left padding), arguments
    checked by :func:`medusa_lite.decoding.generate.generate`; ``scoring_for(prompt length)``: a row's options;
    ``batch_costs``: this machine's costs of the batch's steps (:class:`~medusa_lite.proposers.base.StepLimits`).

    A target packed for one sequence's tree (:func:`medusa_lite.cpu.prepack.prepack_linears`) serves the batch's
    rows on the packed path too, while it decodes; dynamic trees are priced by this machine's costs for the batch
    size (:mod:`medusa_lite.decoding.batch_costs`, measured on first use)."""
    batch = ids.shape[0]
    with packed_up_to_rows(model.base_model, batch * (prepacked_rows(model.base_model) or 0)):
        rows, budgets = started_rows(model, ids, padding, max_new_tokens, proposers, scoring_for, batch_costs)
        target_calls = (
            0
            if max_new_tokens == 0
            else decode_rows(model, ids, padding, max_new_tokens, rows, budgets, settings, eos, generator)
        )
    return GenerationOutput(
        padded_sequences(ids, rows, pad_token_id) if max_new_tokens else ids.clone(),
        batch_stats(rows, target_calls),
        row_stats=tuple(row.stats for row in rows),
    )


def started_rows(
    model: MedusaModel,
    ids: torch.Tensor,
    padding: torch.Tensor,
    max_new_tokens: int,
    proposers: Sequence[Proposer],
    scoring_for: Callable[[int], ScoreOptions],
    batch_costs: Callable[[int], BatchCosts] | None,
) -> tuple[list[Row], list[int]]:
    """Every row with its proposers begun on its own prompt, priced for the batch; and each proposer's most nodes
    per step."""
    batch = ids.shape[0]
    rows, budgets = [], []
    for b in range(batch):
        prompt = ids[b, int(padding[b]) :]
        running, budgets = start(proposers, model, prompt, max_new_tokens - 1, batch, batch_costs)
        scoring, stats = scoring_for(prompt.numel()), fresh_stats(running)
        rows.append(Row(b, running, scoring, stats, prompt, running_pricing(running)))
    return rows, budgets


def decode_rows(
    model: MedusaModel,
    ids: torch.Tensor,
    padding: torch.Tensor,
    max_new_tokens: int,
    rows: Sequence[Row],
    budgets: Sequence[int],
    settings: SamplingSettings,
    eos: torch.Tensor,
    generator: torch.Generator | None,
) -> int:
    """Prefill, then step every unfinished row until all are done; the target forwards it took."""
    batch, width = ids.shape
    cache = reserved_cache(model, width + max_new_tokens + 1 + sum(budgets))
    slots = torch.arange(width, device=ids.device)
    prefill = model.target_forward(
        ids,
        attention_mask=(slots[None] >= padding[:, None]).long(),
        position_ids=(slots[None] - padding[:, None]).clamp(min=0),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    target_calls = 1
    layers = running_feature_layers([proposer for row in rows for proposer in row.running])
    for row in rows:
        pad = int(padding[row.index])
        last_logits = prefill.logits[row.index, -1:]
        prompt_scores = node_scores(row.scoring, row.history, root_draft(row.history[-1]), last_logits)
        row.root = pick_tokens(prompt_scores, settings, generator)
        row.unseen = TargetStates.of(prefill.select(row.index), layers, slice(pad, None))
        row.hidden = row.unseen.final[-1]
        commit(row, row.root, prompt_scores, eos, max_new_tokens)
    committed = torch.full((batch,), width, dtype=torch.long, device=ids.device)
    active = list(rows)
    pricing, rates = rows[0].pricing, AcceptanceRates()  # every row is priced alike
    cost = None if pricing is None else pricing.cost
    while True:
        keep = [i for i, row in enumerate(active) if not row.finished]
        if not keep:
            return target_calls
        if len(keep) < len(active):  # finished rows leave the batch
            active, committed, padding = [active[i] for i in keep], committed[keep], padding[keep]
            keep_sequences(cache, torch.tensor(keep, device=ids.device), int(committed.max()))
        asks = cost is None or speculation_may_pay(rates, cost, pricing.proposal_cost, 1 + sum(budgets))
        proposed = [propose_row(model, row, budgets, settings, generator, max_new_tokens, asks) for row in active]
        steps = within_shared_width(proposed, rates, cost)
        prefix = cache.get_seq_length()
        verified = verify_batch(model, cache, steps, committed, padding)
        target_calls += 1
        paths = [
            accept_row(row, step, verified.select(b), settings, generator, layers, eos, max_new_tokens)
            for b, (row, step) in enumerate(zip(active, steps))
        ]
        committed = keep_accepted_per_sequence(cache, prefix, committed, paths)
        rates = rates.after_step([(step.draft, path) for step, path in zip(steps, paths)])


def propose_row(
    model: MedusaModel,
    row: Row,
    budgets: Sequence[int],
    settings: SamplingSettings,
    generator,
    max_new_tokens: int,
    batch_asks: bool = True,
) -> RowStep:
    """The row's draft and side rows for this step (the root alone when its gate pauses speculation, or the batch
    asks no row: ``batch_asks``)."""
    room = max_new_tokens - row.stats.new_tokens - 1  # a step commits at most depth + 1 tokens
    step = StepContext(
        model, row.history, row.root, row.hidden, root_draft(row.root), room, 0, settings, generator, row.unseen
    )
    if not (row.speculates and batch_asks):
        return row_step(step.draft, [None] * len(row.running), speculated=False)
    draft = propose_draft(row.running, budgets, step)
    row.unseen = row.unseen.emptied()
    return row_step(draft, [proposer.side_rows(replace(step, draft=draft)) for proposer in row.running])


def accept_row(
    row: Row,
    step: RowStep,
    verified: TargetOutput,
    settings: SamplingSettings,
    generator,
    layers: Sequence[int],
    eos: torch.Tensor,
    max_new_tokens: int,
) -> torch.Tensor:
    """Accept, tell the row's proposers and commit its tokens, from its rows of the batch's forward
    (``verified``: [Q, ...]); the accepted node indices, the root first."""
    draft, nodes = step.draft, step.draft.num_nodes
    room = max_new_tokens - row.stats.new_tokens - 1
    own = verified.select(slice(None, nodes))
    scores = node_scores(row.scoring, row.history, draft, own.logits)
    path, row.root = accept(draft, scores, settings, generator)
    row.unseen = row.unseen.then(TargetStates.of(own, layers, path))
    row.hidden = row.unseen.final[-1]
    accepted = torch.cat([draft.tokens[path[1:]], row.root])
    side_logits = [None] * len(step.sides)
    if step.stacked is not None:
        side_logits = split_side_logits(step.sides, verified.logits[nodes : step.tokens.numel()])
    for proposer, logits in zip(row.running, side_logits):
        proposer.accepted(StepOutcome(draft, path, accepted, side_logits=logits))
    record_step(row.stats, draft, path)
    if row.pricing is not None and (step.speculated or not row.speculates):  # the batch's pause leaves its gate
        row.gate = gate_after_step(row.gate, row.pricing, step.speculated, draft, path, room)
    row.stats.plain_steps += row.pricing is not None and not step.speculated
    commit(row, accepted, scores[path], eos, max_new_tokens)
    return path
