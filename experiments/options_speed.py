"""Does applying ``model.generate``'s options cost anything when none is given, and what does one cost when given?

One process, the default model with its shipped heads (``load()``, float32 on this CPU),
Spec-Bench questions (stratified), greedy, the ways interleaved per question:

- ``plain``: ``base.generate`` (the baseline every ratio is taken against, in the same run);
- ``medusa``: ``medusa_lite.generate`` without options;
- ``plain+rp`` / ``medusa+rp``: both with ``repetition_penalty`` (medusa-lite applies it to each
  draft node with its own prefix), checked token-identical to each other.

``--ways plain,medusa`` runs only the ways an older checkout has (no options), so the script can
be run against the code before options landed (``PYTHONPATH=<that checkout>``) and the
medusa/plain ratios compared. Writes tokens/s, steps, seconds per verification step, identity.

    PYTHONPATH=. python experiments/options_speed.py --questions 26 --out benchmarks/options_speed/after
"""

import argparse
import json
import time
from pathlib import Path

import torch

from medusa_lite import generate, load
from medusa_lite.bench.measure import chat_input_ids, machine_info
from medusa_lite.bench.questions import DEFAULT_QUESTIONS, read_questions, stratified_subset

REPETITION_PENALTY = 1.2  # a common setting; strong enough to change greedy answers
WAYS = ("plain", "medusa", "plain+rp", "medusa+rp")


def ways_for(model, max_new_tokens: int) -> dict:
    """Each way: (ids, mask) -> (sequences, verification steps or None)."""

    def plain(ids, mask, **options):
        out = model.base_model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, **options
        )
        return out, None

    def medusa(ids, mask, **options):
        out = generate(model, ids, max_new_tokens, **options)
        return out.sequences, out.stats.steps

    return {
        "plain": plain,
        "medusa": medusa,
        "plain+rp": lambda ids, mask: plain(ids, mask, repetition_penalty=REPETITION_PENALTY),
        "medusa+rp": lambda ids, mask: medusa(ids, mask, repetition_penalty=REPETITION_PENALTY),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=26)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load()
    chosen = args.ways.split(",")
    ways = {name: way for name, way in ways_for(model, args.max_new_tokens).items() if name in chosen}
    seconds, tokens, steps = (dict.fromkeys(ways, 0) for _ in range(3))
    outputs = {name: [] for name in ways}
    questions = stratified_subset(read_questions(DEFAULT_QUESTIONS), args.questions)
    for question in questions:
        ids = chat_input_ids(tokenizer, question["turns"][0])
        mask = torch.ones_like(ids)
        for name, way in ways.items():
            start = time.perf_counter()
            out, used_steps = way(ids, mask)
            seconds[name] += time.perf_counter() - start
            tokens[name] += out.shape[1] - ids.shape[1]
            steps[name] += used_steps or 0
            outputs[name].append(out)

    def identical(a: str, b: str) -> str | None:
        if a not in ways or b not in ways:
            return None
        same = sum(torch.equal(x, y) for x, y in zip(outputs[a], outputs[b], strict=True))
        return f"{same}/{len(questions)}"

    rate = {name: tokens[name] / seconds[name] for name in ways}
    results = {
        "machine": machine_info(torch.float32, model.base_model),
        "questions": len(questions),
        "max_new_tokens": args.max_new_tokens,
        "repetition_penalty": REPETITION_PENALTY,
        "tokens_per_second": rate,
        "speedup_over_plain": {name: rate[name] / rate["plain"] for name in ways},
        "seconds_per_step": {name: seconds[name] / steps[name] for name in ways if steps[name]},
        "tokens_per_step": {name: tokens[name] / steps[name] for name in ways if steps[name]},
        "identical": {
            "medusa vs plain": identical("medusa", "plain"),
            "medusa+rp vs plain+rp": identical("medusa+rp", "plain+rp"),
        },
    }
    if "medusa+rp" in ways and "plain+rp" in ways:
        results["speedup_with_rp_over_plain_with_rp"] = rate["medusa+rp"] / rate["plain+rp"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
