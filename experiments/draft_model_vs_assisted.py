"""Draft-model speculative decoding, medusa-lite's DraftModelProposer beside transformers' assisted generation.

The pair is built here from SmolLM2-135M-Instruct (the only model on this machine), the target
in float32, and one of two drafts sharing its tokenizer:

- ``bf16``: the same model in bfloat16 (agrees almost always; costs about as much as the target);
- ``truncated-N``: the target's first N of 30 layers with its embeddings, final norm and lm_head
  (cheap, agrees less often).

For each Spec-Bench question (a stratified subset), greedy: plain ``generate``, medusa-lite with
``proposers=[DraftModelProposer(draft)]`` and ``transformers``' ``generate(assistant_model=draft)``
with the same starting k and the heuristic schedule. Recorded per method: new tokens per target
call (prefill included, both counted by a forward hook on the target), seconds, and whether the
tokens equal plain greedy. Methods run side by side in one process, interleaved per question.

    python experiments/draft_model_vs_assisted.py --draft truncated-10 --questions 8 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from common import BENCHMARKS, SPEC_BENCH_QUESTIONS, read_questions, stratified_subset
from medusa_lite import DraftModelProposer, MedusaModel, generate
from medusa_lite.artifacts.loading import load_target
from medusa_lite.bench.measure import chat_input_ids
from medusa_lite.proposers.draft_model import DEFAULT_DRAFT_TOKENS

OUT = BENCHMARKS / "draft_model"


def truncated_copy(base, num_layers: int):
    """The first ``num_layers`` decoder layers of ``base`` with its embeddings, final norm and lm_head."""
    config = copy.deepcopy(base.config)
    config.num_hidden_layers = num_layers
    draft = AutoModelForCausalLM.from_config(
        config, attn_implementation=base.config._attn_implementation, dtype=base.dtype
    )

    def kept(name: str) -> bool:
        return ".layers." not in name or int(name.split(".layers.")[1].split(".")[0]) < num_layers

    draft.load_state_dict({name: tensor for name, tensor in base.state_dict().items() if kept(name)}, strict=True)
    draft.generation_config = copy.deepcopy(base.generation_config)
    return draft.eval()


def build_draft(base, kind: str):
    if kind == "bf16":
        return copy.deepcopy(base).to(torch.bfloat16).eval()
    if kind.startswith("truncated-"):
        return truncated_copy(base, int(kind.removeprefix("truncated-")))
    raise SystemExit(f"unknown draft {kind!r}: bf16 or truncated-N")


class Calls:
    """Counts forwards of the target while active."""

    def __init__(self, module):
        self.module, self.count = module, 0

    def __enter__(self):
        self.handle = self.module.register_forward_pre_hook(lambda *args: setattr(self, "count", self.count + 1))
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def timed(function):
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default="truncated-10")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=DEFAULT_DRAFT_TOKENS, help="tokens drafted per step at first (both)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base, tokenizer = load_target(None, torch.float32, "cpu")
    model = MedusaModel(base)
    draft = build_draft(base, args.draft)
    draft.generation_config.num_assistant_tokens = args.k
    draft.generation_config.num_assistant_tokens_schedule = "heuristic"
    eos = base.generation_config.eos_token_id
    pad = base.generation_config.pad_token_id
    common = {
        "max_new_tokens": args.max_new_tokens,
        "do_sample": False,
        "pad_token_id": pad if pad is not None else eos,
    }

    def plain(ids):
        return base.generate(ids, attention_mask=torch.ones_like(ids), **common)[0, ids.shape[1] :]

    def assisted(ids):
        return base.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, **common)[
            0, ids.shape[1] :
        ]

    def ours(ids):
        out = generate(model, ids, args.max_new_tokens, proposers=[DraftModelProposer(draft, k=args.k)])
        return out.sequences[0, ids.shape[1] :]

    methods = {"plain": plain, "medusa_lite_draft": ours, "hf_assisted": assisted}
    warm = chat_input_ids(tokenizer, "Hello")
    for method in methods.values():
        method(warm)
    records = []
    for question in stratified_subset(read_questions(SPEC_BENCH_QUESTIONS), args.questions):
        ids = chat_input_ids(tokenizer, question["turns"][0])
        record = {"question_id": question["question_id"], "category": question["category"]}
        for name, method in methods.items():
            with torch.inference_mode(), Calls(base) as calls:
                tokens, seconds = timed(functools.partial(method, ids))
            record[name] = {"tokens": tokens.tolist(), "seconds": seconds, "target_calls": calls.count}
        for name in ("medusa_lite_draft", "hf_assisted"):
            record[name]["identical_to_plain"] = record[name]["tokens"] == record["plain"]["tokens"]
        records.append(record)
        print(
            question["category"],
            {n: round(len(r["tokens"]) / r["target_calls"], 2) for n, r in record.items() if isinstance(r, dict)},
            file=sys.stderr,
        )
    summary = {}
    for name in methods:
        tokens = sum(len(r[name]["tokens"]) for r in records)
        summary[name] = {
            "new_tokens": tokens,
            "tokens_per_target_call": tokens / sum(r[name]["target_calls"] for r in records),
            "tokens_per_second": tokens / sum(r[name]["seconds"] for r in records),
            "identical_to_plain": sum(r[name].get("identical_to_plain", True) for r in records),
        }
    result = {"draft": args.draft, "k": args.k, "questions": len(records), "max_new_tokens": args.max_new_tokens}
    result |= {"threads": torch.get_num_threads(), "summary": summary, "records": records}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"results_{args.draft}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"draft": args.draft, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
