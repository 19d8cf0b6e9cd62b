"""A batch's step width, two rules side by side in one process: the upper median of the rows' sizes with every row
asked (the rule before ``decoding.batch_width``) against the width by expected tokens per cost (the rule now).

The default model with its shipped heads (``load()``, float32 on this CPU), the same stratified Spec-Bench questions
cut into left-padded batches of B, greedy; per batch, back to back: ``base.generate`` with the packed path serving
the batch (``plain``), then each rule, each timed for its first token and for the whole run, so decoding (the whole
run less its first token) is reported apart from the prefill. ``--repeats`` runs the batches that many times, the
order of the ways turned around every other time. The earlier rule is had by handing ``within_shared_width`` no
cost and asking every row, what the batch loop did before.

    PYTHONPATH=. python experiments/batch_width_ab.py --batch-sizes 4 8 --out benchmarks/batch_speed/width_ab.json
"""

import argparse
import json
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

import medusa_lite.decoding.batch as batch
from medusa_lite import generate, load
from medusa_lite.bench.measure import chat_input_ids, left_padded, machine_info
from medusa_lite.bench.questions import DEFAULT_QUESTIONS, read_questions, stratified_subset
from medusa_lite.cpu.prepack import packed_up_to_rows, prepacked_rows

RULES = ("median", "expected")


@contextmanager
def earlier_rule():
    """The batch loop as it was before the width by expected tokens: every row asked, cut to the upper median."""
    within, may_pay = batch.within_shared_width, batch.speculation_may_pay
    batch.within_shared_width = lambda steps, rates=None, cost=None: within(steps)
    batch.speculation_may_pay = lambda *args: True
    try:
        yield
    finally:
        batch.within_shared_width, batch.speculation_may_pay = within, may_pay


def timed(function, *args, **kwargs) -> tuple[float, object]:
    began = time.perf_counter()
    out = function(*args, **kwargs)
    return time.perf_counter() - began, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    questions = stratified_subset(read_questions(DEFAULT_QUESTIONS), args.questions)
    prompts = [chat_input_ids(tokenizer, question["turns"][0])[0] for question in questions]
    table = []
    for size in args.batch_sizes:
        ways = ("plain", *RULES)
        decode_seconds, decode_tokens = dict.fromkeys(ways, 0.0), dict.fromkeys(ways, 0)
        identical, rows, tokens = dict.fromkeys(RULES, 0), dict.fromkeys(RULES, 0), dict.fromkeys(RULES, 0)
        steps = dict.fromkeys(RULES, 0)
        warm_ids, warm_mask = left_padded(prompts[:size], pad)
        generate(model, warm_ids, 2, attention_mask=warm_mask, pad_token_id=pad)  # this B's costs, untimed
        for repeat in range(args.repeats):
            for start in range(0, len(prompts), size):
                ids, mask = left_padded(prompts[start : start + size], pad)
                settings = dict(attention_mask=mask, do_sample=False, pad_token_id=pad)
                with packed_up_to_rows(model.base_model, size * (prepacked_rows(model.base_model) or 0)):
                    first, _ = timed(model.base_model.generate, ids, max_new_tokens=1, **settings)
                    whole, plain = timed(
                        model.base_model.generate, ids, max_new_tokens=args.max_new_tokens, **settings
                    )
                decode_seconds["plain"] += whole - first
                decode_tokens["plain"] += (plain.shape[1] - ids.shape[1] - 1) * size
                for rule in RULES if repeat % 2 == 0 else RULES[::-1]:
                    with earlier_rule() if rule == "median" else nullcontext():
                        first, _ = timed(generate, model, ids, 1, attention_mask=mask, pad_token_id=pad)
                        whole, out = timed(
                            generate, model, ids, args.max_new_tokens, attention_mask=mask, pad_token_id=pad
                        )
                    decode_seconds[rule] += whole - first
                    decode_tokens[rule] += (out.sequences.shape[1] - ids.shape[1] - 1) * size
                    identical[rule] += torch.equal(plain, out.sequences)
                    rows[rule] += out.stats.verified_rows
                    steps[rule] += out.stats.steps
                    tokens[rule] += sum(out.stats.tokens_per_step)
        rate = {way: decode_tokens[way] / decode_seconds[way] for way in ways}
        table.append(
            {
                "batch_size": size,
                "decode_tokens_per_second": rate,
                "decode_speedup": {rule: rate[rule] / rate["plain"] for rule in RULES},
                "identical_batches": {
                    rule: f"{identical[rule]}/{args.repeats * -(-len(prompts) // size)}" for rule in RULES
                },
                "rows_verified_per_row_step": {rule: rows[rule] / steps[rule] for rule in RULES},
                "tokens_per_row_step": {rule: tokens[rule] / steps[rule] for rule in RULES},
            }
        )
        print(json.dumps(table[-1]), flush=True)
    results = {
        "machine": machine_info(torch.float32, model.base_model),
        "questions": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
