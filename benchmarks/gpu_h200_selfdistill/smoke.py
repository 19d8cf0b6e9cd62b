"""GPU smoke test of the pipeline run.sh uses, on tiny random models (seconds).

Self-distils 8 records from a tiny chat model on CUDA, trains next-token heads on CUDA for a
few steps with train/train_heads.py's code path, and checks medusa-lite greedy decoding with the
trained heads on CUDA gives the target's own greedy tokens. Run from the repository root:

    PYTHONPATH=$PWD python3 benchmarks/gpu_h200_selfdistill/smoke.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO_ROOT / "tests"), str(REPO_ROOT / "train")]

import self_distill  # noqa: E402
import train_heads  # noqa: E402
from training_fixtures import save_tiny_target, tiny_argv, write_pattern_data  # noqa: E402

import medusa_lite  # noqa: E402

DEVICE = os.environ.get("SMOKE_DEVICE", "cuda")  # SMOKE_DEVICE=cpu tries it without a GPU


def main() -> None:
    assert DEVICE == "cpu" or torch.cuda.is_available(), "no CUDA device"
    work = Path(tempfile.mkdtemp())
    target = save_tiny_target(work / "target")
    started = time.perf_counter()
    stats = self_distill.main([
        "--model", str(target), "--dtype", "float32", "--device", DEVICE, "--out", str(work / "d.jsonl"),
        "--num-samples", "8", "--batch-size", "4", "--max-prompt-tokens", "16", "--max-new-tokens", "8",
        "--task-openers", str(REPO_ROOT / "data/self_distill/task_openers_v2.txt"),
    ])
    print(f"self_distill on {DEVICE}:", stats, f"{time.perf_counter() - started:.1f}s")
    data = write_pattern_data(work / "train.jsonl", 80)
    result = train_heads.main(tiny_argv(target, data, work / "run", dtype="float32", next_token_input=True, epochs=2, precompute_hidden=True))
    print(f"train on {DEVICE}:", result)
    model, tokenizer = medusa_lite.load(str(target), heads=str(work / "run" / "heads"), dtype=torch.float32, device=DEVICE)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Continue the pattern."}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"].to(DEVICE)
    ours = medusa_lite.generate(model, prompt, max_new_tokens=24)
    plain = model.base_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    print(f"medusa on {DEVICE}:", ours.stats)
    identical = torch.equal(ours.sequences.cpu(), plain[:, : ours.sequences.shape[-1]].cpu())
    print(f"greedy identical to plain generate on {DEVICE}:", identical)
    assert identical


if __name__ == "__main__":
    main()
