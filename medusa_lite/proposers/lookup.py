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
candidate came from. :class:`medusa_lite.proposers.base.PromptLookup` is the proposer.
"""

from __future__ import annotations

import torch

from medusa_lite.trees.draft import DraftTree, draft_tree, graft_chain  # noqa: F401  (the draft tree lived here; re-exported)

# Longest n-gram matched first, down to the shortest (transformers' PLD defaults to 2 -> 1).
LOOKUP_MAX_NGRAM = 3
LOOKUP_MIN_NGRAM = 1
# How far a match is trusted: ``generate`` copies at most this many tokens per matched token (a
# lone matched token -> 2 guesses, a 3-token match -> 6). Chosen by replaying greedy decoding on
# 120 held-out self-distilled prompts with measured step costs (benchmarks/lookup_policy/): with
# the row_gemm kernel and the 4-node tree, chains of 6/4/2 tokens for 3/2/1-token matches predict
# 1.89 tokens/step and 1.76x (1.54x before the cheaper tree attention), the best of 630 policies
# 1.77x, the earlier 3-node tree with a flat 3-token chain 1.74 and 1.62x.
LOOKUP_TOKENS_PER_MATCHED_TOKEN = 2


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
