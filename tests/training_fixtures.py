"""Shared pieces of the head-training tests: a tiny target saved to disk and learnable data.

The target is a random 2-layer LlamaForCausalLM (hidden size 32) with the tiny ChatML
tokenizer, saved with ``save_pretrained`` so ``train_heads.py`` loads it by path like any model.
The data are conversations whose answers cycle through a fixed list of words (each one token),
starting at a random place: the token two positions ahead is a function of the current token, so
head 1 can learn it (chance is 1 / vocab size), and held-out conversations follow the same rule.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
import yaml
from tiny_models import tiny_base_model
from tiny_tokenizer import IM_END, TINY_VOCAB_SIZE, make_tiny_tokenizer

CYCLE = ["the", "and", "of", "is", "a", "to", "in", "sun", "water", "air"]
QUESTIONS = ["Please count with the words.", "Go on with the list.", "What comes next?", "Continue the pattern."]
REPO_ROOT = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = REPO_ROOT / "train" / "train_heads.py"
TINY_CONFIG = REPO_ROOT / "configs" / "tiny_test.yaml"


# Sharper output distributions than a default random init (lm_head std 0.02 gives near-uniform
# logits), so that heads reusing the frozen lm_head can express confident guesses quickly.
LOGIT_SCALE = 30.0


def save_tiny_target(folder: Path, *, chat_template: bool = True, logit_scale: float = LOGIT_SCALE) -> Path:
    tokenizer = make_tiny_tokenizer()
    if not chat_template:
        tokenizer.chat_template = None
    model = tiny_base_model(
        "llama",
        vocab_size=TINY_VOCAB_SIZE,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        logit_scale=logit_scale,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def pattern_answer(rng: random.Random, length: int) -> str:
    start = rng.randrange(len(CYCLE))
    return " ".join(CYCLE[(start + i) % len(CYCLE)] for i in range(length))


def write_pattern_data(
    path: Path, num_records: int, *, seed: int = 0, answer_words: int = 24, style: str = "sharegpt"
) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as handle:
        for _ in range(num_records):
            question, answer = rng.choice(QUESTIONS), pattern_answer(rng, answer_words)
            if style == "sharegpt":
                record = {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]}
            else:
                record = {
                    "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
                }
            handle.write(json.dumps(record) + "\n")
    return path


def write_distinct_pattern_data(path: Path, *, seed: int = 0, answer_words: int = 24) -> Path:
    """Every (question, starting word) pair once, in a seeded order: no two records are alike, so a
    held-out split is disjoint from the training split (``write_pattern_data`` repeats records)."""
    answers = [" ".join(CYCLE[(start + i) % len(CYCLE)] for i in range(answer_words)) for start in range(len(CYCLE))]
    records = [
        {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]}
        for question in QUESTIONS
        for answer in answers
    ]
    random.Random(seed).shuffle(records)
    return write_records(path, records)


def write_records(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def tiny_argv(model_dir: Path, data: Path, output_dir: Path, **overrides) -> list[str]:
    """argv for ``train_heads.main``: the tiny config plus the run's paths and overrides."""
    argv = [
        "--config",
        str(TINY_CONFIG),
        "--model",
        str(model_dir),
        "--data",
        str(data),
        "--output_dir",
        str(output_dir),
    ]
    for key, value in overrides.items():
        argv += [
            f"--{key}",
            yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            if not isinstance(value, str)
            else value,
        ]
    return argv


# -- pytest fixtures (import them into a test module to use them) -------------------------------


@pytest.fixture(autouse=True)
def single_thread():
    """One intra-op thread: tiny models on 2 shared cores run several times faster than with 2."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return save_tiny_target(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="session")
def pattern_data(tmp_path_factory) -> Path:
    return write_pattern_data(tmp_path_factory.mktemp("pattern-data") / "train.jsonl", 80)


def subprocess_env() -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        WANDB_MODE="offline",
        PYTHONPATH=str(REPO_ROOT),
    )
    return env
