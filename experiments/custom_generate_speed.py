"""transformers' own ``model.generate`` with and without ``custom_generate=<the shipped heads>``, side by side.

One process, the default model in float32 on this CPU, Spec-Bench questions (stratified), greedy,
the three ways interleaved per question: plain ``base.generate``; ``base.generate(custom_generate=...)``
(the target left unpacked, heads attached per call); and ``load()`` + ``MedusaModel.generate`` (packed).
Writes tokens/s per way and whether every output is identical to plain greedy.

    PYTHONPATH=. python experiments/custom_generate_speed.py --questions 8 --out benchmarks/custom_generate
"""

import argparse
import json
import time
from pathlib import Path

import torch

from medusa_lite import load
from medusa_lite.artifacts.loading import DEFAULT_HEADS_DIR, load_target
from medusa_lite.bench.measure import machine_info
from medusa_lite.bench.questions import DEFAULT_QUESTIONS, read_questions, stratified_subset


def timed(call, inputs):
    start = time.perf_counter()
    out = call(inputs)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    base, tokenizer = load_target(None, torch.float32, "cpu")
    packed, _ = load()  # a second copy of the target, prepacked, for medusa-lite's own path
    ways = {
        "plain": lambda inputs: base.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False),
        "custom_generate": lambda inputs: base.generate(
            **inputs,
            max_new_tokens=args.max_new_tokens,
            custom_generate=str(DEFAULT_HEADS_DIR),
            trust_remote_code=True,
        ),
        "load+MedusaModel.generate": lambda inputs: packed.generate(**inputs, max_new_tokens=args.max_new_tokens),
    }
    seconds = dict.fromkeys(ways, 0.0)
    tokens = dict.fromkeys(ways, 0)
    identical = dict.fromkeys(ways, 0)
    questions = stratified_subset(read_questions(DEFAULT_QUESTIONS), args.questions)
    ways["custom_generate"](tokenizer("warm-up", return_tensors="pt"))  # the module copied and imported once
    for question in questions:
        messages = [{"role": "user", "content": question["turns"][0]}]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        reference = None
        for name, way in ways.items():
            out, elapsed = timed(way, inputs)
            reference = out if reference is None else reference
            seconds[name] += elapsed
            tokens[name] += out.shape[1] - inputs["input_ids"].shape[1]
            identical[name] += bool(torch.equal(out, reference))
    results = {
        "machine": machine_info(torch.float32, base),
        "questions": len(questions),
        "max_new_tokens": args.max_new_tokens,
        "tokens_per_second": {name: tokens[name] / seconds[name] for name in ways},
        "speedup_over_plain": {
            name: (tokens[name] / seconds[name]) / (tokens["plain"] / seconds["plain"]) for name in ways
        },
        "identical_to_plain": {name: f"{identical[name]}/{len(questions)}" for name in ways},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
