"""vLLM plain, with its n-gram proposer and with an exported drafter, on the same prompts (in vLLM's own venv).

It imports vLLM only (not medusa-lite, whose transformers vLLM does not accept). Prompts come as
token ids, so both engines see the same tokens; greedy, float32, ``enforce_eager``. Writes per
prompt the new token ids of each run, tokens/s, and vLLM's speculative-decoding counters (drafts,
accepted tokens, per position), from which the mean acceptance length follows.

    .venv-vllm/bin/python infer/vllm_check.py --model TARGET_DIR --speculative EXPORT_DIR/export.json \
        --prompts prompts.json --out results.json
"""

import argparse
import gc
import json
import time
from pathlib import Path

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
NGRAM_TOKENS, NGRAM_MATCH = 4, 4  # vLLM's n-gram (prompt lookup) proposer, as the reference run
MEMORY_FRACTION = 0.2  # ~5 GB of a 24 GB machine: ample KV cache for a 135M model, room for the test process


def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters so far (an empty dict when it keeps none)."""
    counters = {}
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            counters[SPEC_COUNTERS[metric.name]] = metric.value
        elif metric.name == PER_POSITION:
            counters["accepted_per_position"] = list(metric.values)
    return counters


def run(model: str, prompts: list[list[int]], max_tokens: int, speculative_config: dict | None) -> dict:
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=2048,
        gpu_memory_utilization=MEMORY_FRACTION,  # on CPU: the share of RAM vLLM reserves (its KV cache)
        seed=0,
        disable_log_stats=False,
        speculative_config=speculative_config,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)  # warm-up
    before = spec_counters(llm)
    outputs, seconds = [], 0.0
    for ids in prompts:  # one at a time: batch 1, as medusa-lite decodes
        start = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        seconds += time.perf_counter() - start
        outputs.append(list(out.outputs[0].token_ids))
    after = spec_counters(llm)
    counters = {}
    for key, value in after.items():
        if key == "accepted_per_position":
            old = before.get(key, [0] * len(value))
            counters[key] = [a - b for a, b in zip(value, old)]
        else:
            counters[key] = value - before.get(key, 0)
    tokens = sum(len(out) for out in outputs)
    del llm
    gc.collect()
    result = {"outputs": outputs, "seconds": seconds, "new_tokens": tokens, "tokens_per_second": tokens / seconds}
    if counters.get("drafts"):
        counters["mean_acceptance_length"] = 1 + counters["accepted_tokens"] / counters["drafts"]
    result["spec_decode"] = counters
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--speculative", required=True, help="export.json as medusa-lite export writes it")
    parser.add_argument("--prompts", required=True, help="a JSON list of prompts, each a list of token ids")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import vllm

    prompts = json.loads(Path(args.prompts).read_text())
    speculative = json.loads(Path(args.speculative).read_text())["speculative_config"]
    ngram = {"method": "ngram", "num_speculative_tokens": NGRAM_TOKENS, "prompt_lookup_max": NGRAM_MATCH}
    configs = {"plain": None, "ngram": ngram, "exported": speculative}
    runs = {name: run(args.model, prompts, args.max_tokens, config) for name, config in configs.items()}
    plain = runs["plain"]["outputs"]
    results = {
        "vllm_version": vllm.__version__,
        "speculative_configs": configs,
        "runs": runs,
        "identical_to_plain": {
            name: f"{sum(a == b for a, b in zip(plain, r['outputs'], strict=True))}/{len(prompts)}"
            for name, r in runs.items()
        },
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["identical_to_plain"]))


if __name__ == "__main__":  # vLLM spawns its engine process, which imports this module again
    main()
