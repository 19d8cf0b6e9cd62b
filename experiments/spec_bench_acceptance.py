"""Tokens per decoding step on Spec-Bench for one artifact (heads or a sequential drafter), greedy, untimed,
every output checked against the target's own greedy choice.

    python experiments/spec_bench_acceptance.py --heads runs/smollm2-drafter/heads --full \
        --out benchmarks/drafter_spec_bench_full

Acceptance is deterministic in greedy decoding, so this run needs no quiet machine and no plain
baseline timed beside it. Identity with plain greedy is checked without decoding plainly: one
forward over prompt + output (teacher forcing) gives the target's argmax at every generated
position, and each generated token must be it. Where that check disagrees (a float near-tie can
round differently in one long forward than in step-by-step decoding), the question is decoded
plainly with ``model.generate`` and compared token by token: the verdict recorded is that
comparison's. Every finished question is appended to ``<out>/progress.jsonl`` and a rerun skips
them, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from common import SPEC_BENCH_QUESTIONS, categories_in_order, read_questions, stratified_subset
from medusa_lite import generate, load
from medusa_lite.bench.measure import chat_input_ids, machine_info, plain_generate
from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.drafters.hydra.proposer import HydraProposer
from medusa_lite.drafters.sequential.proposer import SequentialDrafterProposer


def teacher_forced_greedy(model, input_ids: torch.Tensor, new_tokens: list[int]) -> bool:
    """Whether every new token is the target's argmax after the tokens before it (one forward over all of them)."""
    if not new_tokens:
        return True
    sequence = torch.cat([input_ids[0], torch.tensor(new_tokens, device=input_ids.device)])[None]
    with torch.inference_mode():
        logits = model.base_model(sequence).logits[0, input_ids.shape[1] - 1 : -1]
    return logits.argmax(dim=-1).tolist() == new_tokens


def question_record(model, tokenizer, question: dict, max_new_tokens: int) -> dict:
    input_ids = chat_input_ids(tokenizer, question["turns"][0]).to(model.device)
    output = generate(model, input_ids, max_new_tokens, eos_token_id=tokenizer.eos_token_id)
    new = output.sequences[0, input_ids.shape[1] :].tolist()
    stats = output.stats
    checked_by = "teacher_forced"
    identical = teacher_forced_greedy(model, input_ids, new)
    if not identical:
        plain = plain_generate(model.base_model, input_ids, max_new_tokens, SamplingSettings()).tolist()
        identical, checked_by = plain == new, "plain_generate"
    return {
        "question_id": question["question_id"],
        "category": question["category"],
        "new_tokens": stats.new_tokens,
        "tokens": new,
        "steps": stats.steps,
        "tokens_per_step": list(stats.tokens_per_step),
        "plain_steps": stats.plain_steps,
        "verified_rows": stats.verified_rows,
        "accepted_by_source": dict(stats.accepted_by_source),
        "identical_to_plain": identical,
        "checked_by": checked_by,
    }


def spec_bench_tokens_per_step(records: list[dict]) -> float:
    """Spec-Bench's count: tokens per decoding step, each question's prefill and its token left out."""
    tokens = sum(r["new_tokens"] - 1 for r in records)
    steps = sum(r["steps"] for r in records)
    return tokens / steps if steps else 0.0


def tokens_per_speculative_step(records: list[dict]) -> float:
    """The same over the steps that verified guesses: the gate's plain steps (one token each) left out."""
    tokens = sum(sum(r["tokens_per_step"]) - r["plain_steps"] for r in records)
    steps = sum(r["steps"] - r["plain_steps"] for r in records)
    return tokens / steps if steps else 0.0


def summary_of(records: list[dict]) -> dict:
    by_category = defaultdict(list)
    for record in records:
        by_category[record["category"]].append(record)
    sources = defaultdict(int)
    for record in records:
        for source, count in record["accepted_by_source"].items():
            sources[source] += count
    steps = sum(r["steps"] for r in records)
    return {
        "questions": len(records),
        "tokens_per_step": spec_bench_tokens_per_step(records),
        "tokens_per_speculative_step": tokens_per_speculative_step(records),
        "identical": sum(r["identical_to_plain"] for r in records),
        "plain_steps": sum(r["plain_steps"] for r in records),
        "verified_rows_per_step": sum(r["verified_rows"] for r in records) / steps if steps else 0.0,
        "accepted_per_step_by_source": {s: c / steps for s, c in sorted(sources.items())} if steps else {},
        "by_category": {
            category: {
                "n": len(rows),
                "tokens_per_step": spec_bench_tokens_per_step(rows),
                "tokens_per_speculative_step": tokens_per_speculative_step(rows),
            }
            for category, rows in by_category.items()
        },
    }


def with_drafter_settings(proposer, args: argparse.Namespace):
    """``proposer`` with the --drafter-* settings given, if it is a drafter (an unpriced fixed budget with
    --drafter-nodes)."""
    if not isinstance(proposer, (SequentialDrafterProposer, HydraProposer)):
        return proposer
    changes = {"depth": args.drafter_depth, "topk": args.drafter_topk}
    if args.drafter_nodes is not None:
        changes.update(max_new_nodes=args.drafter_nodes, costs=None)
    return replace(proposer, **{name: value for name, value in changes.items() if value is not None})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", default=None, help="heads or drafter folder (default: what load() ships)")
    parser.add_argument("--questions", default=str(SPEC_BENCH_QUESTIONS))
    subset = parser.add_mutually_exclusive_group()
    subset.add_argument("--quick", type=int, default=26)
    subset.add_argument("--full", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    ceiling = parser.add_argument_group(
        "drafter settings (default: as load() gives them); with --drafter-nodes every step verifies that many "
        "drafter nodes, unpriced: the acceptance a bigger tree buys, not a shipping setting"
    )
    ceiling.add_argument("--drafter-depth", type=int, default=None)
    ceiling.add_argument("--drafter-topk", type=int, default=None)
    ceiling.add_argument("--drafter-nodes", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = out / "progress.jsonl"
    done = [json.loads(line) for line in progress.read_text().splitlines()] if progress.exists() else []
    finished = {record["question_id"] for record in done}
    model, tokenizer = load(heads=args.heads, dtype=torch.float32)
    model.proposers = tuple(with_drafter_settings(p, args) for p in model.proposers)
    questions = read_questions(args.questions)
    questions = questions if args.full else stratified_subset(questions, args.quick)
    started = time.perf_counter()
    for index, question in enumerate(questions):
        if question["question_id"] in finished:
            continue
        record = question_record(model, tokenizer, question, args.max_new_tokens)
        done.append(record)
        with open(progress, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if index % 20 == 0:
            print(f"{index + 1}/{len(questions)}: {spec_bench_tokens_per_step(done):.3f} tokens/step", flush=True)
    order = {q["question_id"]: i for i, q in enumerate(questions)}
    records = sorted((r for r in done if r["question_id"] in order), key=lambda r: order[r["question_id"]])
    summary = summary_of(records)
    settings = {
        "heads": args.heads or "shipped default",
        "drafter_settings": {"depth": args.drafter_depth, "topk": args.drafter_topk, "nodes": args.drafter_nodes},
        "max_new_tokens": args.max_new_tokens,
        "machine": machine_info(torch.float32, model.base_model),
        "seconds_this_run": time.perf_counter() - started,
    }
    (out / "results.json").write_text(json.dumps({**settings, "summary": summary, "questions": records}, indent=1))
    lines = [
        f"# Spec-Bench tokens per decoding step, {summary['questions']} questions, greedy, "
        f"max {args.max_new_tokens} new tokens ({settings['heads']})",
        "",
        f"- tokens per decoding step (Spec-Bench count): **{summary['tokens_per_step']:.2f}**",
        f"- the same over speculative steps only (the speculation gate's plain steps left out): "
        f"{summary['tokens_per_speculative_step']:.2f}",
        f"- identical to the target's greedy output: {summary['identical']}/{summary['questions']}",
        f"- verified rows per step: {summary['verified_rows_per_step']:.2f}; plain (gated) steps: "
        f"{summary['plain_steps']}",
        "- accepted guesses per step by source: "
        + ", ".join(f"{s} {v:.2f}" for s, v in summary["accepted_per_step_by_source"].items()),
        "",
        "| category | n | tokens/step | tokens/speculative step |",
        "|---|---|---|---|",
    ]
    for category in categories_in_order(questions):
        if category in summary["by_category"]:
            row = summary["by_category"][category]
            per_step, speculative = row["tokens_per_step"], row["tokens_per_speculative_step"]
            lines.append(f"| {category} | {row['n']} | {per_step:.2f} | {speculative:.2f} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
