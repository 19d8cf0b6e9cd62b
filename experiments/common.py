"""What several experiments share: the repository's paths, and the package's benchmark and calibration helpers.

The experiments import only the installed ``medusa_lite`` package (run them from the repository
root after ``make install``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from medusa_lite.bench.questions import DEFAULT_QUESTIONS as SPEC_BENCH_QUESTIONS
from medusa_lite.bench.questions import categories_in_order, read_questions, stratified_subset
from medusa_lite.commands.calibrate import GREEDY, head_hits, random_prefix, timed_step
from medusa_lite.training.data import TokenizedData, load_training_data

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO_ROOT / "benchmarks"
OUTPUTS = REPO_ROOT / "outputs"
HEADS_CONFIG = REPO_ROOT / "configs" / "smollm2_heads.yaml"
DRAFTER_CONFIG = REPO_ROOT / "configs" / "smollm2_drafter.yaml"

__all__ = [
    "BENCHMARKS",
    "DRAFTER_CONFIG",
    "GREEDY",
    "HEADS_CONFIG",
    "OUTPUTS",
    "REPO_ROOT",
    "SPEC_BENCH_QUESTIONS",
    "categories_in_order",
    "config_split",
    "head_hits",
    "random_prefix",
    "read_questions",
    "stratified_subset",
    "timed_step",
]


def config_split(config_path: Path, tokenizer) -> TokenizedData:
    """The train / held-out split a training config gives: its data files, max_length, eval_fraction and seed."""
    config = yaml.safe_load(config_path.read_text())
    return load_training_data(
        [str(REPO_ROOT / path) for path in config["data"]],
        tokenizer,
        max_length=config["max_length"],
        eval_fraction=config["eval_fraction"],
        seed=config.get("seed", 0),
    )
