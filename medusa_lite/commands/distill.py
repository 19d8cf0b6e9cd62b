"""``medusa-lite distill``: a head-training set from the target itself (:mod:`medusa_lite.training.distill`).

    medusa-lite distill --num-samples 3000 --batch-size 16 --max-new-tokens 192 \\
        --out data/self_distill/smollm2_selfdistill.jsonl
    # task-style user turns (the model writes the passage after the opener): longer prompts
    medusa-lite distill --task-openers default --max-prompt-tokens 320 --num-samples 2000 \\
        --out data/self_distill/smollm2_tasks.jsonl
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from medusa_lite.artifacts.loading import load_target
from medusa_lite.commands.options import set_threads
from medusa_lite.dtypes import EXPLICIT_DTYPE_CHOICES, dtype_name, parse_dtype
from medusa_lite.training.distill import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_PROMPT_TOKENS,
    DEFAULT_RESPONSE_TOP_P,
    DEFAULT_SEED,
    GREEDY_TEMPERATURE,
    TASK_OPENERS,
    DistillSettings,
    check_settings_file,
    run_distillation,
)

DEFAULT_NUM_SAMPLES = 3000
ATTENTION = "sdpa"  # plain batched generation, left-padded: no tree attention
DEFAULT_OUT = Path("data/self_distill/selfdistill.jsonl")
EPSILON_SECONDS = 1e-9  # avoids dividing by zero when there was nothing left to do


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite distill",
        description="Build a head-training set from the target model itself, with no external data.",
    )
    parser.add_argument("--model", default=None, help="model folder or Hub id (default: the default model)")
    parser.add_argument("--num-samples", type=int, default=DEFAULT_NUM_SAMPLES)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=DEFAULT_MAX_PROMPT_TOKENS,
        help="longest generated question; longer ones are discarded",
    )
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="longest response")
    parser.add_argument(
        "--response-temperature", type=float, default=GREEDY_TEMPERATURE, help="0 = greedy responses (default)"
    )
    parser.add_argument("--response-top-p", type=float, default=DEFAULT_RESPONSE_TOP_P)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--dtype", choices=EXPLICIT_DTYPE_CHOICES, default=dtype_name(torch.bfloat16))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--task-openers",
        default=None,
        help="'default' (the built-in TASK_OPENERS) or a text file, one opener per line "
        "(write \\n for a line break); user turns start with them in turn",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser


def read_task_openers(source: str | None) -> tuple[str, ...]:
    """The openers ``--task-openers`` names: none, the built-in list, or a file's non-empty lines."""
    if source is None:
        return ()
    if source == "default":
        return TASK_OPENERS
    path = Path(source)
    if not path.is_file():
        raise SystemExit(f"--task-openers: {source} is neither 'default' nor a file")
    openers = tuple(
        line.replace("\\n", "\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    )
    if not openers:
        raise SystemExit(f"--task-openers: {source} holds no opener (one per line)")
    return openers


def settings_from_args(args: argparse.Namespace) -> DistillSettings:
    return DistillSettings(
        batch_size=args.batch_size,
        max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        response_temperature=args.response_temperature,
        response_top_p=args.response_top_p,
        task_openers=read_task_openers(args.task_openers),
    )


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the distillation ``argv`` describes; return its throughput counters."""
    args = build_parser().parse_args(argv)
    set_threads(args.threads)
    settings = settings_from_args(args)
    dtype = parse_dtype(args.dtype)
    model, tokenizer = load_target(args.model, dtype, args.device, attn_implementation=ATTENTION)
    run_settings = {"model": args.model or "default", "dtype": dtype_name(dtype), **asdict(settings)}
    if settings.task_openers:
        run_settings["task_openers"] = list(settings.task_openers)  # as JSON reads it back
    else:  # absent = none: files started before openers existed still resume
        del run_settings["task_openers"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    check_settings_file(args.out, run_settings)
    stats = run_distillation(model, tokenizer, args.out, args.num_samples, settings)
    seconds = max(stats["seconds"], EPSILON_SECONDS)
    print(
        f"wrote {stats['records']} records to {args.out} in {seconds:.1f} s "
        f"(questions {stats['question_seconds']:.1f} s, answers {stats['answer_seconds']:.1f} s): "
        f"{stats['records'] / seconds:.3f} samples/s, {stats['response_tokens'] / seconds:.1f} response tokens/s"
    )
    return stats


def command(argv: Sequence[str]) -> int:
    main(argv)
    return 0
