"""``medusa-lite benchmark``: Spec-Bench, medusa-lite against plain ``model.generate`` and prompt-lookup decoding.

    medusa-lite benchmark --quick 26          # 2 questions per category (the default)
    medusa-lite benchmark --full --dtype fp32 --threads 2
    medusa-lite benchmark --model M --heads H --tree tree.json --out outputs/benchmark-M

``python infer/benchmark.py`` runs the same; the questions default to the repository's
``data/spec_bench/question.jsonl`` (``--questions`` elsewhere).

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
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from medusa_lite.artifacts.loading import (
    DRAFTING_KINDS,
    drafter_proposer_for,
    find_tree_file,
    heads_source_for,
    load,
    prepack_for_tree,
    read_artifact,
    read_tree_file,
    tree_of,
)
from medusa_lite.artifacts.resolve import resolve_source
from medusa_lite.bench.measure import chat_input_ids, machine_info, plain_generate, timed
from medusa_lite.commands.options import prepack_choice, set_threads
from medusa_lite.cpu.kernels import KERNEL_CHOICES, KERNEL_ENV_VAR, choose_kernel
from medusa_lite.cpu.prepack import packed_from_rows, prepack_backend
from medusa_lite.decoding.generate import DEFAULT_DATASTORE_TOKENS, DEFAULT_LOOKUP_TOKENS, generate
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.drafters.sequential.proposer import DEFAULT_DRAFTER_NODES
from medusa_lite.dtypes import DTYPE_CHOICES, parse_dtype
from medusa_lite.errors import MedusaError
from medusa_lite.extras import require_extra
from medusa_lite.proposers.base import Proposer, step_rows
from medusa_lite.proposers.draft_model import DraftModelProposer, load_draft_model
from medusa_lite.proposers.lookahead import LookaheadProposer
from medusa_lite.proposers.lookup import default_lookups
from medusa_lite.trees.dynamic_tree import UNMEASURED_ROW_COSTS, DynamicTree
from medusa_lite.trees.tree import Tree

REPO_ROOT = Path(__file__).resolve().parents[2]  # a clone's root, where data/ lives
DEFAULT_QUESTIONS = REPO_ROOT / "data" / "spec_bench" / "question.jsonl"
DEFAULT_OUT = Path("outputs/benchmark")
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_QUICK = 26
PLD_NUM_TOKENS = 10
WARMUP_TOKENS = 16
PROGRESS_FILE = "progress.jsonl"  # one line per finished question, written as the run goes
METHODS = (
    "plain",
    "plain_kernel",
    "pld",
    "medusa",
    "static_tree",
    "no_datastore",
    "heads",
    "drafter",
    "draft",
    "lookahead",
)
LABELS = {
    "plain": "plain generate",
    "plain_kernel": "plain generate, packed path",
    "pld": "prompt lookup (PLD)",
    "medusa": "medusa-lite",
    "static_tree": "medusa-lite, static tree",
    "no_datastore": "medusa-lite, no datastore",
    "heads": "medusa-lite, heads only",
    "drafter": "medusa-lite, drafter (sequential or Hydra-style) + lookups",
    "draft": "medusa-lite, draft model",
    "lookahead": "lookahead decoding (LookaheadProposer, defaults)",
}
DEFAULT_METHODS = (
    "plain",
    "pld",
    "medusa",
    "no_datastore",
    "heads",
)  # "static_tree" on request; "plain_kernel" added where it applies
SHORT = {
    "plain_kernel": "plain kernel",
    "pld": "PLD",
    "medusa": "medusa",
    "static_tree": "static tree",
    "no_datastore": "no datastore",
    "heads": "heads only",
    "drafter": "drafter",
    "draft": "draft model",
}
SHORT["lookahead"] = "lookahead"
OVERALL = "overall"
GREEDY = SamplingSettings()


# -- questions ---------------------------------------------------------------------------------
def read_questions(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def categories_in_order(questions: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(question["category"] for question in questions))


def stratified_subset(questions: Sequence[dict], n: int) -> list[dict]:
    """``n`` questions taken round-robin over the categories (the i-th of each category in turn)."""
    by_category = {
        category: [q for q in questions if q["category"] == category] for category in categories_in_order(questions)
    }
    chosen: list[dict] = []
    depth = 0
    while len(chosen) < min(n, len(questions)):
        for category_questions in by_category.values():
            if depth < len(category_questions) and len(chosen) < n:
                chosen.append(category_questions[depth])
        depth += 1
    return chosen


def rotated(methods: Sequence[str], index: int) -> list[str]:
    shift = index % len(methods)
    return list(methods[shift:]) + list(methods[:shift])


# -- the three methods -------------------------------------------------------------------------
@dataclass
class Result:
    tokens: list[int]
    seconds: float
    target_calls: int
    steps: int = 0  # medusa only: verification steps
    accepted_at_depth: list[int] = field(default_factory=list)  # medusa only
    lookup_steps: int = 0  # medusa only: steps that accepted a lookup-only guess
    datastore_steps: int = 0  # medusa only: of those, steps whose lookup chain came from the datastore
    verified_rows: int = 0  # medusa only: tree + lookup rows verified, summed over steps


@dataclass(frozen=True)
class MedusaSettings:
    tree: Tree | DynamicTree
    lookup_tokens: int
    datastore_tokens: int = DEFAULT_DATASTORE_TOKENS
    static_tree: Tree | None = None  # for "static_tree": the tree file's static paths
    draft: DraftModelProposer | None = None  # for "draft": the draft model (--draft-model)
    drafter: tuple[Proposer, ...] | None = None  # for "drafter": the lookups and the drafter (--drafter)


class CallCounter:
    """Counts forwards of a module while active (a forward pre-hook)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.calls, self.handle = module, 0, None

    def __enter__(self) -> CallCounter:
        self.handle = self.module.register_forward_pre_hook(self._count)
        return self

    def _count(self, module, args) -> None:
        self.calls += 1

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def run_hf(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, **extra) -> Result:
    with CallCounter(model.base_model) as counter:
        tokens, seconds = timed(lambda: plain_generate(model.base_model, input_ids, max_new_tokens, GREEDY, **extra))
    return Result(tokens.tolist(), seconds, counter.calls)


def run_plain(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return run_hf(model, input_ids, max_new_tokens)


def run_plain_kernel(
    model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings
) -> Result:
    with packed_from_rows(model.base_model, 1):
        return run_hf(model, input_ids, max_new_tokens)


def run_pld(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return run_hf(model, input_ids, max_new_tokens, prompt_lookup_num_tokens=PLD_NUM_TOKENS)


def run_medusa_with(
    model: MedusaModel,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    tree: Tree | DynamicTree,
    lookup_tokens: int,
    datastore_tokens: int,
) -> Result:
    return timed_generate(
        model, input_ids, max_new_tokens, tree=tree, lookup_tokens=lookup_tokens, datastore_tokens=datastore_tokens
    )


def timed_generate(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, **options) -> Result:
    """One timed :func:`generate` call with ``options`` and what its statistics say, as a :class:`Result`."""
    output, seconds = timed(lambda: generate(model, input_ids, max_new_tokens, **options))
    stats = output.stats
    return Result(
        output.sequences[0, input_ids.shape[1] :].tolist(),
        seconds,
        stats.target_calls,
        stats.steps,
        list(stats.accepted_at_depth),
        stats.lookup_steps,
        stats.datastore_steps,
        stats.verified_rows,
    )


def run_medusa(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return run_medusa_with(
        model, input_ids, max_new_tokens, settings.tree, settings.lookup_tokens, settings.datastore_tokens
    )


def run_static_tree(
    model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings
) -> Result:
    return run_medusa_with(
        model, input_ids, max_new_tokens, settings.static_tree, settings.lookup_tokens, settings.datastore_tokens
    )


def run_no_datastore(
    model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings
) -> Result:
    return run_medusa_with(model, input_ids, max_new_tokens, settings.tree, settings.lookup_tokens, datastore_tokens=0)


def run_heads(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return run_medusa_with(model, input_ids, max_new_tokens, settings.tree, lookup_tokens=0, datastore_tokens=0)


def run_drafter(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return timed_generate(model, input_ids, max_new_tokens, proposers=settings.drafter)


def run_draft(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return timed_generate(model, input_ids, max_new_tokens, proposers=[settings.draft])


def run_lookahead(
    model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings
) -> Result:
    """Lookahead decoding alone (:class:`medusa_lite.LookaheadProposer` with its defaults), no heads, no lookups."""
    return timed_generate(model, input_ids, max_new_tokens, proposers=[LookaheadProposer()])


RUNNERS: dict[str, Callable[..., Result]] = {
    "plain": run_plain,
    "plain_kernel": run_plain_kernel,
    "pld": run_pld,
    "medusa": run_medusa,
    "static_tree": run_static_tree,
    "no_datastore": run_no_datastore,
    "heads": run_heads,
    "drafter": run_drafter,
    "draft": run_draft,
    "lookahead": run_lookahead,
}


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length), None when identical."""
    for index, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def question_record(question: dict, order: Sequence[str], results: dict[str, Result]) -> dict:
    reference = results["plain"].tokens
    methods = {}
    for method, result in results.items():
        difference = first_difference(result.tokens, reference)
        methods[method] = {
            "new_tokens": len(result.tokens),
            "seconds": result.seconds,
            "target_calls": result.target_calls,
            "identical_to_plain": difference is None,
            "first_difference": difference,
            "steps": result.steps,
            "accepted_at_depth": result.accepted_at_depth,
            "lookup_steps": result.lookup_steps,
            "datastore_steps": result.datastore_steps,
            "verified_rows": result.verified_rows,
        }
    return {
        "question_id": question["question_id"],
        "category": question["category"],
        "order": list(order),
        "methods": methods,
    }


# -- summary -----------------------------------------------------------------------------------
def method_summary(records: Sequence[dict], method: str) -> dict:
    runs = [record["methods"][method] for record in records]
    plain_seconds = sum(record["methods"]["plain"]["seconds"] for record in records)
    kernel_seconds = sum(
        record["methods"]["plain_kernel"]["seconds"] for record in records if "plain_kernel" in record["methods"]
    )
    tokens, seconds, calls = (sum(run[key] for run in runs) for key in ("new_tokens", "seconds", "target_calls"))
    summary = {
        "questions": len(runs),
        "new_tokens": tokens,
        "seconds": seconds,
        "target_calls": calls,
        "mean_accepted_tokens": tokens / calls if calls else 0.0,
        # Spec-Bench's count: per decoding step, each question's prefill and the token it yields left out
        "mean_tokens_per_step": (tokens - len(runs)) / (calls - len(runs)) if calls > len(runs) else 0.0,
        "tokens_per_second": tokens / seconds if seconds else 0.0,
        "speedup": plain_seconds / seconds if seconds else 0.0,
        "identical_fraction": sum(run["identical_to_plain"] for run in runs) / len(runs) if runs else 0.0,
    }
    if kernel_seconds:
        summary["speedup_vs_plain_kernel"] = kernel_seconds / seconds if seconds else 0.0
    speedups = question_speedups(records, method)
    if speedups:
        slowest = min(speedups, key=speedups.get)
        summary["min_question_speedup"], summary["slowest_question"] = speedups[slowest], slowest
    steps = sum(run["steps"] for run in runs)
    if steps:
        summary["steps"] = steps
        summary["lookup_step_fraction"] = sum(run.get("lookup_steps", 0) for run in runs) / steps
        summary["datastore_step_fraction"] = sum(run.get("datastore_steps", 0) for run in runs) / steps
        summary["mean_verified_rows"] = sum(run.get("verified_rows", 0) for run in runs) / steps
        depth = max(len(run["accepted_at_depth"]) for run in runs)
        accepted = [
            sum(run["accepted_at_depth"][d] for run in runs if d < len(run["accepted_at_depth"])) for d in range(depth)
        ]
        summary["acceptance_rate_by_depth"] = [count / steps for count in accepted]
    return summary


def question_speedups(records: Sequence[dict], method: str) -> dict:
    """{question id: plain's seconds / the method's seconds} for each question."""
    return {
        record["question_id"]: record["methods"]["plain"]["seconds"] / record["methods"][method]["seconds"]
        for record in records
        if record["methods"][method]["seconds"] > 0
    }


def methods_in(records: Sequence[dict]) -> list[str]:
    """The methods the records hold, in ``METHODS`` order."""
    present = set(records[0]["methods"]) if records else set()
    return [method for method in METHODS if method in present]


def summarize(records: Sequence[dict]) -> dict[str, dict[str, dict]]:
    """{category or "overall": {method: summary}}."""
    groups = {category: [r for r in records if r["category"] == category] for category in categories_in_order(records)}
    groups[OVERALL] = list(records)
    return {
        name: {method: method_summary(group, method) for method in methods_in(records)}
        for name, group in groups.items()
    }


def markdown_table(summary: dict[str, dict[str, dict]]) -> str:
    compared = [method for method in next(iter(summary.values())) if method != "plain"]
    header = (
        "| category | n | plain tok/s | "
        + " | ".join(
            f"{SHORT[m]} acc. | {SHORT[m]} tok/s | {SHORT[m]} speed-up | {SHORT[m]} identical" for m in compared
        )
        + " |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for name, methods in summary.items():
        plain = methods["plain"]
        label = f"**{name}**" if name == OVERALL else name
        cells = [
            f"{r['mean_accepted_tokens']:.2f} | {r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | "
            f"{r['identical_fraction']:.0%}"
            for r in (methods[m] for m in compared)
        ]
        lines.append(
            f"| {label} | {plain['questions']} | {plain['tokens_per_second']:.1f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def per_step_line(summary: dict[str, dict[str, dict]]) -> str:
    """Overall tokens per decoding step as Spec-Bench counts them (the published numbers' unit)."""
    overall = summary[OVERALL]
    values = ", ".join(f"{SHORT[m]} {r['mean_tokens_per_step']:.2f}" for m, r in overall.items() if m != "plain")
    return (
        f"Overall tokens per decoding step as Spec-Bench counts them (each prefill and its token left out): {values}."
    )


def kernel_line(summary: dict[str, dict[str, dict]]) -> str:
    """Overall speed-ups over plain decoding through the packed path (empty without ``plain_kernel``)."""
    overall = summary[OVERALL]
    if "plain_kernel" not in overall:
        return ""
    values = ", ".join(
        f"{SHORT[m]} {r['speedup_vs_plain_kernel']:.2f}x"
        for m, r in overall.items()
        if m not in ("plain", "plain_kernel")
    )
    return (
        f"Overall speed-up over plain generate with its one-token steps through the packed path "
        f"(machine.prepack_backend in results.json) "
        f"({overall['plain_kernel']['speedup']:.2f}x plain's speed by itself): {values}."
    )


def slowest_line(summary: dict[str, dict[str, dict]]) -> str:
    """Each method's speed-up over plain on its slowest question (the per-question minimum)."""
    overall = summary[OVERALL]
    values = ", ".join(
        f"{SHORT[m]} {r['min_question_speedup']:.2f}x (question {r['slowest_question']})"
        for m, r in overall.items()
        if m != "plain" and "min_question_speedup" in r
    )
    return f"Slowest question's speed-up over plain: {values}." if values else ""


def plot_speedup(summary: dict[str, dict[str, dict]], path: Path) -> None:
    names = list(summary)
    positions = range(len(names))
    from matplotlib.figure import Figure  # the object API: no pyplot, no GUI backend

    figure = Figure(figsize=(max(6, 0.7 * len(names) + 2), 4))
    axes = figure.subplots()
    compared = [method for method in summary[names[0]] if method != "plain"]
    width = 0.8 / len(compared)
    for index, method in enumerate(compared):
        offset = (index - (len(compared) - 1) / 2) * width
        bars = axes.bar(
            [p + offset for p in positions],
            [summary[n][method]["speedup"] for n in names],
            width,
            label=LABELS[method],
        )
        axes.bar_label(bars, fmt="%.2f", fontsize=7)
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    axes.set_xticks(list(positions), names, rotation=45, ha="right")
    axes.set_ylabel("speed-up vs plain generate")
    axes.set_title("Spec-Bench speed-up by category")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def plot_acceptance(summary: dict[str, dict[str, dict]], path: Path) -> None:
    method = (
        next(m for m in ("medusa", "heads") if m in summary[OVERALL])
        if {"medusa", "heads"} & set(summary[OVERALL])
        else None
    )
    rates = summary[OVERALL][method].get("acceptance_rate_by_depth", []) if method else []
    from matplotlib.figure import Figure  # the object API: no pyplot, no GUI backend

    figure = Figure(figsize=(5, 3.5))
    axes = figure.subplots()
    depths = [d + 1 for d in range(len(rates))]
    axes.bar_label(axes.bar(depths, rates), fmt="%.2f")
    axes.set_xticks(depths)
    axes.set_xlabel("tree depth (head)")
    axes.set_ylabel("fraction of steps accepting a guess")
    axes.set_ylim(0, 1)
    axes.set_title(f"{LABELS[method] if method else 'medusa-lite'}: acceptance by depth")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


# -- the command -------------------------------------------------------------------------------
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


def run_benchmark(
    model: MedusaModel,
    tokenizer,
    questions: Sequence[dict],
    max_new_tokens: int,
    methods: Sequence[str] = DEFAULT_METHODS,
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS,
    datastore_tokens: int = DEFAULT_DATASTORE_TOKENS,
    on_record: Callable[[dict], None] | None = None,
    static_tree: Tree | None = None,
    draft: DraftModelProposer | None = None,
    drafter: Sequence[Proposer] | None = None,
) -> list[dict]:
    """One record per question (see :func:`question_record`); ``on_record`` gets each as soon as it is measured.

    ``static_tree``: the tree of the ``static_tree`` method (required for it).
    """
    kernel_runs = prepack_backend(model.base_model) is not None
    methods = [
        method
        for method in METHODS
        if method in set(methods) | {"plain"} | ({"plain_kernel"} if kernel_runs else set())
    ]
    if "plain_kernel" in methods and not kernel_runs:
        raise MedusaError(
            "the 'plain_kernel' method needs the model's weights packed (float32 on CPU, without --no-prepack)"
        )
    if "static_tree" in methods and static_tree is None:
        raise MedusaError(
            "the 'static_tree' method needs a tree file with static paths (--tree, or tree.json beside the heads)"
        )
    if "draft" in methods and draft is None:
        raise MedusaError(
            "the 'draft' method needs a draft model: --draft-model PATH (an HF causal LM with the target's tokenizer)"
        )
    if "drafter" in methods and drafter is None:
        raise MedusaError("the 'drafter' method needs a sequential drafter: --drafter PATH (a folder or Hub repo)")
    settings = MedusaSettings(
        tree_of(model), lookup_tokens, datastore_tokens, static_tree, draft, tuple(drafter) if drafter else None
    )
    prompts = [chat_input_ids(tokenizer, question["turns"][0]).to(model.device) for question in questions]
    for method in methods:  # warm-up
        RUNNERS[method](model, prompts[0], WARMUP_TOKENS, settings)
    records = []
    for index, (question, input_ids) in enumerate(tqdm(list(zip(questions, prompts)), desc="Spec-Bench")):
        order = rotated(methods, index)
        results = {method: RUNNERS[method](model, input_ids, max_new_tokens, settings) for method in order}
        records.append(question_record(question, order, results))
        if on_record is not None:
            on_record(records[-1])
    return records


def progress_writer(path: Path) -> Callable[[dict], None]:
    """Append each finished question's record to ``path`` (JSON lines), so a crash loses no measured question."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")

    def write(record: dict) -> None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    return write


def write_outputs(out: Path, summary: dict, records: Sequence[dict], settings: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps({**settings, "summary": summary, "questions": list(records)}, indent=1) + "\n", encoding="utf-8"
    )
    machine = settings["machine"]
    heading = (
        f"Spec-Bench, {settings['num_questions']} questions, greedy, max {settings['max_new_tokens']} new tokens; "
        f"{machine['cpu']}, {machine['torch_threads']} threads, {machine['dtype']}; "
        f"{'dynamic tree of up to' if settings.get('dynamic_tree') else 'tree of'} {settings['tree_nodes']} "
        "nodes; "
        f"torch {machine['torch']}, transformers {machine['transformers']}; {machine['date']}.\n"
        "acc. = mean accepted tokens per target call (bonus and prefill counted; plain = 1.00); "
        "speed-up = plain's total time / the method's; identical = outputs token-identical to plain greedy.\n\n"
    )
    lines = [per_step_line(summary), kernel_line(summary), slowest_line(summary)]
    (out / "results.md").write_text(
        heading + markdown_table(summary) + "\n\n" + "\n\n".join(line for line in lines if line) + "\n",
        encoding="utf-8",
    )
    plot_speedup(summary, out / "speedup_by_category.png")
    plot_acceptance(summary, out / "acceptance_by_depth.png")


def drafter_proposers(model: MedusaModel, args: argparse.Namespace) -> tuple[Proposer, ...]:
    """The 'drafter' method's proposers on the benchmark's target: the default lookups (the model's datastore),
    then the ``--drafter`` (a sequential drafter or Hydra-style heads), priced on this machine; the target re-packed
    for the wider of its two drafts."""
    drafter = read_artifact(resolve_source(args.drafter, "drafter"))
    if type(drafter) not in DRAFTING_KINDS:
        raise MedusaError(
            f"--drafter {args.drafter} holds Medusa heads: pass a sequential drafter or Hydra-style heads "
            "(the 'medusa' method decodes with heads, --heads)"
        )
    budget = DynamicTree(1 + DEFAULT_DRAFTER_NODES, UNMEASURED_ROW_COSTS)
    lookups = default_lookups(args.lookup_tokens, True, args.datastore_tokens)
    spec = DRAFTING_KINDS[type(drafter)].proposer(drafter, max_new_nodes=DEFAULT_DRAFTER_NODES)
    rows = step_rows((lookups, spec), model)
    prepack_for_tree(model.base_model, Tree(()), prepack_choice(args), max(rows, step_rows(model.proposers, model)))
    return lookups, drafter_proposer_for(model, drafter, budget)


def static_tree_for(args: argparse.Namespace, model: MedusaModel) -> Tree | None:
    """The static paths of the tree file ``--tree`` names, else of ``tree.json`` beside the heads, else the model's own
    static tree.
    """
    path = args.tree or find_tree_file(heads_source_for(args.model, args.heads))
    if path is not None:
        return read_tree_file(path, dynamic=False)
    return model.tree if isinstance(model.tree, Tree) else None


def tree_settings(tree: Tree | DynamicTree) -> dict:
    """How ``results.json`` records the tree medusa decoded with."""
    if isinstance(tree, DynamicTree):
        return {"tree_nodes": tree.num_nodes, "tree": None, "dynamic_tree": tree.as_dict()}
    return {"tree_nodes": tree.num_nodes, "tree": [list(path) for path in tree.paths], "dynamic_tree": None}


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
        drafter=drafter_proposers(model, args) if "drafter" in args.methods and args.drafter else None,
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
