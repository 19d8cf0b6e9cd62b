"""``medusa-lite benchmark``: Spec-Bench, medusa-lite against plain ``model.generate`` and prompt-lookup decoding.

    medusa-lite benchmark --quick 26          # 2 questions per category (the default)
    medusa-lite benchmark --full --dtype fp32 --threads 2
    medusa-lite benchmark --model M --heads H --tree tree.json --out outputs/benchmark-M

``python infer/benchmark.py`` runs the same; the questions default to the Spec-Bench copy carried as
package data (:mod:`medusa_lite.bench.questions`; ``--questions`` for another file). The harness is
:mod:`medusa_lite.bench.harness`, the summary, table and plots :mod:`medusa_lite.bench.report`.

For each question: the first turn through the chat template, greedy, ``--max-new-tokens`` new
tokens at most (all methods stop at EOS). The methods run in the same process,
interleaved per question, in an order rotated per question so none always runs first (caches,
thermal state); one warm-up run of each comes first.

- ``plain``: ``model.generate(do_sample=False)``.
- ``plain_kernel`` (always, where the weights are packed): the same ``model.generate`` with its
  one-token steps through the packed path, the row_gemm kernel or oneDNN
  (``medusa_lite.cpu.prepack.packed_from_rows``). Where PyTorch's own float32 one-row linear is slow
  (a 2-core AMD EPYC: plain decoding about twice as slow as through the kernel) part of
  medusa-lite's speed-up over ``plain`` is the packed path's, not the speculation's:
  ``speedup_vs_plain_kernel`` in the summary (and a line in ``results.md``) is the speculation's
  share alone.
- ``pld``: transformers' prompt-lookup decoding, ``prompt_lookup_num_tokens=10``.
- ``medusa``: :func:`medusa_lite.generate` with the model's tree (see ``medusa_lite.load``) and
  prompt-lookup guesses grafted onto it (``--lookup-tokens``, the library's default), or the
  datastore's where the text has no match (``--datastore-tokens``, the library's default).
- ``static_tree`` (on request): the same with the static paths of the tree file (``--tree``, or
  ``tree.json`` beside the heads) instead of the per-step dynamic tree.
- ``no_datastore``: the same without the datastore; ``heads``: the heads' tree only (no
  lookups), to show what each source of guesses contributes. ``--methods`` picks a subset
  (``plain`` always runs: it is the reference; so does ``plain_kernel`` where the weights are packed).
- ``lookahead`` (on request): lookahead decoding alone, :class:`medusa_lite.LookaheadProposer` with
  its defaults (no heads, no lookups).

Which kernel runs is ``machine.kernel`` in ``results.json`` (``medusa_lite.cpu.kernels.kernel_path``);
``--kernel off|avx2|avx512|auto`` sets ``MEDUSA_LITE_KERNEL`` for the run (off: oneDNN, as a CPU
without AVX2 or a C compiler gets it; avx2: what an AVX2-only CPU runs).

All methods share one model, whose linear weights ``medusa_lite.load`` pre-packs on CPU in fp32
for the tree's verification size (``--no-prepack``: not); a PLD step of at most that many tokens
uses the packed weights too. ``results.json`` records it as ``machine.prepacked_rows`` and
``machine.prepack_backend`` (``row_gemm``: medusa_lite's kernel, its variant in ``machine.kernel``; ``onednn``: the
oneDNN library PyTorch ships).

Reported per category and overall: mean accepted tokens per target call (new tokens / target calls, the
prefill and the bonus token counted: plain = 1.00; target calls are counted with a forward
hook for plain and PLD; and, as Spec-Bench and the published numbers count it, per decoding
step with each question's prefill and its token left out), tokens/s, speed-up vs plain (plain's
total time / the method's total time), and the fraction of outputs token-identical to plain
greedy. Writes ``results.json``
(every question, the summary, machine, threads, dtype, versions, date), ``results.md`` and two
PNG plots into ``--out`` at the end, and ``progress.jsonl`` (one record per question) as it goes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from medusa_lite.artifacts.loading import (
    find_tree_file,
    heads_source_for,
    load,
    read_tree_file,
    tree_of,
)
from medusa_lite.bench.harness import (
    DEFAULT_METHODS,
    METHODS,
    PLD_NUM_TOKENS,
    PROGRESS_FILE,
    drafter_proposers,
    progress_writer,
    run_benchmark,
)
from medusa_lite.bench.measure import machine_info
from medusa_lite.bench.questions import DEFAULT_QUESTIONS, read_questions, stratified_subset
from medusa_lite.bench.report import markdown_table, summarize, tree_settings, write_outputs
from medusa_lite.commands.options import prepack_choice, set_threads
from medusa_lite.cpu.kernels import KERNEL_CHOICES, KERNEL_ENV_VAR, choose_kernel
from medusa_lite.decoding.generate import DEFAULT_DATASTORE_TOKENS, DEFAULT_LOOKUP_TOKENS
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.dtypes import DTYPE_CHOICES, parse_dtype
from medusa_lite.extras import require_extra
from medusa_lite.proposers.draft_model import load_draft_model
from medusa_lite.trees.tree import Tree

DEFAULT_OUT = Path("outputs/benchmark")
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_QUICK = 26


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite benchmark", description="Spec-Bench: medusa-lite vs plain generate vs prompt lookup, greedy."
    )
    parser.add_argument("--model", default=None, help="HF model folder or Hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--heads", default=None, help="Medusa heads folder or Hub repo (default: the shipped heads)")
    parser.add_argument("--tree", default=None, help="tree.json (default: as medusa_lite.load chooses)")
    parser.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    subset = parser.add_mutually_exclusive_group()
    subset.add_argument(
        "--quick",
        type=int,
        default=DEFAULT_QUICK,
        metavar="N",
        help=f"N questions stratified across categories (default {DEFAULT_QUICK})",
    )
    subset.add_argument("--full", action="store_true", help="all questions")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument(
        "--lookup-tokens",
        type=int,
        default=DEFAULT_LOOKUP_TOKENS,
        help="prompt-lookup guesses per step for 'medusa' (0 = heads only)",
    )
    parser.add_argument(
        "--datastore-tokens",
        type=int,
        default=DEFAULT_DATASTORE_TOKENS,
        help="datastore guesses per step for 'medusa' where the text has no match (0 = none)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=list(DEFAULT_METHODS),
        help="methods to run (plain always runs)",
    )
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="auto: fp32 on CPU, bf16 on GPU")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--no-prepack",
        action="store_true",
        help="do not pre-pack linear weights for few-row GEMMs (default: pre-pack on CPU in fp32)",
    )
    parser.add_argument(
        "--kernel",
        choices=KERNEL_CHOICES,
        default=None,
        help=f"set {KERNEL_ENV_VAR} for this run (default: as the environment says, else auto)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="the 'draft' method's draft model (HF folder or Hub id, the target's tokenizer)",
    )
    parser.add_argument(
        "--drafter",
        default=None,
        help=(
            "the 'drafter' method's sequential drafter or Hydra-style heads (folder or Hub repo; its steps priced on "
            "this machine)"
        ),
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    return parser


def static_tree_for(args: argparse.Namespace, model: MedusaModel) -> Tree | None:
    """The static paths of the tree file ``--tree`` names, else of ``tree.json`` beside the heads, else the model's own
    static tree.
    """
    path = args.tree or find_tree_file(heads_source_for(args.model, args.heads))
    if path is not None:
        return read_tree_file(path, dynamic=False)
    return model.tree if isinstance(model.tree, Tree) else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if "drafter" in args.methods and not args.drafter:
        parser.error("the 'drafter' method needs --drafter PATH (a sequential drafter's folder or Hub repo)")
    require_extra("matplotlib", "The benchmark's plots")  # before the run, not after it
    if args.kernel is not None:
        choose_kernel(args.kernel)
    set_threads(args.threads)
    dtype = parse_dtype(args.dtype)
    model, tokenizer = load(args.model, heads=args.heads, dtype=dtype, tree=args.tree, prepack=prepack_choice(args))
    questions = read_questions(args.questions)
    questions = questions if args.full else stratified_subset(questions, args.quick)
    progress = progress_writer(Path(args.out) / PROGRESS_FILE)
    static_tree = static_tree_for(args, model) if "static_tree" in args.methods else None
    records = run_benchmark(
        model,
        tokenizer,
        questions,
        args.max_new_tokens,
        args.methods,
        args.lookup_tokens,
        args.datastore_tokens,
        on_record=progress,
        static_tree=static_tree,
        draft=load_draft_model(args.draft_model, model, tokenizer)
        if "draft" in args.methods and args.draft_model
        else None,
        drafter=drafter_proposers(model, args.drafter, args.lookup_tokens, args.datastore_tokens, prepack_choice(args))
        if "drafter" in args.methods and args.drafter
        else None,
    )
    summary = summarize(records)
    tree = tree_of(model)

    settings = {
        "command": " ".join(sys.argv),
        "model": args.model or "default",
        "heads": args.heads or "shipped",
        "num_questions": len(records),
        "max_new_tokens": args.max_new_tokens,
        "pld_num_tokens": PLD_NUM_TOKENS,
        "lookup_tokens": args.lookup_tokens,
        "datastore_tokens": args.datastore_tokens,
        "datastore_answers": model.datastore.num_documents if model.datastore is not None else 0,
        **tree_settings(tree),
        "static_tree": [list(path) for path in static_tree.paths] if static_tree is not None else None,
        "machine": machine_info(model.base_model.dtype, model.base_model),
    }
    write_outputs(Path(args.out), summary, records, settings)
    print(markdown_table(summary))
    print(f"wrote {args.out}/results.json, results.md, speedup_by_category.png, acceptance_by_depth.png")
    return 0
