"""Candidate trees: which of the heads' top-k guesses are verified together.

A tree is a set of paths of top-k ranks (Medusa's ``medusa_choices`` format): the path
``(0, 2)`` is "head 1's best guess, followed by head 2's third-best guess". Node 0 is the root,
the token the target itself produced last (not yet in the KV cache); the node for a path of
length d sits at depth d and holds a guess of head d.

Everything decoding needs about a tree's shape is computed once here, as tensors:
depths (position offsets), parents, ranks, the ancestor-or-self attention mask.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from medusa_lite.errors import TreeError
from medusa_lite.values import as_integer, describe

Path = tuple[int, ...]


def validate_paths(paths: Iterable[Sequence[int]]) -> tuple[Path, ...]:
    """Check a user tree and return it as sorted tuples (shallow first, then by ranks).

    Raises :class:`TreeError` naming the offending path for: a path that is not a sequence of
    non-negative ints, an empty path, a duplicate, or a path whose parent is missing.
    """
    if isinstance(paths, (str, bytes)):
        raise TreeError(f"a tree is a list of paths of top-k ranks, got the string {paths!r}")
    try:
        paths = list(paths)
    except TypeError as error:
        raise TreeError(f"a tree is a list of paths of top-k ranks, got {describe(paths)}") from error
    seen: set[Path] = set()
    for raw in paths:
        if isinstance(raw, (torch.Tensor, np.ndarray)) and raw.ndim == 1:
            raw = list(raw)  # a row of an array of paths
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            raise TreeError(f"tree path {raw!r} is not a sequence of top-k ranks")
        if len(raw) == 0:
            raise TreeError("tree path () is empty: the root is implicit, list only paths of length >= 1")
        path = tuple(as_integer(rank) for rank in raw)  # numpy and 0-d tensor integers are ranks too
        for rank, number in zip(raw, path):
            if number is None or number < 0:
                raise TreeError(f"tree path {tuple(raw)!r} holds {rank!r}: ranks must be integers >= 0")
        if path in seen:
            raise TreeError(f"tree path {path!r} appears twice")
        seen.add(path)
    for path in seen:
        if len(path) > 1 and path[:-1] not in seen:
            raise TreeError(f"tree path {path!r} has no parent: {path[:-1]!r} is missing")
    return tuple(sorted(seen, key=lambda p: (len(p), p)))


@dataclass(frozen=True)
class Tree:
    """A validated candidate tree with its precomputed shape tensors (on CPU)."""

    paths: tuple[Path, ...]

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]]) -> Tree:
        return cls(validate_paths(paths))

    @property
    def num_nodes(self) -> int:
        """Nodes verified per step, the root included."""
        return len(self.paths) + 1

    @property
    def depth(self) -> int:
        """Longest path: the most guessed tokens one step can accept."""
        return max((len(p) for p in self.paths), default=0)

    def topk_per_depth(self) -> list[int]:
        """How many guesses head d (d = 1..depth) must offer: 1 + the largest rank used at depth d."""
        needed = [0] * self.depth
        for path in self.paths:
            needed[len(path) - 1] = max(needed[len(path) - 1], path[-1] + 1)
        return needed

    @cached_property
    def node_depths(self) -> torch.Tensor:
        return torch.tensor([0] + [len(p) for p in self.paths], dtype=torch.long)

    @cached_property
    def node_ranks(self) -> torch.Tensor:
        """Top-k rank of each node's guess (0 for the root, whose token is not a guess)."""
        return torch.tensor([0] + [p[-1] for p in self.paths], dtype=torch.long)

    @cached_property
    def parents(self) -> torch.Tensor:
        """Index of each node's parent (the root is its own parent)."""
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        index[()] = 0
        return torch.tensor([0] + [index[p[:-1]] for p in self.paths], dtype=torch.long)

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: ``mask[i, j]`` is True when node j is node i or one of its ancestors."""
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        index[()] = 0
        mask = torch.eye(self.num_nodes, dtype=torch.bool)
        for path, i in index.items():
            for cut in range(len(path)):
                mask[i, index[path[:cut]]] = True
        return mask

    def describe(self) -> str:
        return f"{self.num_nodes}-node tree (depth {self.depth})"

    def pruned(self, max_depth: int) -> Tree:
        """The same tree without nodes deeper than ``max_depth`` (used near a length limit)."""
        return _pruned(self, max_depth)

    def check_fits(self, num_heads: int) -> None:
        if self.depth > num_heads:
            raise TreeError(
                f"tree depth {self.depth} exceeds the {num_heads} Medusa heads: a node at depth d needs head d"
            )


@lru_cache(maxsize=256)
def _pruned(tree: Tree, max_depth: int) -> Tree:
    if max_depth >= tree.depth:
        return tree
    return Tree(tuple(p for p in tree.paths if len(p) <= max_depth))


def check_topk_fits(tree: Tree, guess_vocab_size: int) -> None:
    """A rank must index into the tokens the heads guess among (the vocabulary, or a draft vocabulary)."""
    widest = max(tree.topk_per_depth(), default=0)
    if widest > guess_vocab_size:
        raise TreeError(f"tree uses top-{widest} guesses but the heads guess among only {guess_vocab_size} tokens")


def ranked_paths(rank_probability: Sequence[Sequence[float]], count: int) -> list[tuple[float, Path]]:
    """The ``count`` likeliest paths of top-k ranks, best first, each with its probability.

    ``rank_probability[d][r]`` is the chance that head d+1's rank-r guess is right; ranks must be
    sorted likeliest first (as top-k is). A path's probability is the product of its ranks' (heads
    taken as independent). Extending a path or moving to a later sibling can only lower the
    probability, so a best-first search from ``(0,)`` yields paths in order without enumerating
    them all, and every prefix of the result is a valid tree (each path's parent comes before it).
    """
    heap: list[tuple[float, Path, float]] = []  # (-probability, path, its parent's probability)

    def push(path: Path, parent_probability: float) -> None:
        depth, rank = len(path) - 1, path[-1]
        if depth < len(rank_probability) and rank < len(rank_probability[depth]):
            heapq.heappush(heap, (-parent_probability * rank_probability[depth][rank], path, parent_probability))

    push((0,), 1.0)
    ranked: list[tuple[float, Path]] = []
    while heap and len(ranked) < count:
        negative, path, parent_probability = heapq.heappop(heap)
        ranked.append((-negative, path))
        push(path + (0,), -negative)  # first child
        push(path[:-1] + (path[-1] + 1,), parent_probability)  # next sibling
    return ranked


def best_tree(topk_accuracy: Sequence[Sequence[float]], num_nodes: int) -> Tree:
    """The tree of ``num_nodes - 1`` guesses that maximises the expected accepted length.

    ``topk_accuracy[d][r]`` is the probability that head d+1's rank-r guess is the right token
    (measured on held-out data). Assuming heads are independent, a path's chance of being
    accepted is the product of its ranks' accuracies, and the expected number of accepted
    guesses is the sum of that over all paths of the tree, so the likeliest paths
    (:func:`ranked_paths`) make the optimal tree (Medusa's construction).
    """
    if num_nodes < 1:
        raise TreeError(f"a tree has at least its root: num_nodes must be >= 1, got {num_nodes}")
    return Tree.from_paths(path for _, path in ranked_paths(topk_accuracy, num_nodes - 1))


def expected_accepted_tokens(tree: Tree, topk_accuracy: Sequence[Sequence[float]]) -> float:
    """Expected tokens per step under independent heads: 1 (the bonus) + sum of path probabilities."""
    total = 1.0
    for path in tree.paths:
        probability = 1.0
        for d, r in enumerate(path):
            probability *= topk_accuracy[d][r] if d < len(topk_accuracy) and r < len(topk_accuracy[d]) else 0.0
        total += probability
    return total


# Per-rank accuracies of four heads on SmolLM2-135M-Instruct, measured on held-out self-distilled
# data (../shared/DESIGN.md §2, the team's design notes: top-1 0.43/0.28/0.22/0.17, top-5 0.67/0.49/0.40/0.34, ranks
# 2-5 split
# evenly). Only used to shape the default tree when heads ship no measured accuracies.
REFERENCE_TOPK_ACCURACY = (
    (0.43, 0.06, 0.06, 0.06, 0.06),
    (0.28, 0.0525, 0.0525, 0.0525, 0.0525),
    (0.22, 0.045, 0.045, 0.045, 0.045),
    (0.17, 0.0425, 0.0425, 0.0425, 0.0425),
)
# Verifying 16 tokens costs little more than one on a CPU (docs/results.md, "Measurements behind the
# code's choices").
DEFAULT_TREE_NODES = 16


def default_tree(num_heads: int, num_nodes: int = DEFAULT_TREE_NODES, training_summary: dict | None = None) -> Tree:
    """The tree for ``num_heads`` heads when none was calibrated: the heads' ``training_summary["tree"]``, else
    the best tree of ``num_nodes`` for its ``"topk_accuracy"``, else for reference accuracies (CPU-sized)."""
    summary = training_summary or {}
    if summary.get("tree"):
        tree = Tree.from_paths(summary["tree"])
    else:
        reference = [REFERENCE_TOPK_ACCURACY[min(d, len(REFERENCE_TOPK_ACCURACY) - 1)] for d in range(num_heads)]
        tree = best_tree(summary.get("topk_accuracy") or reference, num_nodes)
    tree.check_fits(num_heads)
    return tree


@runtime_checkable
class CandidateTree(Protocol):
    """What decoding needs of a tree: a static :class:`Tree`, or a per-step policy that shapes one
    from the heads' confidence (:class:`~medusa_lite.trees.dynamic_tree.DynamicTree`, which builds on this
    module). :func:`as_tree` takes either as is."""

    @property
    def num_nodes(self) -> int: ...

    def describe(self) -> str: ...

    def pruned(self, max_depth: int) -> CandidateTree: ...

    def check_fits(self, num_heads: int) -> None: ...


def as_tree(
    tree: CandidateTree | Iterable[Sequence[int]] | None, num_heads: int, training_summary: dict | None = None
) -> CandidateTree:
    """The one rule for a ``tree=`` argument (``generate``, ``MedusaModel``, and ``load`` once it has read any
    tree.json): a Tree or DynamicTree as is, rank paths -> Tree, None -> :func:`default_tree` for the heads'
    ``training_summary``; checked to fit ``num_heads``."""
    if tree is None:
        resolved = default_tree(num_heads, training_summary=training_summary)
    elif isinstance(tree, CandidateTree):
        resolved = tree
    else:
        try:
            paths = list(tree)
        except TypeError as error:
            raise TreeError(f"a tree is a list of paths of top-k ranks, got {describe(tree)}") from error
        hashable = _as_hashable(paths)
        resolved = Tree.from_paths(paths) if hashable is None else _tree_from_hashable(hashable)
    resolved.check_fits(num_heads)
    return resolved


def _as_hashable(paths: list) -> tuple | None:
    """Paths as a tuple of tuples (so repeated calls reuse one Tree), or None unless every rank is a plain int.

    The cache compares keys with ``==``, under which ``True == 1 == 1.0``: other types go through
    validation every time, so that they are refused.
    """
    try:
        hashable = tuple(tuple(p) if isinstance(p, Sequence) and not isinstance(p, (str, bytes)) else p for p in paths)
    except TypeError:
        return None
    if all(isinstance(p, tuple) and all(type(rank) is int for rank in p) for p in hashable):
        return hashable
    return None


@lru_cache(maxsize=64)
def _tree_from_hashable(paths: tuple) -> Tree:
    return Tree.from_paths(paths)
