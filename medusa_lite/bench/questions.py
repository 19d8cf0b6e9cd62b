"""The Spec-Bench questions medusa-lite carries as package data (``spec_bench/``: 480 questions, 13
categories; source, licence and attribution in its README.md), and the subsets benchmarks take of them.
Evaluation data only: never train heads or calibrate trees on them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

DEFAULT_QUESTIONS = Path(__file__).resolve().parent / "spec_bench" / "question.jsonl"


def read_questions(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def categories_in_order(questions: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(question["category"] for question in questions))


def stratified_subset(questions: Sequence[dict], n: int) -> list[dict]:
    """``n`` questions taken round-robin over the categories (the i-th of each category in turn)."""
    by_category = {
        category: [q for q in questions if q["category"] == category] for category in categories_in_order(questions)
    }
    chosen: list[dict] = []
    depth = 0
    while len(chosen) < min(n, len(questions)):
        for category_questions in by_category.values():
            if depth < len(category_questions) and len(chosen) < n:
                chosen.append(category_questions[depth])
        depth += 1
    return chosen
