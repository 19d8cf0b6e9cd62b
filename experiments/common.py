"""What several experiments share: the repository's paths, and the package's benchmark and calibration helpers.

The experiments import only the installed ``medusa_lite`` package (run them from the repository
root after ``make install``).
"""

from __future__ import annotations

from pathlib import Path

from medusa_lite.commands.benchmark import DEFAULT_QUESTIONS as SPEC_BENCH_QUESTIONS
from medusa_lite.commands.benchmark import categories_in_order, read_questions, stratified_subset
from medusa_lite.commands.calibrate import GREEDY, head_hits, random_prefix, timed_step

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO_ROOT / "benchmarks"
OUTPUTS = REPO_ROOT / "outputs"
HEADS_CONFIG = REPO_ROOT / "configs" / "smollm2_heads.yaml"

__all__ = [
    "BENCHMARKS",
    "GREEDY",
    "HEADS_CONFIG",
    "OUTPUTS",
    "REPO_ROOT",
    "SPEC_BENCH_QUESTIONS",
    "categories_in_order",
    "head_hits",
    "random_prefix",
    "read_questions",
    "stratified_subset",
    "timed_step",
]
