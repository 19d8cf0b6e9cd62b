"""``medusa-lite gpu-check``'s CPU dry run: the GPU script's every step (exactness, Spec-Bench side by
side in bf16 and fp32, step overhead) runs end to end on a tiny model, so the prepared command works."""

from __future__ import annotations

import json

from tiny_checkpoint import QUESTIONS, save_tiny_checkpoint

from medusa_lite.commands import gpu_check


def test_the_gpu_script_dry_runs_on_the_cpu(tmp_path):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    out = tmp_path / "gpu"
    args = [
        "--dry-run",
        "--device",
        "cpu",
        "--model",
        str(model_dir),
        "--heads",
        str(heads_dir),
        "--questions",
        str(questions),
    ]
    assert gpu_check.main([*args, "--threads", "1", "--out", str(out)]) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    assert set(report["dtypes"]) == {"bf16", "fp32"}
    fp32, bf16 = report["dtypes"]["fp32"], report["dtypes"]["bf16"]
    assert fp32["exactness"]["identical"] == fp32["exactness"]["prompts"] == 2  # fp32 greedy: identical, always
    assert 0 <= bf16["exactness"]["identical"] <= bf16["exactness"]["prompts"]
    for entry in (fp32, bf16):
        assert {"plain", "pld", "medusa"} <= set(entry["spec_bench"]) and entry["spec_bench"]["medusa"][
            "questions"
        ] == 2
        assert entry["step_overhead"]["target_calls"] >= 1 and entry["step_overhead"]["target_forward_ms_per_call"] > 0
    assert fp32["spec_bench"]["medusa"]["identical_fraction"] == 1.0
    for dtype in ("bf16", "fp32"):
        results = json.loads((out / dtype / "results.json").read_text())
        assert results["machine"]["device"] == "cpu" and results["num_questions"] == 2
    assert "| fp32 | 2/2 |" in (out / "gpu_check.md").read_text()


def test_the_gpu_script_says_when_there_is_no_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
