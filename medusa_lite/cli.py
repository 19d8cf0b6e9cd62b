"""``medusa-lite`` / ``python -m medusa_lite``: generate from a prompt, streaming text as it is accepted.

    medusa-lite --prompt "Why is the sky blue?"              # default model + shipped heads
    medusa-lite generate --prompt "..."                       # the same: generate is the default
    medusa-lite --prompt "..." --compare                      # also time plain model.generate
    medusa-lite --model path/or/hub-id --heads heads/folder --prompt "..." --temperature 0.7

The prompt goes through the tokenizer's chat template (``--raw`` feeds it as is). After the text
comes a summary line: new tokens, tokens/s, mean accepted tokens per target call (new tokens / target
calls, prefill included: plain decoding scores 1.00). ``--compare`` then runs plain
``model.generate`` with the same settings, prints its tokens/s, the speed-up, and (greedy)
whether both outputs are token-identical. Both are warmed up first so neither pays first-call costs.

The other subcommands (``medusa-lite SUBCOMMAND --help``) live in :mod:`medusa_lite.commands`:
``calibrate`` (tree.json for this machine), ``benchmark`` (Spec-Bench) and ``microbench``,
``train`` (also ``accelerate launch train/train_heads.py``), ``distill`` (a training set from the
target itself), ``build-datastore``, ``push`` (an artifact to the Hub).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

import torch
from transformers import TextStreamer

from medusa_lite.artifacts.loading import load, tree_of
from medusa_lite.bench.measure import TimedRun, chat_input_ids, plain_generate, timed
from medusa_lite.commands.options import EXIT_USAGE_ERROR, prepack_choice, set_threads
from medusa_lite.cpu.kernels import kernel_path
from medusa_lite.decoding.generate import DEFAULT_DATASTORE_TOKENS, DEFAULT_LOOKUP_TOKENS, generate
from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.dtypes import DTYPE_CHOICES, dtype_name, parse_dtype
from medusa_lite.errors import MedusaError
from medusa_lite.proposers.draft_model import load_draft_model

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."
DEFAULT_MAX_NEW_TOKENS = 256
WARMUP_TOKENS = 8
GENERATE = "generate"
SUBCOMMANDS = {  # name -> "module:function(argv) -> exit status", imported only when run (as console_scripts)
    "calibrate": "medusa_lite.commands.calibrate:main",
    "build-datastore": "medusa_lite.commands.build_datastore:command",
    "distill": "medusa_lite.commands.distill:command",
    "benchmark": "medusa_lite.commands.benchmark:main",
    "microbench": "medusa_lite.commands.microbench:main",
    "gpu-check": "medusa_lite.commands.gpu_check:main",
    "push": "medusa_lite.commands.push:command",
    "export": "medusa_lite.commands.export:command",
    "train": "medusa_lite.commands.train:command",
}


# -- the command -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite",
        description=(
            "Generate with exact Medusa speculative decoding (the default subcommand, also `medusa-lite generate`)."
        ),
        epilog=f"other subcommands: {', '.join(SUBCOMMANDS)} (`medusa-lite SUBCOMMAND --help`)",
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message (default: a demo question)")
    parser.add_argument("--model", default=None, help="HF model folder or Hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--heads", default=None, help="Medusa heads folder or Hub repo (default: the shipped heads)")
    parser.add_argument(
        "--tree", default=None, help="tree.json to decode with (default: tree.json beside the heads, else derived)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument(
        "--lookup-tokens",
        type=int,
        default=DEFAULT_LOOKUP_TOKENS,
        help=f"prompt-lookup guesses added to the tree per step (0 = heads only; default {DEFAULT_LOOKUP_TOKENS})",
    )
    parser.add_argument(
        "--datastore-tokens",
        type=int,
        default=DEFAULT_DATASTORE_TOKENS,
        help=(
            "guesses per step from the datastore beside the heads, where the text has no match (0 = none; "
            f"default {DEFAULT_DATASTORE_TOKENS})"
        ),
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="auto: fp32 on CPU (faster there, and exact), bf16 on GPU",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--no-prepack",
        action="store_true",
        help="do not pre-pack linear weights for few-row GEMMs (default: pre-pack on CPU in fp32)",
    )
    parser.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    parser.add_argument("--compare", action="store_true", help="also run plain model.generate and print the speed-up")
    parser.add_argument(
        "--draft-model",
        default=None,
        help="decode with this draft model (an HF causal LM folder or Hub id sharing the target's tokenizer) instead "
        "of the heads and lookups: classic speculative decoding",
    )
    return parser


def summary_line(run: TimedRun, mean_accepted: float, tree: str, dtype: str) -> str:
    return (
        f"[medusa-lite] {run.tokens.numel()} new tokens in {run.seconds:.2f} s: {run.tokens_per_second:.1f} tokens/s, "
        f"{mean_accepted:.2f} mean accepted tokens per target call ({tree}, {dtype}, "
        f"{torch.get_num_threads()} threads; "
        f"kernel {kernel_path().describe()})"
    )


def compare_line(medusa: TimedRun, plain: TimedRun, greedy: bool) -> str:
    speedup = medusa.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else 0.0
    identical = ("yes" if torch.equal(medusa.tokens, plain.tokens) else "NO") if greedy else "n/a (sampling)"
    return (
        f"[plain generate] {plain.tokens.numel()} new tokens in {plain.seconds:.2f} s: "
        f"{plain.tokens_per_second:.1f} tokens/s | "
        f"speed-up {speedup:.2f}x | identical outputs: {identical}"
    )


def run(args: argparse.Namespace) -> None:
    set_threads(args.threads)
    settings = SamplingSettings(args.temperature, args.top_k, args.top_p)
    model, tokenizer = load(
        args.model, heads=args.heads, dtype=parse_dtype(args.dtype), tree=args.tree, prepack=prepack_choice(args)
    )
    tree = tree_of(model)
    input_ids = chat_input_ids(tokenizer, args.prompt, raw=args.raw)
    if args.draft_model:
        sources = {"proposers": [load_draft_model(args.draft_model, model, tokenizer)]}
        description = f"draft model {args.draft_model}"
    else:
        sources = {"tree": tree, "lookup_tokens": args.lookup_tokens, "datastore_tokens": args.datastore_tokens}
        description = tree.describe()

    def medusa_run(max_new_tokens: int, streamer=None):
        generator = torch.Generator(device=model.device).manual_seed(args.seed)
        return generate(
            model,
            input_ids,
            max_new_tokens,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            streamer=streamer,
            generator=generator,
            **sources,
        )

    def plain_run(max_new_tokens: int):
        torch.manual_seed(args.seed)
        return plain_generate(model.base_model, input_ids, max_new_tokens, settings)

    if args.compare:
        medusa_run(WARMUP_TOKENS)
        plain_run(WARMUP_TOKENS)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    output, seconds = timed(lambda: medusa_run(args.max_new_tokens, streamer))
    medusa = TimedRun(output.sequences[0, input_ids.shape[1] :], seconds)
    print(
        summary_line(medusa, output.stats.mean_accepted_tokens, description, dtype_name(model.base_model.dtype)),
        flush=True,
    )
    if args.compare:
        tokens, seconds = timed(lambda: plain_run(args.max_new_tokens))
        print(compare_line(medusa, TimedRun(tokens, seconds), settings.greedy), flush=True)


def generate_command(argv: Sequence[str]) -> int:
    run(build_parser().parse_args(argv))
    return 0


def split_command(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(subcommand, its arguments): ``generate`` when the first argument names no subcommand."""
    if argv and argv[0] in (GENERATE, *SUBCOMMANDS):
        return argv[0], list(argv[1:])
    return GENERATE, list(argv)


def subcommand(name: str) -> Callable[[list[str]], int]:
    """The function ``SUBCOMMANDS[name]`` names, its module imported now."""
    module, function = SUBCOMMANDS[name].split(":")
    return getattr(importlib.import_module(module), function)


def main(argv: Sequence[str] | None = None) -> int:
    """``medusa-lite [SUBCOMMAND] ...``: run the subcommand; a clear error and exit status 2 on a ``MedusaError``."""
    name, arguments = split_command(sys.argv[1:] if argv is None else argv)
    command = generate_command if name == GENERATE else subcommand(name)
    try:
        return command(arguments)
    except MedusaError as error:
        prog = "medusa-lite" if name == GENERATE else f"medusa-lite {name}"
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE_ERROR
