"""What several experiments share: the repository's data paths, Spec-Bench questions, one timed step.

The experiments import only the installed ``medusa_lite`` package (run them from the repository
root). The Spec-Bench readers and the step timer follow ``infer/benchmark.py`` and
``infer/calibrate_tree.py``, which are scripts, not importable package modules.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import Cache

from medusa_lite.generate import accepted_path, propose
from medusa_lite.model import MedusaModel
from medusa_lite.sampling import SamplingSettings, pick_tokens
from medusa_lite.tree import Tree
from medusa_lite.verify import keep_accepted_in_cache, verify_tree

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO_ROOT / "benchmarks"
OUTPUTS = REPO_ROOT / "outputs"
HEADS_CONFIG = REPO_ROOT / "configs" / "smollm2_heads.yaml"
SPEC_BENCH_QUESTIONS = REPO_ROOT / "data" / "spec_bench" / "question.jsonl"
GREEDY = SamplingSettings()
NO_NODES = torch.zeros(0, dtype=torch.long)
PREFIX_SEED = 0


def read_questions(path: str | Path = SPEC_BENCH_QUESTIONS) -> list[dict]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def categories_in_order(questions: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(question["category"] for question in questions))


def stratified_subset(questions: Sequence[dict], n: int) -> list[dict]:
    """``n`` questions taken round-robin over the categories (the i-th of each category in turn)."""
    by_category = {c: [q for q in questions if q["category"] == c] for c in categories_in_order(questions)}
    chosen: list[dict] = []
    depth = 0
    while len(chosen) < min(n, len(questions)):
        for category_questions in by_category.values():
            if depth < len(category_questions) and len(chosen) < n:
                chosen.append(category_questions[depth])
        depth += 1
    return chosen


def random_prefix(vocab_size: int, length: int, seed: int = PREFIX_SEED) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=generator)


def timed_step(model: MedusaModel, cache: Cache, hidden: torch.Tensor, root: torch.Tensor, tree: Tree) -> float:
    """Seconds of one whole greedy decoding step; the cache is put back as it was."""
    prefix_len = cache.get_seq_length()
    start = time.perf_counter()
    draft = propose(model, hidden, root, tree)
    verified = verify_tree(model, cache, draft, draft.tokens)
    target_tokens = pick_tokens(verified.logits, GREEDY)
    keep_accepted_in_cache(cache, prefix_len, accepted_path(draft, draft.tokens, target_tokens))
    seconds = time.perf_counter() - start
    keep_accepted_in_cache(cache, prefix_len, NO_NODES)  # back to the bare prefix
    return seconds
