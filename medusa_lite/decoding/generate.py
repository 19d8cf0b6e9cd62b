"""The decoding loop: propose -> verify -> accept -> commit.

Each step the proposers (:mod:`medusa_lite.proposers.base`: the heads, prompt lookup, the datastore, a
draft model...) build one draft tree of guesses, the target verifies the whole tree in one
forward, the acceptance rule (:mod:`medusa_lite.decoding.acceptance`) keeps the path the target agrees
with plus one bonus token drawn from the target, the KV cache keeps only that path, and every
proposer is told what was kept.

Why it is exact: every emitted token is distributed as the target's own next token given exactly
the tokens before it (greedy: it is the target's argmax), whatever the proposers guessed; the
rule and its proof are in :mod:`medusa_lite.decoding.acceptance` (../shared/DESIGN.md §1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import torch

from medusa_lite.decoding.acceptance import accept, accepted_path
from medusa_lite.decoding.architectures import check_architecture
from medusa_lite.decoding.cache import reserved_cache
from medusa_lite.decoding.inputs import (
    as_datastore,
    as_prompt,
    check_context,
    check_generator,
    check_lookup_tokens,
    check_max_new_tokens,
    check_streamer,
    check_token_ids,
    checked_model_in_eval_mode,
    context_limit,
    eos_ids,
)
from medusa_lite.decoding.model import MedusaModel, TargetOutput, check_tree_attention_supported, text_config
from medusa_lite.decoding.options import (
    ScoreOptions,
    TokenScores,
    first_stop,
    processed_scores,
    score_processors,
    stop_criteria,
)
from medusa_lite.decoding.sampling import SamplingSettings, pick_tokens
from medusa_lite.decoding.verify import keep_accepted_in_cache, verify_tree, verify_with_side_rows
from medusa_lite.drafters.medusa.proposer import (
    MedusaHeadsProposer,
    default_proposers,
    heads_draft,
    model_proposers,
    tree_tokens,
)
from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.base import (
    Proposer,
    SideRows,
    StepContext,
    StepLimits,
    StepOutcome,
    TargetStates,
    as_proposers,
    propose_draft,
    row_budgets,
)
from medusa_lite.proposers.datastore import Datastore
from medusa_lite.proposers.lookup import (
    DEFAULT_DATASTORE_TOKENS,
    DEFAULT_LOOKUP_TOKENS,
    TRUSTED_MATCH_TOKENS,
    lookup_chain,
)
from medusa_lite.trees.draft import DATASTORE_SOURCE, LOOKUP_SOURCES, DraftTree, root_draft
from medusa_lite.trees.dynamic_tree import DynamicTree, SpeculationGate
from medusa_lite.trees.tree import Tree

__all__ = [  # the loop, and names other modules and scripts import from here
    "DEFAULT_DATASTORE_TOKENS",
    "DEFAULT_LOOKUP_TOKENS",
    "TRUSTED_MATCH_TOKENS",
    "GenerationOutput",
    "GenerationStats",
    "accepted_path",
    "generate",
    "lookup_chain",
    "heads_draft",
    "tree_tokens",
]


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
    sequences: torch.Tensor  # [1, prompt + new tokens], like model.generate
    stats: GenerationStats
    # With output_scores / output_logits, as model.generate returns them: one [1, V] tensor per new token.
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None


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
    proposers: Sequence[Proposer], model: MedusaModel, prompt: torch.Tensor, max_depth: int
) -> tuple[list[Proposer], list[int]]:
    """(the proposers running this generation, each one's most nodes per step)."""
    budgets = row_budgets(proposers, model, max_depth)
    rows_before = [1 + sum(budgets[:i]) for i in range(len(budgets))]
    running = [p.begin(model, prompt, StepLimits(model, max_depth, rows)) for p, rows in zip(proposers, rows_before)]
    return running, budgets


def heads_tree(running: Sequence[Proposer]) -> Tree | DynamicTree:
    """The tree the heads decode with this generation (the root alone without heads), for the stats."""
    return next((p.tree for p in running if isinstance(p, MedusaHeadsProposer)), Tree(()))


# -- verify, accept and commit -----------------------------------------------------------------
def verify_draft_and_side_rows(
    model: MedusaModel, cache, draft: DraftTree, sides: Sequence[SideRows | None]
) -> tuple[TargetOutput, list[torch.Tensor | None]]:
    """:func:`verify_draft`, with the proposers' side rows (None: none) in the same forward; each one's logits."""
    present = [side for side in sides if side is not None]
    if not present:
        return verify_draft(model, cache, draft), [None] * len(sides)
    stacked = SideRows(
        torch.cat([side.tokens for side in present]),
        torch.cat([side.offsets for side in present]),
        torch.block_diag(*[side.mask for side in present]),
    )
    verified, logits = verify_with_side_rows(model, cache, draft, draft.tokens, stacked)
    split = iter(logits.split([side.tokens.numel() for side in present]))
    return verified, [None if side is None else next(split) for side in sides]


def verify_draft(model: MedusaModel, cache, draft: DraftTree) -> TargetOutput:
    """The target's logits and hidden states at every draft node; a root-only draft takes a plain
    one-token forward (no tree mask), as cheap as a step of ``model.generate``."""
    if draft.num_nodes > 1:
        return verify_tree(model, cache, draft, draft.tokens)
    out = model.target_forward(draft.tokens[None], cache=cache, use_cache=True)
    return out.select(0)


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


# -- the loop ----------------------------------------------------------------------------------
@torch.inference_mode()
@checked_model_in_eval_mode
def generate(
    model: MedusaModel,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    proposers: Proposer | Sequence[Proposer] | None = None,
    tree: Tree | DynamicTree | Iterable[Sequence[int]] | None = None,
    lookup_tokens: int | None = None,
    datastore: Datastore | None | bool = None,
    datastore_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    streamer=None,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
    min_new_tokens: int | None = None,
    bad_words_ids: Sequence[Sequence[int]] | None = None,
    stop_strings: str | Sequence[str] | None = None,
    tokenizer=None,
    max_time: float | None = None,
    logits_processor=None,
    stopping_criteria=None,
    output_scores: bool = False,
    output_logits: bool = False,
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` with exact speculative decoding.

    Greedy (``temperature=0``) returns the tokens of ``model.base_model.generate(do_sample=False)``;
    with ``temperature > 0`` (and optional ``top_k`` / ``top_p``) tokens follow exactly the target's
    sampling distribution. ``proposers``: the :class:`~medusa_lite.proposers.base.Proposer` (s) that
    guess each step, run in order (default: ``model.proposers``, set by ``load``: the lookups,
    then the heads on ``model.tree``). Shorthands that build the default proposers instead
    (not together with ``proposers``): ``tree``, a :class:`Tree`, a list of top-k rank paths or a
    :class:`~medusa_lite.trees.dynamic_tree.DynamicTree` (default ``model.tree``); ``lookup_tokens``,
    the most prompt-lookup guesses per step (default 6, at most 2 per matched token; 0 = off);
    ``datastore``, True = ``model.datastore``, a :class:`Datastore`, or False/None for none, asked
    when the text has no 2-token match; ``datastore_tokens``, its most guesses per step (default 4).
    ``streamer`` receives the prompt, then each step's accepted tokens (e.g.
    ``transformers.TextStreamer``). Generation stops at any of ``eos_token_id`` (default: the
    model's), included in the output. ``input_ids`` may be a tokenizer's output (``BatchEncoding``
    or dict; ``generate(model, **inputs)`` works too), ``attention_mask`` all ones (one sequence,
    no padding). The model is in eval mode during the call (greedy is then deterministic), its
    own mode restored after. Every argument is checked by :mod:`medusa_lite.decoding.inputs`. Where the
    heads' tree is dynamic (it knows this machine's step costs), speculation pauses while it does
    not pay (:class:`~medusa_lite.trees.dynamic_tree.SpeculationGate`).

    ``model.generate``'s options, under its names and with its meaning, applied exactly
    (:mod:`medusa_lite.decoding.options`: each draft node's logits processed with that node's own
    prefix): ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, ``bad_words_ids``,
    ``logits_processor`` (transformers ``LogitsProcessor`` s, after those), ``stop_strings`` (with
    ``tokenizer``), ``max_time`` (seconds) and ``stopping_criteria``. ``output_scores`` /
    ``output_logits`` keep each new token's scores / raw logits as ``model.generate`` returns them
    (:class:`~medusa_lite.decoding.options.TokenScores`). To call medusa-lite exactly as
    ``model.generate`` is called (a ``GenerationConfig``, its return value), use :meth:`MedusaModel.generate`.
    """
    settings = SamplingSettings(temperature, top_k, top_p)
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    proposers = resolve_proposers(model, proposers, tree, lookup_tokens, datastore, datastore_tokens)
    check_tree_attention_supported(model.base_model)
    check_architecture(text_config(model.base_model))  # a family no tree mask verifies: refused before any work
    prompt = as_prompt(input_ids, model.device, attention_mask)
    check_token_ids(prompt, model.vocab_size)
    check_context(prompt.numel(), max_new_tokens, context_limit(model))
    eos = eos_ids(eos_token_id, model)
    scoring = ScoreOptions(
        score_processors(
            prompt.numel(),
            eos,
            repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
            min_new_tokens=min_new_tokens,
            bad_words_ids=bad_words_ids,
            logits_processor=logits_processor,
        ),
        stop_criteria(
            stop_strings=stop_strings, tokenizer=tokenizer, max_time=max_time, stopping_criteria=stopping_criteria
        ),
    )
    check_generator(generator, model.device)
    check_streamer(streamer)
    running, budgets = start(proposers, model, prompt, max_new_tokens - 1)

    shape = heads_tree(running)
    stats = GenerationStats(tree_nodes=shape.num_nodes, tree_depth=shape.depth, accepted_at_depth=[0] * shape.depth)
    if streamer is not None:
        streamer.put(prompt[None].cpu())
    history = prompt  # prompt + committed tokens: where the lookups search
    kept = TokenScores.asked(output_scores, output_logits, settings)

    def scores_at(draft: DraftTree, logits: torch.Tensor) -> torch.Tensor:
        """The scores every node's token is picked from: its logits, processed with its own prefix when asked."""
        return processed_scores(scoring.processors, history, draft, logits) if scoring.processes else logits

    def commit(tokens: torch.Tensor, scores: torch.Tensor, logits: torch.Tensor | None) -> bool:
        """Append accepted tokens (``scores`` / ``logits``: each one's row it was picked from); True when
        generation is finished."""
        nonlocal history
        tokens, hit_eos = cut_at_eos(tokens, eos)
        if scoring.stops:
            stop = first_stop(scoring.criteria, history, tokens, scores)
            tokens, hit_eos = (tokens, hit_eos) if stop is None else (tokens[: stop + 1], True)
        kept.keep(scores, logits, tokens.numel())
        history = torch.cat([history, tokens])
        stats.new_tokens += tokens.numel()
        if streamer is not None:
            streamer.put(tokens.cpu())
        return hit_eos or stats.new_tokens >= max_new_tokens

    finished = max_new_tokens == 0
    if not finished:
        # Room for the whole generation: the prompt, every new token and the widest step's draft.
        cache = reserved_cache(model, prompt.numel() + max_new_tokens + sum(budgets))
        # Only the last position's logits are needed (as in transformers' generate): the lm_head
        # over a long prompt would otherwise cost more than several decoding steps.
        prefill = model.target_forward(prompt[None], cache=cache, use_cache=True, logits_to_keep=1)
        stats.target_calls += 1
        prefill_scores = scores_at(root_draft(prompt[-1]), prefill.logits[0, -1:])  # history is the prompt
        root = pick_tokens(prefill_scores, settings, generator)
        layers = sorted({layer for proposer in running for layer in proposer.feature_layers})
        unseen = TargetStates.of(prefill.select(0), layers)  # what the proposers have not been shown yet
        hidden = unseen.final[-1]
        finished = commit(root, prefill_scores, prefill.logits[0, -1:])

    pricing = next((p.pricing for p in running if p.pricing is not None), None)  # this machine's step costs
    gate = SpeculationGate()
    while not finished:
        # Never guess past max_new_tokens: a step commits at most depth + 1 tokens.
        room = max_new_tokens - stats.new_tokens - 1
        prefix_len = cache.get_seq_length()
        speculates = pricing is None or gate.speculates
        step = StepContext(model, history, root, hidden, root_draft(root), room, 0, settings, generator, unseen)
        draft = propose_draft(running, budgets, step) if speculates else step.draft
        unseen = unseen.emptied() if speculates else unseen
        sides = [proposer.side_rows(replace(step, draft=draft)) if speculates else None for proposer in running]
        verified, side_logits = verify_draft_and_side_rows(model, cache, draft, sides)
        stats.target_calls += 1
        scores = scores_at(draft, verified.logits)
        path, root = accept(draft, scores, settings, generator)
        keep_accepted_in_cache(cache, prefix_len, path)
        unseen = unseen.then(TargetStates.of(verified, layers, path))
        hidden = unseen.final[-1]
        accepted = torch.cat([draft.tokens[path[1:]], root])
        for proposer, logits in zip(running, side_logits):
            proposer.accepted(StepOutcome(draft, path, accepted, side_logits=logits))
        record_step(stats, draft, path)
        if pricing is not None:
            gate = gate_after_step(gate, pricing, speculates, draft, path, room)
            stats.plain_steps += not speculates
        finished = commit(accepted, scores[path], verified.logits[path] if output_logits else None)

    sequences = history[None]
    if streamer is not None:
        streamer.end()
    return GenerationOutput(sequences, stats, *kept.as_tuples())
