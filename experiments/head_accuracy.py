"""Per-head top-1/top-5 accuracy of several heads on the same greedy continuations (evaluation only).

    python experiments/head_accuracy.py --heads A B ... [--questions Q.jsonl] [--n 24] [--tokens 48]

For each prompt the target's greedy continuation is computed once and every heads set is scored
on it with ``head_hits`` (a head's ranked guesses against the tokens the target
chose). Spec-Bench questions are used here to *measure* how well heads transfer to the benchmark,
never to train heads or to choose a tree.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from common import GREEDY, SPEC_BENCH_QUESTIONS, head_hits, read_questions, stratified_subset
from medusa_lite.artifacts.loading import load_target
from medusa_lite.bench.measure import chat_input_ids, plain_generate
from medusa_lite.commands.options import set_threads
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.drafters.medusa.heads import MedusaHeads

TOP_RANKS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", nargs="+", required=True)
    parser.add_argument("--questions", default=str(SPEC_BENCH_QUESTIONS))
    parser.add_argument("--n", type=int, default=24, help="questions, stratified across categories")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    set_threads(args.threads)
    base, tokenizer = load_target(None, torch.float32, "cpu")
    models = {path: MedusaModel(base, MedusaHeads.from_pretrained(path)).eval() for path in args.heads}
    num_heads = min(model.num_heads for model in models.values())
    hits = {path: torch.zeros(num_heads, TOP_RANKS) for path in models}
    counts = torch.zeros(num_heads)
    for question in stratified_subset(read_questions(args.questions), args.n):
        input_ids = chat_input_ids(tokenizer, question["turns"][0])
        with torch.inference_mode():
            new_tokens = plain_generate(base, input_ids, args.tokens, GREEDY)
        sequence = torch.cat([input_ids[0], new_tokens])
        for path, model in models.items():
            prompt_hits, prompt_counts = head_hits(model, sequence, input_ids.shape[1] - 1, TOP_RANKS)
            hits[path] += prompt_hits[:num_heads]
        counts += prompt_counts[:num_heads]
    report = {}
    for path in models:
        rank_accuracy = hits[path] / counts.clamp(min=1)[:, None]
        report[path] = {
            "top1": [round(v, 3) for v in rank_accuracy[:, 0].tolist()],
            "top5": [round(v, 3) for v in rank_accuracy.sum(dim=1).tolist()],
        }
        print(path, report[path])
    result = {
        "questions": args.questions,
        "n": args.n,
        "tokens": args.tokens,
        "positions_per_head": counts.tolist(),
        "heads": report,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
