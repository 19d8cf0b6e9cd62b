"""``medusa-lite export``: a trained drafter written for a serving engine (:mod:`medusa_lite.export`).

    medusa-lite export runs/smollm2-heads/heads --format vllm --out exported/smollm2-medusa-vllm
    python -c "from vllm import LLM; ..."  # speculative_config from exported/.../export.json

``--model``: the target the drafter belongs to (default: the default model); its lm_head is
written beside heads that share it, and the heads are checked against its sizes first.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import torch

from medusa_lite.artifacts.loading import heads_source_for, load_target, read_drafter
from medusa_lite.decoding.model import base_model_name, check_heads_fit
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.errors import ExportError
from medusa_lite.export import FORMATS, export_drafter, refusal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite export", description="Write a trained drafter in a serving engine's format."
    )
    parser.add_argument(
        "artifact", nargs="?", default=None, help="the drafter folder or Hub repo (default: the shipped heads)"
    )
    parser.add_argument("--format", choices=FORMATS, default="vllm", help="the engine's format (default: vllm)")
    parser.add_argument("--out", required=True, help="the folder to write (created if missing)")
    parser.add_argument("--model", default=None, help="the target model (default: the default model)")
    parser.add_argument(
        "--token-map",
        action="store_true",
        help="heads with a draft vocabulary: write vLLM's truncated-vocabulary layout (guesses as medusa-lite's; "
        "vLLM 0.32's weight check refuses it) instead of guessing among the whole vocabulary",
    )
    return parser


def command(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    drafter, _ = read_drafter(heads_source_for(args.model, args.artifact))
    reason = refusal(drafter, args.format)
    if reason is not None:  # before the target is loaded
        raise ExportError(reason)
    base, _ = load_target(args.model, torch.float32, "cpu")
    if isinstance(drafter, MedusaHeads):
        check_heads_fit(base, drafter.config)
    record = export_drafter(
        drafter,
        base.get_output_embeddings(),
        args.out,
        format=args.format,
        target=base_model_name(base),
        token_map=args.token_map,
    )
    print(f"wrote {args.out} ({args.format}, for {record['target']}); in vLLM:")
    print(f"  vllm.LLM(model=<the target>, speculative_config={json.dumps(record['speculative_config'])})")
    return 0
