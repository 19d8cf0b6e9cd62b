"""``medusa-lite microbench``: medusa-lite vs plain ``model.generate`` on the same model, in one run.

    medusa-lite microbench                       # tiny random llama, nothing downloaded
    medusa-lite microbench --model path/to/model --heads path/to/heads --dtype bf16

Prints tokens/s and mean accepted tokens per target call (new tokens / target calls, prefill included:
plain decoding = 1.00) of both, greedy, from a random prompt, best of ``--repeats`` runs after a
warm-up, and whether the outputs are token-identical. Without ``--heads`` the heads are fresh
(identity residual blocks: each head guesses the target's own next token), so the numbers show
the machinery's overhead and exactness, not trained acceptance.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
from transformers import AutoModelForCausalLM

from medusa_lite.artifacts.loading import load, tree_of
from medusa_lite.bench.measure import plain_generate, timed, tiny_llama
from medusa_lite.commands.options import set_threads
from medusa_lite.decoding.generate import generate
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.dtypes import EXPLICIT_DTYPE_CHOICES, parse_dtype

DEFAULT_NUM_HEADS = 3
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_PROMPT_TOKENS = 32
DEFAULT_REPEATS = 3
WARMUP_TOKENS = 8
SEED = 0


def build_model(args: argparse.Namespace) -> MedusaModel:
    dtype = parse_dtype(args.dtype)
    if args.model and args.heads:
        return load(args.model, heads=args.heads, dtype=dtype)[0]
    if args.model:
        base = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa").eval()
    else:
        base = tiny_llama(dtype, SEED)
    return MedusaModel.with_new_heads(base, args.num_heads).eval()


def best_of(repeats: int, function) -> tuple[object, float]:
    """(result, fastest wall time) over ``repeats`` runs."""
    runs = [timed(function) for _ in range(repeats)]
    return runs[0][0], min(seconds for _, seconds in runs)


def microbench(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, repeats: int) -> dict:
    tree = tree_of(model)
    prompt_len = input_ids.shape[1]

    def medusa():
        return generate(model, input_ids, max_new_tokens, tree=tree)

    def plain():
        return plain_generate(model.base_model, input_ids, max_new_tokens, SamplingSettings())

    generate(model, input_ids, WARMUP_TOKENS, tree=tree)
    plain_generate(model.base_model, input_ids, WARMUP_TOKENS, SamplingSettings())
    medusa_out, medusa_seconds = best_of(repeats, medusa)
    plain_tokens, plain_seconds = best_of(repeats, plain)
    medusa_tokens = medusa_out.sequences[0, prompt_len:]
    return {
        "tree_nodes": tree.num_nodes,
        "tree": tree.describe(),
        "plain_tokens_per_second": plain_tokens.numel() / plain_seconds,
        "medusa_tokens_per_second": medusa_tokens.numel() / medusa_seconds,
        "medusa_mean_accepted_tokens": medusa_out.stats.mean_accepted_tokens,
        "identical": torch.equal(medusa_tokens, plain_tokens),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite microbench", description="medusa-lite vs plain generate: tokens/s and mean accepted tokens."
    )
    parser.add_argument("--model", default=None, help="HF model (default: a tiny random llama, nothing downloaded)")
    parser.add_argument("--heads", default=None, help="trained heads for --model (default: fresh identity heads)")
    parser.add_argument(
        "--num-heads", type=int, default=DEFAULT_NUM_HEADS, help="fresh heads to attach when --heads is not given"
    )
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--dtype", choices=EXPLICIT_DTYPE_CHOICES, default="fp32")
    parser.add_argument("--threads", type=int, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_threads(args.threads)
    model = build_model(args)
    generator = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(0, model.config.vocab_size, (1, args.prompt_tokens), generator=generator).to(
        model.device
    )
    result = microbench(model, input_ids, args.max_new_tokens, args.repeats)
    print(
        f"{args.model or 'tiny random llama'}, {args.dtype}, {torch.get_num_threads()} threads, "
        f"{args.max_new_tokens} new tokens, best of {args.repeats}"
    )
    print(f"  plain model.generate: {result['plain_tokens_per_second']:8.1f} tokens/s, 1.00 mean accepted tokens")
    print(
        f"  medusa-lite         : {result['medusa_tokens_per_second']:8.1f} tokens/s, "
        f"{result['medusa_mean_accepted_tokens']:.2f} mean accepted tokens "
        f"({result['tree']}), identical to plain: {'yes' if result['identical'] else 'NO'}"
    )
    return 0
