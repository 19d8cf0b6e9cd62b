"""Prompt lookup: guesses copied from the text so far, grafted onto the heads' candidate tree.

Much of what a model writes repeats its context (summaries quote the document, code reuses
names, answers restate the question). Prompt-lookup decoding (Saxena 2023; transformers'
``prompt_lookup_num_tokens``) finds the latest earlier occurrence of the last few tokens and
guesses that what followed it then follows again. The heads guess from the hidden state, the
lookup from the text: they fail on different tokens, so verifying both in the same tree forward
accepts more per step than either alone.

Decoding stays exact: the chain is one more set of deterministic candidates, merged into the
tree as a trie (a chain token equal to an existing guess reuses that node, so siblings stay
distinct: :func:`medusa_lite.trees.draft.graft`), and the acceptance rule does not care where a
candidate came from. :class:`PromptLookup` is the proposer; :func:`default_lookups` is the order
the lookups are asked in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.base import Candidates, FirstOf, Proposer, check_token_count, depth_cap
from medusa_lite.proposers.datastore import Datastore, datastore_continuation
from medusa_lite.trees.draft import DATASTORE_SOURCE, PROMPT_LOOKUP_SOURCE

if TYPE_CHECKING:
    from medusa_lite.decoding.model import MedusaModel

# Longest n-gram matched first, down to the shortest (transformers' PLD defaults to 2 -> 1).
LOOKUP_MAX_NGRAM = 3
LOOKUP_MIN_NGRAM = 1
# How far a match is trusted: ``generate`` copies at most this many tokens per matched token (a
# lone matched token -> 2 guesses, a 3-token match -> 6). Chosen by replaying greedy decoding on
# 120 held-out self-distilled prompts with measured step costs (benchmarks/lookup_policy/; the
# figures: docs/results.md, "Choosing the defaults offline").
LOOKUP_TOKENS_PER_MATCHED_TOKEN = 2
# Most prompt-lookup guesses per step (replay: benchmarks/lookup_policy/).
DEFAULT_LOOKUP_TOKENS = 6
# A prompt-lookup match this long is preferred to the datastore (replay: benchmarks/lookup_policy/).
TRUSTED_MATCH_TOKENS = 2
# Most datastore guesses per step (medusa_lite.proposers.datastore). Replay: benchmarks/lookup_policy/.
DEFAULT_DATASTORE_TOKENS = 4


def latest_match(
    history: torch.Tensor, max_ngram: int = LOOKUP_MAX_NGRAM, min_ngram: int = LOOKUP_MIN_NGRAM
) -> tuple[int, int | None]:
    """(n, index of the token that followed it) for the latest earlier occurrence of ``history``'s last n-gram.

    Tries n = ``max_ngram`` down to ``min_ngram``: the longest n-gram that has an earlier
    occurrence wins, and of its occurrences the most recent. (0, None) when nothing matches.
    """
    length = history.numel()
    for n in range(max_ngram, min_ngram - 1, -1):
        if length <= n:
            continue
        # Windows starting at i = 0 .. length-1-n: each is followed by at least one token.
        windows = history[: length - 1].unfold(0, n, 1)
        starts = torch.nonzero((windows == history[length - n :]).all(dim=-1)).flatten()
        if starts.numel():
            return n, int(starts[-1]) + n
    return 0, None


def prompt_lookup(
    history: torch.Tensor,
    max_tokens: int,
    max_ngram: int = LOOKUP_MAX_NGRAM,
    min_ngram: int = LOOKUP_MIN_NGRAM,
    tokens_per_matched_token: int | None = None,
) -> torch.Tensor:
    """Up to ``max_tokens`` ids that followed the latest earlier occurrence of ``history``'s last n-gram
    (:func:`latest_match`); an empty tensor when nothing matches.

    ``tokens_per_matched_token``: also at most this many ids per matched token (None: no such limit).
    """
    if max_tokens <= 0:
        return history[:0]
    n, follow = latest_match(history, max_ngram, min_ngram)
    return copy_after_match(history, n, follow, max_tokens, tokens_per_matched_token)


def copy_after_match(
    history: torch.Tensor, n: int, follow: int | None, max_tokens: int, tokens_per_matched_token: int | None = None
) -> torch.Tensor:
    """The ids after a match of ``n`` tokens found by :func:`latest_match` (``follow``: where they start).

    At most ``max_tokens``, and at most ``tokens_per_matched_token * n`` (None: no such limit); empty without a match.
    """
    if follow is None or max_tokens <= 0:
        return history[:0]
    count = max_tokens if tokens_per_matched_token is None else min(max_tokens, tokens_per_matched_token * n)
    return history[follow : follow + count]


@dataclass(frozen=True)
class PromptLookup(Proposer):
    """Prompt lookup (:mod:`medusa_lite.proposers.lookup`): what followed the latest earlier occurrence of the
    text's last n-gram (n = ``max_ngram`` down to ``min_ngram``), at most ``max_tokens`` tokens and
    ``tokens_per_matched_token`` per matched token (None: no such limit)."""

    max_tokens: int = DEFAULT_LOOKUP_TOKENS
    min_ngram: int = 1
    max_ngram: int = LOOKUP_MAX_NGRAM
    tokens_per_matched_token: int | None = LOOKUP_TOKENS_PER_MATCHED_TOKEN
    name: ClassVar[str] = PROMPT_LOOKUP_SOURCE

    def __post_init__(self) -> None:
        check_token_count(self.max_tokens, "lookup_tokens")
        if not (
            isinstance(self.min_ngram, int)
            and isinstance(self.max_ngram, int)
            and 1 <= self.min_ngram <= self.max_ngram
        ):
            raise GenerationInputError(
                f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {self.min_ngram!r}, {self.max_ngram!r}"
            )

    def max_nodes(self, limits):
        per_match = (
            self.max_tokens
            if self.tokens_per_matched_token is None
            else self.tokens_per_matched_token * self.max_ngram
        )
        return depth_cap(min(self.max_tokens, per_match), limits.max_depth)

    def chain(self, history: torch.Tensor, max_depth: int, model: MedusaModel | None = None) -> torch.Tensor:
        """The guesses after ``history`` (empty when nothing matches)."""
        return prompt_lookup(
            history, min(self.max_tokens, max_depth), self.max_ngram, self.min_ngram, self.tokens_per_matched_token
        )

    def propose(self, step):
        chain = self.chain(step.history, step.max_depth)
        return Candidates.chain(chain) if chain.numel() else None


@dataclass(frozen=True)
class DatastoreLookup(Proposer):
    """Datastore lookup (:mod:`medusa_lite.proposers.datastore`): at most ``max_tokens`` guesses voted by the
    datastore's continuations of the text's last n-gram. ``datastore``: True = ``model.datastore``
    (none: proposes nothing), a :class:`Datastore`, or None/False."""

    datastore: Datastore | bool | None = True
    max_tokens: int = DEFAULT_DATASTORE_TOKENS
    name: ClassVar[str] = DATASTORE_SOURCE

    def __post_init__(self) -> None:
        check_token_count(self.max_tokens, "datastore_tokens")
        if not (self.datastore is None or isinstance(self.datastore, (bool, Datastore))):
            raise GenerationInputError(
                "datastore must be a medusa_lite.Datastore, True (the model's), False or None, "
                f"got {type(self.datastore).__name__}"
            )

    def store(self, model: MedusaModel | None) -> Datastore | None:
        return (model.datastore if model is not None else None) if self.datastore is True else self.datastore or None

    def begin(self, model, prompt, limits):
        store = self.store(model)
        if store is not None:
            store.check_fits(model.vocab_size)
        return DatastoreLookup(store, self.max_tokens)

    def max_nodes(self, limits):
        return depth_cap(self.max_tokens, limits.max_depth) if self.store(limits.model) is not None else 0

    def chain(self, history: torch.Tensor, max_depth: int, model: MedusaModel | None = None) -> torch.Tensor:
        """The guesses after ``history`` (empty when nothing matches or there is no datastore)."""
        store = self.store(model)
        return (
            history[:0] if store is None else datastore_continuation(store, history, min(self.max_tokens, max_depth))
        )

    def propose(self, step):
        chain = self.chain(step.history, step.max_depth, step.model)
        return Candidates.chain(chain) if chain.numel() else None


def default_lookups(
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS,
    datastore: Datastore | bool | None = True,
    datastore_tokens: int = DEFAULT_DATASTORE_TOKENS,
) -> FirstOf:
    """Prompt lookup with a match of ``TRUSTED_MATCH_TOKENS`` or more, else the datastore, else a 1-token match."""
    return FirstOf(
        (
            PromptLookup(lookup_tokens, min_ngram=TRUSTED_MATCH_TOKENS),
            DatastoreLookup(datastore, datastore_tokens),
            PromptLookup(lookup_tokens, min_ngram=1, max_ngram=TRUSTED_MATCH_TOKENS - 1),
        )
    )


def lookup_chain(
    history: torch.Tensor, lookup_tokens: int, datastore: Datastore | None, datastore_tokens: int
) -> tuple[torch.Tensor, bool]:
    """(the default lookups' guesses after ``history``, whether they came from the datastore)."""
    for member in default_lookups(lookup_tokens, datastore or None, datastore_tokens).members:
        chain = member.chain(history, max(lookup_tokens, datastore_tokens))
        if chain.numel():
            return chain, member.name == DATASTORE_SOURCE
    return history[:0], False
