"""Lookahead decoding as a proposer: n-grams collected from Jacobi iterations, verified like any guess.

Lookahead decoding (Fu et al., ICML 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding") needs no draft model and no training. Each step the target also runs a
*lookahead branch* in the same forward as verification:

- A window of ``levels`` rows (up to ``ngram_size - 1``) by ``window`` columns of guessed tokens.
  The token at level l, column i sits ``i + l + 1`` positions after the root and attends to the
  cached text, the root, level 0's columns 0..i and the levels above it in column i: one causal
  trajectory, so the target's output there is a Jacobi update of the token one position later.
- The last level's outputs (argmax) become a new level. When the window is full, every column
  read downwards plus its new token is an n-gram the target's own iterations produced; it goes
  into the *pool*, keyed by its first token, the newest ``candidates`` per key kept. The oldest
  level is then dropped.
- The verification branch: the pool's n-grams starting with the step's root, merged into one
  trie of deterministic guesses (no q), so the exact acceptance rule needs nothing new.

The lookahead rows ride along as :class:`~medusa_lite.proposers.base.SideRows`: the verification rows
never attend them, and the cache keeps only the accepted path
(:func:`medusa_lite.decoding.verify.verify_with_side_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from medusa_lite.decoding.inputs import context_limit
from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.base import Candidates, Proposer, SideRows, StepContext, StepOutcome, depth_cap

LOOKAHEAD_SOURCE = "lookahead"
# Defaults sized for a CPU, where every verified row costs: 1 + G(N-1) + W(N-1) = 31 rows a step.
DEFAULT_WINDOW = 5
DEFAULT_NGRAM_SIZE = 4
DEFAULT_CANDIDATES = 5

Pool = dict[int, tuple[tuple[int, ...], ...]]  # first token -> the newest distinct continuations, newest first


# -- the pure pieces -----------------------------------------------------------------------------
def window_ngrams(levels: Sequence[Sequence[int]], new_level: Sequence[int]) -> list[tuple[int, ...]]:
    """The n-grams of a full window: each column read from the oldest level down, then its new token."""
    rows = [*levels, new_level]
    return [tuple(row[column] for row in rows) for column in range(len(new_level))]


def updated_pool(pool: Pool, ngrams: Sequence[tuple[int, ...]], per_key: int) -> Pool:
    """``pool`` with ``ngrams`` added under their first tokens; each key keeps its ``per_key`` newest continuations."""
    updated = dict(pool)
    for ngram in ngrams:
        key, continuation = ngram[0], ngram[1:]
        older = tuple(kept for kept in updated.get(key, ()) if kept != continuation)
        updated[key] = ((continuation,) + older)[:per_key]
    return updated


def trie_candidates(continuations: Sequence[tuple[int, ...]], max_depth: int, max_nodes: int) -> Candidates | None:
    """The continuations (each cut to ``max_depth``) merged into one trie below the root, ``max_nodes`` at most."""
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for continuation in continuations:
        parent = 0
        for token in continuation[:max_depth]:
            node = node_of.get((parent, token))
            if node is None:
                if len(tokens) == max_nodes:
                    break
                tokens.append(token)
                parents.append(parent)
                node = node_of[(parent, token)] = len(tokens)
            parent = node
    if not tokens:
        return None
    return Candidates(torch.tensor(tokens, dtype=torch.long), parents, source=LOOKAHEAD_SOURCE)


def window_rows(levels: Sequence[Sequence[int]], device: torch.device) -> SideRows:
    """The lookahead branch's rows, level by level: offsets from the root and who attends to whom."""
    width = len(levels[0])
    count = len(levels) * width
    level = torch.arange(count) // width
    column = torch.arange(count) % width
    same_column_above = (column[:, None] == column[None, :]) & (level[None, :] <= level[:, None])
    level_zero_left = (level[None, :] == 0) & (column[None, :] <= column[:, None])
    return SideRows(
        tokens=torch.tensor([token for row in levels for token in row], dtype=torch.long, device=device),
        offsets=column + level + 1,
        mask=same_column_above | level_zero_left,
    )


def initial_level(prompt: torch.Tensor, window: int, seed: int) -> list[int]:
    """Level 0 before any iteration: ``window`` tokens drawn from the prompt (as the paper's implementation does)."""
    picks = torch.randint(0, prompt.numel(), (window,), generator=torch.Generator().manual_seed(seed))
    return prompt.cpu()[picks].tolist()


def check_positive(value: object, name: str, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise GenerationInputError(f"LookaheadProposer {name} must be an integer >= {least}, got {value!r}")


# -- the proposer ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LookaheadProposer(Proposer):
    """Lookahead decoding's guesses: ``window`` (W) columns of Jacobi iteration, n-grams of ``ngram_size``
    (N) tokens, at most ``candidates`` (G) n-grams verified per step (and kept per first token).
    ``seed`` picks the prompt tokens that start the window."""

    window: int = DEFAULT_WINDOW
    ngram_size: int = DEFAULT_NGRAM_SIZE
    candidates: int = DEFAULT_CANDIDATES
    seed: int = 0
    name: ClassVar[str] = LOOKAHEAD_SOURCE

    def __post_init__(self) -> None:
        check_positive(self.window, "window")
        check_positive(self.ngram_size, "ngram_size", least=2)
        check_positive(self.candidates, "candidates")

    def max_nodes(self, limits):
        return self.candidates * depth_cap(self.ngram_size - 1, limits.max_depth)

    def begin(self, model, prompt, limits):
        return LookaheadRun(self, [initial_level(prompt, self.window, self.seed)], {})

    def propose(self, step):
        raise NotImplementedError("LookaheadProposer is a specification: generate runs the proposer its begin returns")


class LookaheadRun(Proposer):
    """One generation's lookahead state: the window's levels and the n-gram pool."""

    name: ClassVar[str] = LOOKAHEAD_SOURCE

    def __init__(self, spec: LookaheadProposer, levels: list[list[int]], pool: Pool):
        self.spec, self.levels, self.pool = spec, levels, pool

    def begin(self, model, prompt, limits):
        return self.spec.begin(model, prompt, limits)

    def max_nodes(self, limits):
        return self.spec.max_nodes(limits)

    def propose(self, step):
        continuations = self.pool.get(int(step.root), ())[: self.spec.candidates]
        return trie_candidates(continuations, step.max_depth, step.max_nodes) if step.max_depth > 0 else None

    def side_rows(self, step: StepContext) -> SideRows | None:
        if step.max_depth < 1:
            return None  # the last step: nothing after it would use the iteration
        rows = window_rows(self.levels, step.root.device)
        limit = context_limit(step.model)
        if limit is not None and step.history.numel() + int(rows.offsets.max()) > limit:
            return None  # its positions would pass the model's context
        return rows

    def accepted(self, outcome: StepOutcome) -> None:
        if outcome.side_logits is None:
            return
        width = self.spec.window
        new_level = outcome.side_logits[-width:].argmax(dim=-1).tolist()
        if len(self.levels) < self.spec.ngram_size - 1:
            self.levels = self.levels + [new_level]
            return
        ngrams = window_ngrams(self.levels, new_level)
        self.pool = updated_pool(self.pool, ngrams, self.spec.candidates)
        self.levels = self.levels[1:] + [new_level]
