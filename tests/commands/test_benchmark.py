"""``medusa-lite benchmark`` (Spec-Bench) end to end on a tiny model, and ``medusa-lite microbench``."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
import torch
from tiny_checkpoint import QUESTIONS, save_tiny_checkpoint
from transformers import AutoModelForCausalLM

from medusa_lite import DynamicTree, Tree
from medusa_lite.artifacts.loading import write_tree_file
from medusa_lite.bench import harness, report
from medusa_lite.bench import questions as spec_bench
from medusa_lite.commands import benchmark, microbench
from medusa_lite.decoding.generate import DEFAULT_LOOKUP_TOKENS
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.errors import MedusaError
from medusa_lite.proposers.datastore import DATASTORE_FILE_NAME, Datastore

OUTPUT_FILES = ("results.json", "results.md", "speedup_by_category.png", "acceptance_by_depth.png")


def test_carried_spec_bench_copy():
    questions = spec_bench.read_questions(spec_bench.DEFAULT_QUESTIONS)
    assert len(questions) == 480 and len(spec_bench.categories_in_order(questions)) == 13
    assert (spec_bench.DEFAULT_QUESTIONS.parent / "README.md").read_text().count("Apache") >= 1


def test_stratified_subset_and_rotation():
    questions = spec_bench.read_questions(spec_bench.DEFAULT_QUESTIONS)
    subset = spec_bench.stratified_subset(questions, 26)
    assert len(subset) == 26 and set(Counter(q["category"] for q in subset).values()) == {2}
    assert len({q["question_id"] for q in subset}) == 26
    assert len(spec_bench.stratified_subset(questions, 5)) == 5
    assert spec_bench.stratified_subset(QUESTIONS, 10) == [QUESTIONS[0], QUESTIONS[1], QUESTIONS[2]]
    assert [harness.rotated(harness.METHODS, i)[0] for i in range(5)] == [
        "plain",
        "plain_kernel",
        "pld",
        "medusa",
        "static_tree",
    ]


def test_first_difference():
    assert harness.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert harness.first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert harness.first_difference([1, 2], [1, 2, 3]) == 2


def test_benchmark_end_to_end_fp32(tmp_path):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    vocab_size = json.loads((heads_dir / "config.json").read_text())["vocab_size"]
    answers = [torch.randint(0, vocab_size, (30,), generator=torch.Generator().manual_seed(seed)) for seed in range(5)]
    Datastore.from_documents(answers, vocab_size).save(heads_dir / DATASTORE_FILE_NAME)
    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    out = tmp_path / "bench"
    args = ["--model", str(model_dir), "--heads", str(heads_dir), "--questions", str(questions_file), "--quick", "3"]
    assert (
        benchmark.main([*args, "--max-new-tokens", "16", "--dtype", "fp32", "--threads", "1", "--out", str(out)]) == 0
    )
    for name in OUTPUT_FILES:
        assert (out / name).stat().st_size > 0, name

    results = json.loads((out / "results.json").read_text())
    assert (
        results["num_questions"] == 3
        and results["machine"]["dtype"] == "float32"
        and results["machine"]["torch_threads"] == 1
    )
    assert results["machine"]["cpu"] and results["machine"]["transformers"] and results["machine"]["date"]
    overall = results["summary"]["overall"]
    kernel_runs = results["machine"]["prepack_backend"] is not None
    assert ("plain_kernel" in overall) == kernel_runs
    expected_methods = ["plain", "plain_kernel", "pld", "medusa"] if kernel_runs else ["plain", "pld", "medusa"]
    assert [q["order"][0] for q in results["questions"]] == expected_methods[:3]
    speedups = [q["methods"]["plain"]["seconds"] / q["methods"]["medusa"]["seconds"] for q in results["questions"]]
    assert overall["medusa"]["min_question_speedup"] == min(speedups)
    assert set(results["summary"]) == {"writing", "qa", "overall"}
    assert overall["plain"]["mean_accepted_tokens"] == 1.0 and overall["plain"]["speedup"] == 1.0
    assert overall["medusa"]["identical_fraction"] == 1.0 and overall["heads"]["identical_fraction"] == 1.0
    assert (
        overall["no_datastore"]["identical_fraction"] == 1.0
        and overall["no_datastore"]["datastore_step_fraction"] == 0.0
    )
    assert (
        results["datastore_answers"] == len(answers)
        and 0.0 <= overall["medusa"]["datastore_step_fraction"] <= overall["medusa"]["lookup_step_fraction"]
    )
    assert 0.0 <= overall["medusa"]["lookup_step_fraction"] <= 1.0 and overall["heads"]["lookup_step_fraction"] == 0.0
    assert overall["medusa"]["mean_accepted_tokens"] >= 1.0 and overall["pld"]["mean_accepted_tokens"] >= 1.0
    assert overall["plain"]["mean_tokens_per_step"] == 1.0
    medusa_runs = [record["methods"]["medusa"] for record in results["questions"]]
    per_step = sum(run["new_tokens"] - 1 for run in medusa_runs) / sum(run["steps"] for run in medusa_runs)
    assert overall["medusa"]["mean_tokens_per_step"] == pytest.approx(per_step)
    assert len(overall["heads"]["acceptance_rate_by_depth"]) == max(len(path) for path in results["tree"])
    for record in results["questions"]:
        plain, medusa = record["methods"]["plain"], record["methods"]["medusa"]
        assert medusa["new_tokens"] == plain["new_tokens"] and plain["target_calls"] == plain["new_tokens"]
        assert medusa["target_calls"] == medusa["steps"] + 1

    table = (out / "results.md").read_text()
    assert "| **overall** | 3 |" in table and "float32" in table
    assert f"medusa {overall['medusa']['mean_tokens_per_step']:.2f}" in table
    progress = [json.loads(line) for line in (out / benchmark.PROGRESS_FILE).read_text().splitlines()]
    assert progress == results["questions"], "progress.jsonl holds every question's record as measured"

    gzipped = tmp_path / "results.json.gz"
    gzipped.write_bytes(gzip.compress((out / "results.json").read_bytes()))
    redrawn = report.replot(gzipped, tmp_path / "redrawn")
    assert [path.name for path in redrawn] == list(OUTPUT_FILES[2:])
    assert all(path.stat().st_size > 0 for path in redrawn)


def test_replot_refuses_results_without_a_summary(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"questions": []}))
    with pytest.raises(MedusaError, match="no Spec-Bench summary"):
        report.replot(results, tmp_path / "out")


def test_benchmark_runs_a_subset_of_methods(tmp_path):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[:2]))
    out = tmp_path / "bench"
    args = [
        "--model",
        str(model_dir),
        "--heads",
        str(heads_dir),
        "--questions",
        str(questions_file),
        "--methods",
        "heads",
    ]
    assert (
        benchmark.main([*args, "--max-new-tokens", "8", "--dtype", "fp32", "--threads", "1", "--out", str(out)]) == 0
    )
    results = json.loads((out / "results.json").read_text())
    kernel = {"plain_kernel"} if results["machine"]["prepack_backend"] is not None else set()
    assert set(results["summary"]["overall"]) == {"plain", "heads"} | kernel  # plain always runs: it is the reference
    assert "heads only speed-up" in (out / "results.md").read_text()


def test_benchmark_runs_a_sequential_drafter_beside_the_heads(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_LITE_CACHE", str(tmp_path / "cache"))
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    target = AutoModelForCausalLM.from_pretrained(model_dir)
    SequentialDrafter(DrafterConfig.for_model(target, depth=3)).save_pretrained(tmp_path / "drafter")
    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[:2]))
    out = tmp_path / "bench"
    args = ["--model", str(model_dir), "--heads", str(heads_dir), "--questions", str(questions_file)]
    args += ["--methods", "medusa", "drafter", "--drafter", str(tmp_path / "drafter")]
    assert (
        benchmark.main([*args, "--max-new-tokens", "10", "--dtype", "fp32", "--threads", "1", "--out", str(out)]) == 0
    )
    overall = json.loads((out / "results.json").read_text())["summary"]["overall"]
    assert overall["drafter"]["identical_fraction"] == 1.0 and overall["medusa"]["identical_fraction"] == 1.0
    assert "drafter speed-up" in (out / "results.md").read_text()
    with pytest.raises(SystemExit):  # --methods drafter without --drafter: a usage error before any work
        benchmark.main([*args[:-2], "--out", str(out)])


def test_benchmark_compares_a_dynamic_tree_with_the_static_one(tmp_path):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    policy = DynamicTree(6, (1.0, 1.0, 1.05, 1.1, 1.1, 1.2), tokens_per_cost=0.5)
    write_tree_file(heads_dir / "tree.json", Tree.from_paths([[0], [1], [0, 0]]), {}, policy)
    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[:2]))
    out = tmp_path / "bench"
    args = [
        "--model",
        str(model_dir),
        "--heads",
        str(heads_dir),
        "--questions",
        str(questions_file),
        "--methods",
        "medusa",
        "static_tree",
    ]
    assert (
        benchmark.main([*args, "--max-new-tokens", "12", "--dtype", "fp32", "--threads", "1", "--out", str(out)]) == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert (
        results["dynamic_tree"]["max_nodes"] == 6
        and results["static_tree"] == [[0], [1], [0, 0]]
        and results["tree"] is None
    )
    overall = results["summary"]["overall"]
    assert overall["medusa"]["identical_fraction"] == 1.0 and overall["static_tree"]["identical_fraction"] == 1.0
    assert 1.0 <= overall["static_tree"]["mean_verified_rows"] <= 4 + DEFAULT_LOOKUP_TOKENS
    assert 1.0 <= overall["medusa"]["mean_verified_rows"] <= 6 + DEFAULT_LOOKUP_TOKENS
    assert "dynamic tree of up to 6 nodes" in (out / "results.md").read_text()


def test_microbench_runs_on_a_tiny_random_model(capsys):
    assert microbench.main(["--max-new-tokens", "16", "--repeats", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "plain model.generate" in out and "identical to plain: yes" in out
