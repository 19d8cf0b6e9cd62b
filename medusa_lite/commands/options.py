"""Command-line pieces the ``medusa-lite`` commands and the ``infer/`` scripts share."""

from __future__ import annotations

import argparse

import torch

EXIT_USAGE_ERROR = 2


def set_threads(threads: int | None) -> None:
    """``--threads``: torch's CPU threads, when given."""
    if threads:
        torch.set_num_threads(threads)


def prepack_choice(args: argparse.Namespace) -> bool | None:
    """``load``'s ``prepack`` for a command's ``--no-prepack`` flag: False, else None (automatic)."""
    return False if args.no_prepack else None
