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
from dataclasses import replace

import torch

from medusa_lite.decoding.acceptance import accept, accepted_path
from medusa_lite.decoding.architectures import check_architecture
from medusa_lite.decoding.batch import generate_batch
from medusa_lite.decoding.batch_costs import batch_costs_for
from medusa_lite.decoding.cache import reserved_cache
from medusa_lite.decoding.inputs import (
    as_prompts,
    check_batch_outputs,
    check_context,
    check_generator,
    check_max_new_tokens,
    check_streamer,
    check_token_ids,
    checked_model_in_eval_mode,
    context_limit,
    eos_ids,
    pad_id,
)
from medusa_lite.decoding.model import MedusaModel, TargetOutput, check_tree_attention_supported, text_config
from medusa_lite.decoding.options import (
    ScoreOptions,
    TokenScores,
    score_processors,
    stop_criteria,
)
from medusa_lite.decoding.sampling import SamplingSettings, pick_tokens
from medusa_lite.decoding.steps import (
    GenerationOutput,
    GenerationStats,
    committed_part,
    fresh_stats,
    gate_after_step,
    node_scores,
    record_step,
    resolve_proposers,
    running_feature_layers,
    running_pricing,
    split_side_logits,
    stacked_side_rows,
    start,
)
from medusa_lite.decoding.verify import keep_accepted_in_cache, verify_tree, verify_with_side_rows
from medusa_lite.drafters.medusa.proposer import heads_draft, tree_tokens
from medusa_lite.proposers.base import (
    Proposer,
    SideRows,
    StepContext,
    StepOutcome,
    TargetStates,
    propose_draft,
)
from medusa_lite.proposers.datastore import Datastore
from medusa_lite.proposers.lookup import (
    DEFAULT_DATASTORE_TOKENS,
    DEFAULT_LOOKUP_TOKENS,
    TRUSTED_MATCH_TOKENS,
    lookup_chain,
)
from medusa_lite.trees.draft import DraftTree, root_draft
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


# -- verify, accept and commit -----------------------------------------------------------------
def verify_draft_and_side_rows(
    model: MedusaModel, cache, draft: DraftTree, sides: Sequence[SideRows | None]
) -> tuple[TargetOutput, list[torch.Tensor | None]]:
    """:func:`verify_draft`, with the proposers' side rows (None: none) in the same forward; each one's logits."""
    stacked = stacked_side_rows(sides)
    if stacked is None:
        return verify_draft(model, cache, draft), [None] * len(sides)
    verified, logits = verify_with_side_rows(model, cache, draft, draft.tokens, stacked)
    return verified, split_side_logits(sides, logits)


def verify_draft(model: MedusaModel, cache, draft: DraftTree) -> TargetOutput:
    """The target's logits and hidden states at every draft node; a root-only draft takes a plain
    one-token forward (no tree mask), as cheap as a step of ``model.generate``."""
    if draft.num_nodes > 1:
        return verify_tree(model, cache, draft, draft.tokens)
    out = model.target_forward(draft.tokens[None], cache=cache, use_cache=True)
    return out.select(0)


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
    pad_token_id: int | None = None,
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
    or dict; ``generate(model, **inputs)`` works too). A batch ``[B, L]`` of left-padded prompts with its
    ``attention_mask`` decodes every row exactly as it would alone, in one verification forward per step
    (:mod:`medusa_lite.decoding.batch`); ``.sequences`` is laid out as ``model.generate`` lays it out, rows that
    end early filled with ``pad_token_id`` (default: the model's pad token, else its EOS), ``.row_stats``
    each row's statistics. A batch takes no ``streamer`` and no ``output_scores`` / ``output_logits``.
    The model is in eval mode during the call (greedy is then deterministic), its own mode restored after.
    Every argument is checked by :mod:`medusa_lite.decoding.inputs`. Where the
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
    ids, padding = as_prompts(input_ids, model.device, attention_mask)
    for row, pad in enumerate(padding.tolist()):
        check_token_ids(ids[row, pad:], model.vocab_size)
    check_context(ids.shape[1] - int(padding.min()), max_new_tokens, context_limit(model))
    eos = eos_ids(eos_token_id, model)
    processor_options = dict(
        repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        min_new_tokens=min_new_tokens,
        bad_words_ids=bad_words_ids,
        logits_processor=logits_processor,
    )
    stop_options = dict(stop_strings=stop_strings, tokenizer=tokenizer, max_time=max_time)

    def scoring_for(prompt_length: int) -> ScoreOptions:
        """The options as one row's processors and stop criteria (``min_new_tokens`` counts from its prompt)."""
        processors = score_processors(prompt_length, eos, **processor_options)
        return ScoreOptions(processors, stop_criteria(**stop_options, stopping_criteria=stopping_criteria))

    check_generator(generator, model.device)
    check_streamer(streamer)
    if ids.shape[0] > 1 or int(padding[0]):
        check_batch_outputs(streamer, output_scores, output_logits)
        pad = pad_id(pad_token_id, model, eos)
        return generate_batch(
            model,
            ids,
            padding,
            max_new_tokens,
            settings=settings,
            proposers=proposers,
            eos=eos,
            scoring_for=scoring_for,
            generator=generator,
            pad_token_id=pad,
            batch_costs=batch_costs_for(model, ids.shape[0]) if ids.shape[0] > 1 else None,
        )
    prompt = ids[0]
    scoring = scoring_for(prompt.numel())
    running, budgets = start(proposers, model, prompt, max_new_tokens - 1)

    stats = fresh_stats(running)
    if streamer is not None:
        streamer.put(prompt[None].cpu())
    history = prompt  # prompt + committed tokens: where the lookups search
    kept = TokenScores.asked(output_scores, output_logits, settings)

    def commit(tokens: torch.Tensor, scores: torch.Tensor, logits: torch.Tensor | None) -> bool:
        """Append accepted tokens (``scores`` / ``logits``: each one's row it was picked from); True when
        generation is finished."""
        nonlocal history
        tokens, hit_eos = committed_part(scoring, history, tokens, scores, eos)
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
        prefill_scores = node_scores(scoring, history, root_draft(prompt[-1]), prefill.logits[0, -1:])
        root = pick_tokens(prefill_scores, settings, generator)
        layers = running_feature_layers(running)
        unseen = TargetStates.of(prefill.select(0), layers)  # what the proposers have not been shown yet
        hidden = unseen.final[-1]
        finished = commit(root, prefill_scores, prefill.logits[0, -1:])

    pricing = running_pricing(running)  # this machine's step costs
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
        scores = node_scores(scoring, history, draft, verified.logits)
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
