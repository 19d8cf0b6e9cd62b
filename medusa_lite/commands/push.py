"""``medusa-lite push``: upload a trained artifact to the Hugging Face Hub
(:func:`medusa_lite.artifacts.hub.push_heads_to_hub`).

    medusa-lite push runs/smollm2-heads/heads your-name/smollm2-medusa-heads [--private] [--revision BRANCH]

The token comes from ``--token``, else ``HF_TOKEN`` / ``huggingface-cli login``; the endpoint from
``--endpoint``, else ``HF_ENDPOINT`` (default https://huggingface.co).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from medusa_lite.artifacts.hub import push_heads_to_hub


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite push", description="Upload trained Medusa heads (the whole artifact) to the Hub."
    )
    parser.add_argument(
        "heads",
        help="the heads folder as training writes it (config.json + model.safetensors, and any adapter/, "
        "tree.json and datastore.safetensors in it: everything load() reads is uploaded)",
    )
    parser.add_argument(
        "repo_id", help="the Hub repo to upload to (created if missing), e.g. your-name/model-medusa-heads"
    )
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--revision", default=None, help="upload to this branch (created if missing)")
    parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the saved login)")
    parser.add_argument("--commit-message", default="Upload Medusa heads")
    parser.add_argument(
        "--endpoint", default=None, help="the Hub's address (default: HF_ENDPOINT or https://huggingface.co)"
    )
    return parser


def command(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    url = push_heads_to_hub(
        args.heads,
        args.repo_id,
        token=args.token,
        private=args.private,
        revision=args.revision,
        commit_message=args.commit_message,
        endpoint=args.endpoint,
    )
    print(f"pushed {args.heads} to {args.repo_id}: {url}")
    return 0
