"""``medusa-lite build-datastore``: the datastore ``generate`` looks up guesses in, from head-training data.

    medusa-lite build-datastore --config configs/smollm2_heads.yaml \\
        --out medusa_lite/assets/smollm2-135m-heads/datastore.safetensors

Reads the config's data files as ``medusa-lite train`` does and keeps the answers of the training
split (:mod:`medusa_lite.training.datastore`). Put the file beside the heads: ``medusa_lite.load``
picks it up from there (a folder or a Hub repo).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from medusa_lite.proposers.datastore import Datastore
from medusa_lite.training.config import load_config
from medusa_lite.training.datastore import datastore_from_training_data

BYTES_PER_MEGABYTE = 1e6


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite build-datastore",
        description="Build the datastore generate looks up guesses in, from head-training data.",
    )
    parser.add_argument("--config", required=True, help="the heads' training config (configs/*.yaml)")
    parser.add_argument("--out", required=True, type=Path, help="where to write datastore.safetensors")
    return parser


def build(config_path: str, out: Path) -> Datastore:
    """Build the datastore of ``config_path``'s training answers, write it to ``out`` and say what it holds."""
    datastore, stats = datastore_from_training_data(load_config(config_path, []))
    print(stats.describe())
    out.parent.mkdir(parents=True, exist_ok=True)
    datastore.save(out)
    size = out.stat().st_size / BYTES_PER_MEGABYTE
    print(f"wrote {out}: {datastore.num_tokens} tokens of {datastore.num_documents} answers ({size:.1f} MB)")
    return datastore


def command(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    build(args.config, args.out)
    return 0
