"""Acceptance ceiling: the full Spec-Bench set with a GPU-sized dynamic tree (64 nodes), no timing.

    python experiments/spec_bench_dynamic64.py      # ~30 min on the 2-core CPU

Every step keeps the 63 likeliest paths by the heads' confidence (a ``DynamicTree`` of 64 nodes
priced with flat row costs: on a GPU, verifying 64 rows costs about what one does), plus the
default prompt-lookup / datastore chains, on every question's first turn (chat template, greedy,
48 new tokens, float32), as ``infer/benchmark.py`` runs medusa-lite. Greedy acceptance does not
depend on timing, so only tokens and target calls are recorded (``results.json``); on this CPU
such steps are slower than plain decoding (the static 64-node run: 0.80x).
"""

from __future__ import annotations

import json

from tqdm import tqdm

from common import BENCHMARKS, categories_in_order, read_questions
from medusa_lite import DynamicTree, generate, load
from medusa_lite.bench.measure import chat_input_ids, machine_info
from medusa_lite.commands.options import set_threads

MAX_NODES = 64
FLAT_COSTS = (1.0,) * (MAX_NODES + 16)  # rows are free: keep every path up to MAX_NODES
MAX_NEW_TOKENS = 48
OUT = BENCHMARKS / "spec_bench_full_fp32_dynamic64" / "results.json"


def per_step(records: list[dict]) -> float:
    """Spec-Bench's count: tokens per decoding step, each prefill and its token left out."""
    return sum(r["new_tokens"] - 1 for r in records) / sum(r["target_calls"] - 1 for r in records)


def acceptance_records(model, tokenizer, max_new_tokens: int) -> list[dict]:
    """Every Spec-Bench question's first turn decoded greedily: its ``GenerationStats`` as a dict."""
    records = []
    for question in tqdm(read_questions(), desc="Spec-Bench"):
        stats = generate(model, chat_input_ids(tokenizer, question["turns"][0]), max_new_tokens).stats
        records.append({"question_id": question["question_id"], "category": question["category"], **stats.as_dict()})
    return records


def acceptance_summary(records: list[dict]) -> dict:
    return {
        "tokens_per_step": per_step(records),
        "tokens_per_target_call": sum(r["new_tokens"] for r in records) / sum(r["target_calls"] for r in records),
        "mean_verified_rows": sum(r["verified_rows"] for r in records) / sum(r["steps"] for r in records),
        "tokens_per_step_by_category": {
            c: per_step([r for r in records if r["category"] == c]) for c in categories_in_order(records)
        },
    }


def main() -> None:
    set_threads(2)
    model, tokenizer = load(tree=DynamicTree(MAX_NODES, FLAT_COSTS))
    records = acceptance_records(model, tokenizer, MAX_NEW_TOKENS)
    summary = acceptance_summary(records)
    machine = machine_info(model.base_model.dtype, model.base_model)
    OUT.write_text(
        json.dumps(
            {
                "max_nodes": MAX_NODES,
                "max_new_tokens": MAX_NEW_TOKENS,
                "machine": machine,
                "summary": summary,
                "questions": records,
            },
            indent=1,
        )
        + "\n"
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
