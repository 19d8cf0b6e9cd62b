"""``medusa_lite.load`` and the ``medusa-lite`` command, on a tiny random model saved to disk."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_checkpoint import NUM_HEADS, TOPK_ACCURACY, save_tiny_checkpoint
from transformers import TextStreamer

from medusa_lite import MedusaModel, default_tree
from medusa_lite.artifacts.loading import MissingHeadsError, load, read_tree_file, tree_of, write_tree_file
from medusa_lite.bench.measure import chat_input_ids
from medusa_lite.cli import main
from medusa_lite.decoding.attention import TREE_SDPA
from medusa_lite.errors import TreeError
from medusa_lite.trees.tree import Tree, best_tree

PROMPT = "Why is the sky blue?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), training_summary={"topk_accuracy": TOPK_ACCURACY})


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([*args, "--threads", "1"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary_numbers(out: str) -> dict:
    match = re.search(
        r"\[medusa-lite\] (\d+) new tokens in [\d.]+ s: ([\d.]+) tokens/s, ([\d.]+) mean accepted tokens per "
        r"target call \((\d+)-node tree",
        out,
    )
    assert match, out
    return {
        "new_tokens": int(match[1]),
        "tokens_per_second": float(match[2]),
        "mean_accepted": float(match[3]),
        "tree_nodes": int(match[4]),
    }


# -- load --------------------------------------------------------------------------------------
def test_default_dtype_is_float32_on_cpu_and_bfloat16_on_accelerators(checkpoint):
    from medusa_lite.artifacts.loading import default_dtype

    assert default_dtype("cpu") == torch.float32 and default_dtype(torch.device("cpu")) == torch.float32
    assert default_dtype("cuda") == torch.bfloat16
    model, _ = load(checkpoint[0], heads=checkpoint[1])
    assert model.base_model.dtype == torch.float32 and next(model.heads.parameters()).dtype == torch.float32
    bf16, _ = load(checkpoint[0], heads=checkpoint[1], dtype=torch.bfloat16)
    assert bf16.base_model.dtype == torch.bfloat16


def test_load_uses_training_summary_accuracies(checkpoint):
    model_dir, heads_dir = checkpoint
    model, tokenizer = load(model_dir, heads=heads_dir, dtype=torch.float32)
    assert isinstance(model, MedusaModel) and model.num_heads == NUM_HEADS
    assert model.base_model.config._attn_implementation == TREE_SDPA
    assert model.base_model.dtype == torch.float32 and next(model.heads.parameters()).dtype == torch.float32
    assert model.tree == default_tree(NUM_HEADS, training_summary=model.heads.config.training_summary)
    assert model.tree == best_tree(TOPK_ACCURACY, 16)
    assert tree_of(model) == model.tree
    assert chat_input_ids(tokenizer, PROMPT).shape[0] == 1


def test_load_prefers_tree_argument_then_tree_json(tmp_path):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    assert load(model_dir, heads=heads_dir, dtype=torch.float32)[0].tree == default_tree(NUM_HEADS)
    write_tree_file(heads_dir / "tree.json", Tree.from_paths([[0], [0, 0]]), {"note": "test"})
    assert load(model_dir, heads=heads_dir, dtype=torch.float32)[0].tree.paths == ((0,), (0, 0))
    assert load(model_dir, heads=heads_dir, dtype=torch.float32, tree=[[0], [1]])[0].tree.paths == ((0,), (1,))


def test_default_tree_prefers_the_summarys_explicit_tree(checkpoint):
    model, _ = load(*checkpoint[:1], heads=checkpoint[1], dtype=torch.float32)
    model.heads.config.training_summary = {"tree": [[0], [0, 0], [0, 0, 0]], "topk_accuracy": TOPK_ACCURACY}
    tree = default_tree(NUM_HEADS, training_summary=model.heads.config.training_summary)
    assert tree.paths == ((0,), (0, 0), (0, 0, 0))


def test_missing_heads_give_clear_errors(tmp_path, checkpoint, monkeypatch):
    monkeypatch.setattr("medusa_lite.artifacts.loading.DEFAULT_HEADS_DIR", tmp_path / "deleted")
    with pytest.raises(MissingHeadsError, match="shipped heads are missing"):
        load()
    with pytest.raises(MissingHeadsError, match="heads="):
        load(checkpoint[0])


def test_bad_tree_files_are_rejected(tmp_path):
    (tmp_path / "tree.json").write_text(json.dumps({"nodes": 3}))
    with pytest.raises(TreeError, match="'paths'"):
        read_tree_file(tmp_path / "tree.json")
    with pytest.raises(TreeError, match="does not exist"):
        read_tree_file(tmp_path / "missing.json")


# -- the command -------------------------------------------------------------------------------
def test_cli_greedy_streams_text_and_compares(checkpoint, capsys, monkeypatch):
    model_dir, heads_dir = checkpoint
    chunks = []  # what the streamer printed, piece by piece (it still prints)

    class RecordingStreamer(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False):
            chunks.append(text)
            super().on_finalized_text(text, stream_end)

    monkeypatch.setattr("medusa_lite.cli.TextStreamer", RecordingStreamer)
    code, out, _ = run_cli(
        capsys,
        "--model",
        str(model_dir),
        "--heads",
        str(heads_dir),
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "20",
        "--dtype",
        "fp32",
        "--compare",
    )
    assert code == 0
    numbers = summary_numbers(out)
    assert 1 <= numbers["new_tokens"] <= 20 and numbers["mean_accepted"] >= 1.0
    assert numbers["tree_nodes"] == best_tree(TOPK_ACCURACY, 16).num_nodes
    assert "identical outputs: yes" in out and re.search(r"speed-up [\d.]+x", out)
    assert PROMPT not in out  # the prompt is not streamed back

    model, tokenizer = load(model_dir, heads=heads_dir, dtype=torch.float32)
    from medusa_lite import generate

    input_ids = chat_input_ids(tokenizer, PROMPT)
    tokens = generate(model, input_ids, 20, tree=model.tree).sequences[0, input_ids.shape[1] :]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    streamed = out[: out.index("[medusa-lite]")]
    assert len([chunk for chunk in chunks if chunk.strip()]) >= 2, f"the text was not streamed in pieces: {chunks}"
    # The whole text, as it was streamed (the streamer ends the line).
    assert "".join(chunks) == text and streamed == text + "\n"


def test_cli_sampling_is_seeded(checkpoint, capsys):
    model_dir, heads_dir = checkpoint
    args = [
        "--model",
        str(model_dir),
        "--heads",
        str(heads_dir),
        "--max-new-tokens",
        "16",
        "--dtype",
        "fp32",
        "--temperature",
        "0.9",
        "--top-k",
        "50",
        "--top-p",
        "0.95",
        "--seed",
        "3",
    ]
    first = run_cli(capsys, *args, "--compare")
    second = run_cli(capsys, *args)
    assert first[0] == second[0] == 0
    assert "identical outputs: n/a (sampling)" in first[1]
    assert first[1].split("[medusa-lite]")[0] == second[1].split("[medusa-lite]")[0]


def test_cli_tree_file(checkpoint, capsys, tmp_path):
    write_tree_file(tmp_path / "tree.json", Tree.from_paths([[0], [0, 0]]), {})
    model_dir, heads_dir = checkpoint
    code, out, _ = run_cli(
        capsys,
        "--model",
        str(model_dir),
        "--heads",
        str(heads_dir),
        "--tree",
        str(tmp_path / "tree.json"),
        "--max-new-tokens",
        "8",
        "--dtype",
        "fp32",
    )
    assert code == 0 and summary_numbers(out)["tree_nodes"] == 3


def test_cli_reports_errors_without_traceback(checkpoint, capsys):
    code, _, err = run_cli(capsys, "--model", str(checkpoint[0]))
    assert code == 2 and "heads" in err and "Traceback" not in err


@pytest.mark.slow
def test_python_dash_m_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "medusa_lite", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "--compare" in result.stdout
