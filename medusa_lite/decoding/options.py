"""``model.generate``'s options that change the target's scores or end generation, applied exactly.

transformers' logits processors (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``,
``bad_words_ids``, a user's ``logits_processor``) turn the target's next-token logits into the scores
it decodes from, given the tokens before them; stopping criteria (``stop_strings``, ``max_time``, a
user's ``stopping_criteria``) end generation given those tokens. A speculative step verifies a whole
draft tree at once, so every node's logits are processed with that node's own prefix: the committed
text, then the tokens of the node's ancestors and its own. Each node's scores are then exactly the
ones ``model.generate`` would compute had it reached that prefix, and the acceptance rule
(:mod:`medusa_lite.decoding.acceptance`) keeps the output exact: greedy token for token, sampling in
distribution. Each accepted token is shown to the stopping criteria with its own prefix and scores,
one token at a time, as ``model.generate`` shows them, and generation ends at the first that stops it.

What a processor or criterion may do: compute from the ``input_ids`` and ``scores`` it is given, for
the one row it is given. One that keeps state between calls, or reads
anything else, sees prefixes that are never committed and is not exact with any speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import MaxTimeCriteria, StopStringCriteria

from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.errors import GenerationInputError
from medusa_lite.trees.draft import DraftTree
from medusa_lite.values import as_integer, as_real, describe


@dataclass(frozen=True)
class ScoreOptions:
    """The processors that turn each position's logits into its scores, and the criteria that end generation.

    Empty (the default) costs nothing: the loop then never builds a prefix.
    """

    processors: LogitsProcessorList = field(default_factory=LogitsProcessorList)
    criteria: StoppingCriteriaList = field(default_factory=StoppingCriteriaList)

    @property
    def processes(self) -> bool:
        return len(self.processors) > 0

    @property
    def stops(self) -> bool:
        return len(self.criteria) > 0


# -- building them from model.generate's options ---------------------------------------------------
def check_repetition_penalty(value: object) -> float | None:
    if value is None:
        return None
    penalty = as_real(value)
    if penalty is None or not penalty > 0 or penalty == float("inf"):
        raise GenerationInputError(f"repetition_penalty must be a finite number > 0, got {describe(value)}")
    return penalty


def check_count_option(value: object, name: str) -> int | None:
    if value is None:
        return None
    number = as_integer(value)
    if number is None or number < 0:
        raise GenerationInputError(f"{name} must be an integer >= 0, got {describe(value)}")
    return number


def checked_list(values: object, name: str, kind: type) -> list:
    """A user's processors or criteria as a list, each checked to be one."""
    items = list(values) if isinstance(values, (list, tuple)) else [values]
    for item in items:
        if not isinstance(item, kind) and not callable(item):
            raise GenerationInputError(f"{name} must hold {kind.__name__} objects, got {describe(item)}")
    return items


def without_types_of(defaults: list, given: list) -> list:
    """``defaults`` less those of a type the user gave too: the user's one is used (as ``model.generate`` does)."""
    given_types = {type(item) for item in given}
    return [item for item in defaults if type(item) not in given_types]


def bad_words_processor(bad_words_ids: object, eos: torch.Tensor) -> NoBadWordsLogitsProcessor:
    try:
        return NoBadWordsLogitsProcessor(bad_words_ids, eos if eos.numel() else None)
    except (ValueError, TypeError) as error:
        raise GenerationInputError(f"bad_words_ids: {error}") from None


def score_processors(
    prompt_length: int,
    eos: torch.Tensor,
    *,
    repetition_penalty: object = None,
    no_repeat_ngram_size: object = None,
    min_new_tokens: object = None,
    bad_words_ids: object = None,
    logits_processor: object = None,
) -> LogitsProcessorList:
    """The processors ``model.generate`` builds for these options, in its order, then the user's."""
    defaults: list[LogitsProcessor] = []
    penalty = check_repetition_penalty(repetition_penalty)
    if penalty is not None and penalty != 1.0:
        defaults.append(RepetitionPenaltyLogitsProcessor(penalty))
    ngram = check_count_option(no_repeat_ngram_size, "no_repeat_ngram_size")
    if ngram:
        defaults.append(NoRepeatNGramLogitsProcessor(ngram))
    if bad_words_ids is not None:
        defaults.append(bad_words_processor(bad_words_ids, eos))
    least = check_count_option(min_new_tokens, "min_new_tokens")
    if least and eos.numel():
        defaults.append(MinNewTokensLengthLogitsProcessor(prompt_length, least, eos, device=eos.device))
    given = [] if logits_processor is None else checked_list(logits_processor, "logits_processor", LogitsProcessor)
    return LogitsProcessorList([*without_types_of(defaults, given), *given])


def stop_string_criteria(stop_strings: object, tokenizer) -> StopStringCriteria:
    if tokenizer is None:
        raise GenerationInputError(
            "stop_strings need the model's tokenizer: pass tokenizer= (as model.generate needs it too)"
        )
    strings = [stop_strings] if isinstance(stop_strings, str) else stop_strings
    if not isinstance(strings, Sequence) or not strings or not all(isinstance(s, str) and s for s in strings):
        raise GenerationInputError(
            f"stop_strings must be a string or a list of non-empty strings, got {describe(stop_strings)}"
        )
    return StopStringCriteria(tokenizer=tokenizer, stop_strings=list(strings))


def stop_criteria(
    *, stop_strings: object = None, tokenizer=None, max_time: object = None, stopping_criteria: object = None
) -> StoppingCriteriaList:
    """The criteria ``model.generate`` builds for these options (``max_time`` counts from now), then the user's."""
    defaults: list[StoppingCriteria] = []
    if max_time is not None:
        seconds = as_real(max_time)
        if seconds is None or not seconds > 0:
            raise GenerationInputError(f"max_time must be a number of seconds > 0, got {describe(max_time)}")
        defaults.append(MaxTimeCriteria(seconds))
    if stop_strings is not None:
        defaults.append(stop_string_criteria(stop_strings, tokenizer))
    given = [] if stopping_criteria is None else checked_list(stopping_criteria, "stopping_criteria", StoppingCriteria)
    return StoppingCriteriaList([*without_types_of(defaults, given), *given])


# -- applying them ---------------------------------------------------------------------------------
def node_prefixes(history: torch.Tensor, draft: DraftTree, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the draft's nodes at ``depth``, each one's prefix [n, len(history) + depth]): the committed text
    (which ends with the root), then the node's ancestors' tokens and its own, root excluded.

    Node indices grow with depth, so a node's ancestors, read in index order, are its path in order.
    """
    depths = draft.node_depths.to(history.device)
    nodes = torch.nonzero(depths == depth).flatten()
    on_path = draft.ancestor_mask.to(history.device)[nodes] & (depths > 0)[None, :]
    path_tokens = draft.tokens[None, :].expand(nodes.numel(), -1)[on_path].view(nodes.numel(), depth)
    return nodes, torch.cat([history[None, :].expand(nodes.numel(), -1), path_tokens], dim=1)


def processed_scores(
    processors: LogitsProcessorList, history: torch.Tensor, draft: DraftTree, logits: torch.Tensor
) -> torch.Tensor:
    """The target's logits at every draft node [N, V] -> its scores there [N, V] (float32, as ``model.generate``
    processes them), each node's row processed with that node's own prefix (:func:`node_prefixes`).

    One row per call, as ``model.generate`` calls them for one sequence: a processor written for a batch
    of one stays exact.
    """
    scores = logits.to(dtype=torch.float32, copy=True)  # processors may write in place
    for depth in range(int(draft.node_depths.max()) + 1):
        nodes, prefixes = node_prefixes(history, draft, depth)
        for node, prefix in zip(nodes.tolist(), prefixes):
            scores[node : node + 1] = processors(prefix[None, :], scores[node : node + 1])
    return scores


def first_stop(
    criteria: StoppingCriteriaList, history: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor
) -> int | None:
    """The index of the first of ``tokens`` after which a criterion ends generation (None: none does).

    ``history``: the text before ``tokens``; ``scores`` [len(tokens), V]: the scores each token was
    picked from. Each token is shown with its own prefix, one at a time, as ``model.generate`` shows them.
    """
    text = torch.cat([history, tokens])
    for index in range(tokens.numel()):
        prefix = text[: history.numel() + index + 1][None, :]
        if bool(criteria(prefix, scores[index : index + 1]).any()):
            return index
    return None


def sampling_warpers(settings: SamplingSettings) -> LogitsProcessorList:
    """transformers' warpers for ``settings``, in ``model.generate``'s order (none when greedy): what its
    ``output_scores`` include after the processors when it samples."""
    warpers = LogitsProcessorList()
    if settings.temperature == 0:
        return warpers
    if settings.temperature != 1:
        warpers.append(TemperatureLogitsWarper(settings.temperature))
    if settings.top_k is not None:
        warpers.append(TopKLogitsWarper(settings.top_k))
    if settings.top_p is not None and settings.top_p < 1:
        warpers.append(TopPLogitsWarper(settings.top_p))
    return warpers


@dataclass
class TokenScores:
    """Each committed token's rows, kept as ``model.generate``'s ``output_scores`` / ``output_logits`` keep
    them: ``scores``, the processed scores it was picked from (the sampling warpers applied when sampling),
    and ``logits``, the target's raw logits (float32); one [1, V] tensor per new token, None when not asked."""

    warpers: LogitsProcessorList
    scores: list[torch.Tensor] | None = None
    logits: list[torch.Tensor] | None = None

    @classmethod
    def asked(cls, output_scores: bool, output_logits: bool, settings: SamplingSettings) -> TokenScores:
        return cls(sampling_warpers(settings), [] if output_scores else None, [] if output_logits else None)

    def keep(self, scores: torch.Tensor, logits: torch.Tensor | None, count: int) -> None:
        """Keep the first ``count`` rows of ``scores`` and ``logits`` [n, V]: the tokens committed (``logits``
        may be None when they were not asked for)."""
        if self.scores is not None:
            rows = scores[:count].to(dtype=torch.float32, copy=True)
            rows = self.warpers(torch.empty(count, 0, dtype=torch.long, device=rows.device), rows)
            self.scores.extend(rows.split(1))
        if self.logits is not None:
            self.logits.extend(logits[:count].to(dtype=torch.float32, copy=True).split(1))

    def as_tuples(self) -> tuple[tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:
        return (
            None if self.scores is None else tuple(self.scores),
            None if self.logits is None else tuple(self.logits),
        )
