"""``medusa-lite train``: train Medusa heads on a frozen causal LM.

    medusa-lite train --config configs/smollm2_heads.yaml [--key value ...] [--resume] [--push_to_hub REPO]
    accelerate launch train/train_heads.py --config ...      # the same, on several processes

Any config key can be overridden on the command line (``--epochs 2``, ``--lora.r 16``); unknown
keys are rejected. Writes ``<output_dir>/heads`` (``MedusaHeads.save_pretrained``: config.json
with a ``training_summary`` + model.safetensors, and ``adapter/`` in Medusa-2 (``lora``) mode: the
layout of medusa_lite/artifacts/files.py), ``<output_dir>/checkpoints/step-*`` and ``<output_dir>/metrics.jsonl``.
See medusa_lite/training/ for the pieces and README.md ("Training heads") for recipes.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from medusa_lite.training.config import load_config
from medusa_lite.training.run import TrainResult
from medusa_lite.training.trainer import train

EXIT_PUSH_FAILED = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite train",
        description="Train Medusa heads on a frozen causal LM.",
        epilog="Other --key value pairs override config keys.",
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML training config (configs/*.yaml)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the latest complete checkpoint in output_dir"
    )
    parser.add_argument("--push_to_hub", metavar="REPO", help="upload the trained heads to this Hub repo after saving")
    return parser


def main(argv: Sequence[str] | None = None) -> TrainResult:
    args, overrides = build_parser().parse_known_args(argv)
    config = load_config(args.config, overrides)
    return train(config, resume=args.resume, push_to_hub=args.push_to_hub)


def command(argv: Sequence[str]) -> int:
    """Exit status 3 when training succeeded but the push did not."""
    return EXIT_PUSH_FAILED if main(argv).push_error else 0
