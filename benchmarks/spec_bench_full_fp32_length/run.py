"""Acceptance by generation length: the full Spec-Bench set with the default model, heads and tree, no timing.

    python benchmarks/spec_bench_full_fp32_length/run.py --max-new-tokens 128   # ~30 min on 2 CPU cores

Every question's first turn (chat template, greedy, float32), decoded by medusa-lite as
``medusa_lite.load()`` sets it up (the shipped dynamic tree, prompt-lookup and datastore chains),
up to ``--max-new-tokens`` tokens. The full benchmarks stop at 48 new tokens to keep three timed
methods within an hour on this CPU; Spec-Bench's own protocol generates up to 1024, and a longer
text gives the lookups more of itself to copy. Greedy acceptance does not depend on timing, so
only tokens and target calls are recorded (``results_<N>.json``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from medusa_lite import load
from medusa_lite.cli import machine_info, set_threads

HERE = Path(__file__).resolve().parent
RUNNER = HERE.parent / "spec_bench_full_fp32_dynamic64" / "run.py"  # the same loop, with a 64-node tree


def acceptance_runner():
    spec = importlib.util.spec_from_file_location("acceptance_runner", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    runner = acceptance_runner()
    set_threads(2)
    model, tokenizer = load()
    records = runner.acceptance_records(model, tokenizer, args.max_new_tokens)
    summary = runner.acceptance_summary(records)
    machine = machine_info(model.base_model.dtype, model.base_model)
    out = HERE / f"results_{args.max_new_tokens}.json"
    out.write_text(json.dumps({"max_new_tokens": args.max_new_tokens, "tree": model.tree.describe(), "machine": machine, "summary": summary, "questions": records}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
