"""What a batch does to speculation: tokens/s at B = 1, 2, 4, 8, 16 against ``model.generate`` with the same batch.

One process, the default model with its shipped heads (``load()``, float32 on this CPU), the same Spec-Bench
questions (stratified) at every batch size, cut into left-padded batches of B; greedy; per batch three ways run
back to back (interleaved):
- ``plain``: ``base.generate`` on the batch with the target's linears packed for the batch's rows (the fastest
  plain decoding here: B rows take the packed few-row path, as in medusa-lite's batch loop);
- ``plain_as_loaded``: ``base.generate`` on the target as ``load()`` leaves it (packed for one sequence's tree,
  PyTorch's path past that many rows);
- ``medusa``: ``medusa_lite.generate`` on the same batch.
The speed-up is over ``plain``. Each batch also times ``plain`` and ``medusa`` making one token (the prefill and
the first token) right before their full runs; what the full run takes beyond that is its decoding, reported apart
(``decode_speedup``: tokens after the first per second of decoding), as a long batched prompt's prefill can
outweigh the decoding that speculation speeds up. Each batch size's step costs are measured (or read from the
cache) before it is timed. Writes tokens/s (new tokens, padding not counted), the speed-up, whether the sequences
are identical, and the tree medusa-lite chose at each B (rows verified per row and step, tokens per row and step).

    PYTHONPATH=. python experiments/batch_speed.py --questions 16 --out benchmarks/batch_speed
"""

import argparse
import json
import time
from pathlib import Path

import torch

from medusa_lite import generate, load
from medusa_lite.bench.measure import chat_input_ids, left_padded, machine_info
from medusa_lite.bench.questions import DEFAULT_QUESTIONS, read_questions, stratified_subset
from medusa_lite.cpu.prepack import packed_up_to_rows, prepacked_rows

BATCH_SIZES = (1, 2, 4, 8, 16)
WAYS = ("plain_as_loaded", "plain", "medusa")


def new_tokens(sequences: torch.Tensor, width: int, eos: set[int]) -> int:
    """New tokens of every row: up to and with its first EOS, else all of them (no padding after it)."""
    total = 0
    for row in sequences[:, width:].tolist():
        ends = [i for i, token in enumerate(row) if token in eos]
        total += ends[0] + 1 if ends else len(row)
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_setting = model.base_model.generation_config.eos_token_id
    eos = set([eos_setting] if isinstance(eos_setting, int) else eos_setting or [])
    questions = stratified_subset(read_questions(DEFAULT_QUESTIONS), args.questions)
    prompts = [chat_input_ids(tokenizer, question["turns"][0])[0] for question in questions]
    table = []
    for size in args.batch_sizes:
        seconds, tokens = dict.fromkeys(WAYS, 0.0), dict.fromkeys(WAYS, 0)
        first_token_seconds = dict.fromkeys(("plain", "medusa"), 0.0)
        identical, rows_verified, row_steps, row_tokens = 0, 0, 0, 0
        warm_ids, warm_mask = left_padded(prompts[:size], pad)
        generate(model, warm_ids, 2, attention_mask=warm_mask, pad_token_id=pad)  # this B's costs, untimed
        for start in range(0, len(prompts), size):
            ids, mask = left_padded(prompts[start : start + size], pad)
            settings = dict(attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)
            began = time.perf_counter()
            as_loaded = model.base_model.generate(ids, **settings)
            seconds["plain_as_loaded"] += time.perf_counter() - began
            with packed_up_to_rows(model.base_model, size * (prepacked_rows(model.base_model) or 0)):
                began = time.perf_counter()
                model.base_model.generate(ids, **{**settings, "max_new_tokens": 1})
                first_token_seconds["plain"] += time.perf_counter() - began
                began = time.perf_counter()
                plain = model.base_model.generate(ids, **settings)
                seconds["plain"] += time.perf_counter() - began
            began = time.perf_counter()
            generate(model, ids, 1, attention_mask=mask, pad_token_id=pad)
            first_token_seconds["medusa"] += time.perf_counter() - began
            began = time.perf_counter()
            out = generate(model, ids, args.max_new_tokens, attention_mask=mask, pad_token_id=pad)
            seconds["medusa"] += time.perf_counter() - began
            tokens["plain_as_loaded"] += new_tokens(as_loaded, ids.shape[1], eos)
            tokens["plain"] += new_tokens(plain, ids.shape[1], eos)
            tokens["medusa"] += out.stats.new_tokens
            identical += torch.equal(plain, out.sequences) and torch.equal(as_loaded, out.sequences)
            rows_verified += out.stats.verified_rows
            row_steps += out.stats.steps
            row_tokens += sum(out.stats.tokens_per_step)
        rate = {name: tokens[name] / seconds[name] for name in seconds}
        decode_rate = {
            name: (tokens[name] - len(prompts)) / (seconds[name] - first_token_seconds[name])
            for name in first_token_seconds
        }
        table.append(
            {
                "batch_size": size,
                "tokens_per_second": rate,
                "speedup": rate["medusa"] / rate["plain"],
                "first_token_seconds": first_token_seconds,
                "decode_tokens_per_second": decode_rate,
                "decode_speedup": decode_rate["medusa"] / decode_rate["plain"],
                "identical_batches": f"{identical}/{-(-len(prompts) // size)}",
                "rows_verified_per_row_step": rows_verified / row_steps,
                "tokens_per_row_step": row_tokens / row_steps,
            }
        )
        print(json.dumps(table[-1]), flush=True)
    results = {
        "machine": machine_info(torch.float32, model.base_model),
        "questions": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "table": table,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
