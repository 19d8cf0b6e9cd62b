"""``medusa-lite`` / ``python -m medusa_lite``: generate from a prompt, streaming text as it is accepted.

    medusa-lite --prompt "Why is the sky blue?"              # default model + shipped heads
    medusa-lite --prompt "..." --compare                      # also time plain model.generate
    medusa-lite --model path/or/hub-id --heads heads/folder --prompt "..." --temperature 0.7

The prompt goes through the tokenizer's chat template (``--raw`` feeds it as is). After the text
comes a summary line: new tokens, tokens/s, mean accepted tokens per target call (new tokens / target
calls, prefill included: plain decoding scores 1.00). ``--compare`` then runs plain
``model.generate`` with the same settings, prints its tokens/s, the speed-up, and (greedy)
whether both outputs are token-identical. Both are warmed up first so neither pays first-call costs.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import transformers
from transformers import TextStreamer

from medusa_lite.errors import MedusaError
from medusa_lite.generate import DEFAULT_DATASTORE_TOKENS, DEFAULT_LOOKUP_TOKENS, generate
from medusa_lite.kernels import cpu_capability, kernel_path
from medusa_lite.loading import DTYPES, load, tree_of
from medusa_lite.prepack import prepack_backend, prepacked_rows
from medusa_lite.sampling import SamplingSettings

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."
DEFAULT_MAX_NEW_TOKENS = 256
WARMUP_TOKENS = 8
EXIT_USAGE_ERROR = 2


# -- helpers shared with infer/ ----------------------------------------------------------------
def chat_input_ids(tokenizer, prompt: str, *, raw: bool = False) -> torch.Tensor:
    """Token ids [1, L] of a one-turn chat (the tokenizer's template), or of ``prompt`` as is."""
    if raw or not getattr(tokenizer, "chat_template", None):
        return tokenizer(prompt, return_tensors="pt").input_ids
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids


def plain_generate(base_model, input_ids: torch.Tensor, max_new_tokens: int, settings: SamplingSettings, **extra) -> torch.Tensor:
    """New tokens [n] of plain ``model.generate`` with the same sampling settings as medusa-lite."""
    sampling = {"do_sample": False}
    if not settings.greedy:
        sampling = {"do_sample": True, "temperature": settings.temperature, "top_k": settings.top_k or 0, "top_p": settings.top_p or 1.0}
    pad = base_model.generation_config.pad_token_id
    eos = base_model.generation_config.eos_token_id
    out = base_model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        pad_token_id=pad if pad is not None else eos if isinstance(eos, int) else 0,
        **sampling,
        **extra,
    )
    return out[0, input_ids.shape[1] :]


def timed(function: Callable[[], object]) -> tuple[object, float]:
    """(result, seconds of wall time)."""
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(dtype: torch.dtype, model: torch.nn.Module | None = None) -> dict:
    """Where and how a measurement ran, to store next to it; with ``model``, also its ``prepacked_rows``."""
    info = {
        "cpu": cpu_model(),
        "cpu_capability": cpu_capability(),
        "kernel": kernel_path().as_dict(),
        "torch_threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if model is not None:
        info["prepacked_rows"] = prepacked_rows(model)  # None: linear weights not pre-packed
        info["prepack_backend"] = prepack_backend(model)
    return info


def prepack_choice(args: argparse.Namespace) -> bool | None:
    """``load``'s ``prepack`` for a command's ``--no-prepack`` flag: False, else None (automatic)."""
    return False if args.no_prepack else None


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


# -- the command -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="medusa-lite", description="Generate with exact Medusa speculative decoding.")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message (default: a demo question)")
    parser.add_argument("--model", default=None, help="HF model folder or Hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--heads", default=None, help="Medusa heads folder or Hub repo (default: the shipped heads)")
    parser.add_argument("--tree", default=None, help="tree.json to decode with (default: tree.json beside the heads, else derived)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument(
        "--lookup-tokens", type=int, default=DEFAULT_LOOKUP_TOKENS, help=f"prompt-lookup guesses added to the tree per step (0 = heads only; default {DEFAULT_LOOKUP_TOKENS})"
    )
    parser.add_argument(
        "--datastore-tokens",
        type=int,
        default=DEFAULT_DATASTORE_TOKENS,
        help=f"guesses per step from the datastore beside the heads, where the text has no match (0 = none; default {DEFAULT_DATASTORE_TOKENS})",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=list(DTYPES), default="auto", help="auto: fp32 on CPU (faster there, and exact), bf16 on GPU")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-prepack", action="store_true", help="do not pre-pack linear weights for few-row GEMMs (default: pre-pack on CPU in fp32)")
    parser.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    parser.add_argument("--compare", action="store_true", help="also run plain model.generate and print the speed-up")
    return parser


@dataclass
class Run:
    tokens: torch.Tensor  # new tokens
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens.numel() / self.seconds if self.seconds else 0.0


def summary_line(run: Run, mean_accepted: float, tree: str, dtype: str) -> str:
    return (
        f"[medusa-lite] {run.tokens.numel()} new tokens in {run.seconds:.2f} s: {run.tokens_per_second:.1f} tokens/s, "
        f"{mean_accepted:.2f} mean accepted tokens per target call ({tree}, {dtype}, {torch.get_num_threads()} threads; "
        f"kernel {kernel_path().describe()})"
    )


def compare_line(medusa: Run, plain: Run, greedy: bool) -> str:
    speedup = medusa.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else 0.0
    identical = ("yes" if torch.equal(medusa.tokens, plain.tokens) else "NO") if greedy else "n/a (sampling)"
    return (
        f"[plain generate] {plain.tokens.numel()} new tokens in {plain.seconds:.2f} s: {plain.tokens_per_second:.1f} tokens/s | "
        f"speed-up {speedup:.2f}x | identical outputs: {identical}"
    )


def run(args: argparse.Namespace) -> None:
    set_threads(args.threads)
    settings = SamplingSettings(args.temperature, args.top_k, args.top_p)
    model, tokenizer = load(args.model, heads=args.heads, dtype=DTYPES[args.dtype], tree=args.tree, prepack=prepack_choice(args))
    tree = tree_of(model)
    input_ids = chat_input_ids(tokenizer, args.prompt, raw=args.raw)

    def medusa_run(max_new_tokens: int, streamer=None):
        generator = torch.Generator(device=model.device).manual_seed(args.seed)
        return generate(
            model,
            input_ids,
            max_new_tokens,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            tree=tree,
            lookup_tokens=args.lookup_tokens,
            datastore_tokens=args.datastore_tokens,
            streamer=streamer,
            generator=generator,
        )

    def plain_run(max_new_tokens: int):
        torch.manual_seed(args.seed)
        return plain_generate(model.base_model, input_ids, max_new_tokens, settings)

    if args.compare:
        medusa_run(WARMUP_TOKENS)
        plain_run(WARMUP_TOKENS)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    output, seconds = timed(lambda: medusa_run(args.max_new_tokens, streamer))
    medusa = Run(output.sequences[0, input_ids.shape[1] :], seconds)
    print(summary_line(medusa, output.stats.mean_accepted_tokens, tree.describe(), str(model.base_model.dtype).removeprefix("torch.")), flush=True)
    if args.compare:
        tokens, seconds = timed(lambda: plain_run(args.max_new_tokens))
        print(compare_line(medusa, Run(tokens, seconds), settings.greedy), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except MedusaError as error:
        print(f"medusa-lite: error: {error}", file=sys.stderr)
        return EXIT_USAGE_ERROR
    return 0
