"""Every file format read with a schema: heads config (and its training_summary), tree.json, the
datastore header, training data and the training config.

Each refusal is a ``MedusaError`` and a ``ValueError`` whose message names the file (or field) and
the problem; valid unusual values (numpy integers, a tree file without ``format``) are accepted.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tiny_tokenizer import make_tiny_tokenizer

from medusa_lite import (
    Datastore,
    DatastoreError,
    HeadsConfigError,
    HeadsFileError,
    MedusaConfig,
    MedusaError,
    MedusaHeads,
    TreeError,
)
from medusa_lite.artifacts.loading import TREE_FILE_FORMAT, read_tree_file
from medusa_lite.proposers.datastore import DATASTORE_FORMAT, largest_vocabulary
from medusa_lite.training.config import load_config
from medusa_lite.training.data import load_training_data, read_records
from medusa_lite.training.errors import EmptyDatasetError, TrainingConfigError, TrainingDataError


def raises(error_type: type, match: str):
    """pytest.raises for an error that is ``error_type``, a MedusaError and a ValueError."""
    assert issubclass(error_type, MedusaError) and issubclass(error_type, ValueError)
    return pytest.raises(error_type, match=match)


# -- heads config and its training_summary -----------------------------------------------------
SHAPE = dict(num_heads=3, hidden_size=8, vocab_size=50)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(num_heads=True), "MedusaConfig.num_heads must be a positive integer, got bool True"),
        (dict(num_heads=2.0), "MedusaConfig.num_heads must be a positive integer, got float 2.0"),
        (dict(vocab_size="50"), "MedusaConfig.vocab_size must be a positive integer, got str '50'"),
        (dict(num_layers=True), "MedusaConfig.num_layers must be an integer >= 0, got bool True"),
        (dict(num_layers=-1), "MedusaConfig.num_layers must be an integer >= 0, got int -1"),
        (dict(use_base_lm_head=1), "MedusaConfig.use_base_lm_head must be true or false, got int 1"),
        (dict(next_token_input="yes"), "MedusaConfig.next_token_input must be true or false"),
        (
            dict(draft_vocab_size=True),
            r"MedusaConfig.draft_vocab_size must be None \(full vocabulary\) or an integer in \[1, vocab_size = 50\]",
        ),
        (dict(draft_vocab_size=51), r"draft_vocab_size must be .* got int 51"),
        (dict(draft_vocab_size=10, use_base_lm_head=False), "draft_vocab_size needs use_base_lm_head=True"),
        (dict(base_model_name_or_path=5), "MedusaConfig.base_model_name_or_path must be text or None"),
        (dict(training_summary=[1]), r"MedusaConfig.training_summary must be a JSON object \(dict\), got list"),
        (dict(training_summary={"tree": "0,1"}), r"training_summary\['tree'\] is not a tree of top-k rank paths"),
        (dict(training_summary={"tree": [[0], [True]]}), r"training_summary\['tree'\] .* ranks must be integers"),
        (
            dict(training_summary={"tree": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]}),
            r"training_summary\['tree'\] reaches depth 4 but there are 3 heads",
        ),
        (
            dict(training_summary={"topk_accuracy": 0.5}),
            r"training_summary\['topk_accuracy'\] must be a list of 1 to 3 rows",
        ),
        (
            dict(training_summary={"topk_accuracy": [[0.5]] * 4}),
            r"training_summary\['topk_accuracy'\] must be a list of 1 to 3 rows",
        ),
        (
            dict(training_summary={"topk_accuracy": [[0.5, 1.5]]}),
            r"topk_accuracy'\] row 1 \(head 1\) must hold numbers in \[0, 1\], found float 1.5",
        ),
        (
            dict(training_summary={"topk_accuracy": [[0.5], [True]]}),
            r"row 2 \(head 2\) must hold numbers in \[0, 1\], found bool True",
        ),
        (dict(training_summary={"topk_accuracy": [[0.5], ["x"]]}), r"row 2 .* found str 'x'"),
        (dict(training_summary={"topk_accuracy": [[math.nan]]}), r"row 1 .* found float nan"),
        (
            dict(training_summary={"top1_accuracy": [0.3, None]}),
            r"training_summary\['top1_accuracy'\] must hold numbers in \[0, 1\], found NoneType None",
        ),
    ],
    ids=repr,
)
def test_bad_heads_config_values(changes, match):
    with raises(HeadsConfigError, match=match):
        MedusaConfig(**{**SHAPE, **changes})


def test_numpy_integers_in_a_config_are_plain_ints():
    config = MedusaConfig(
        num_heads=np.int64(2), hidden_size=np.int32(8), vocab_size=torch.tensor(50), draft_vocab_size=np.int16(10)
    )
    assert (config.num_heads, config.hidden_size, config.vocab_size, config.draft_vocab_size) == (2, 8, 50, 10)
    assert all(
        type(v) is int for v in (config.num_heads, config.hidden_size, config.vocab_size, config.draft_vocab_size)
    )


@pytest.fixture
def heads_folder(tmp_path):
    folder = tmp_path / "heads"
    MedusaHeads(MedusaConfig(**SHAPE)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "summary, match",
    [
        ({"tree": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]}, "reaches depth 4 but there are 3 heads"),
        ({"topk_accuracy": [[0.4, "0.1"]]}, "found str '0.1'"),
        ({"topk_accuracy": {"head 1": [0.4]}}, "must be a list of 1 to 3 rows"),
        ("trained on chats", "training_summary must be a JSON object"),
    ],
)
def test_malformed_training_summary_in_a_heads_folder_names_the_file(heads_folder, summary, match):
    config_file = heads_folder / "config.json"
    values = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**values, "training_summary": summary}))
    with raises(HeadsFileError, match=f"{config_file}.*{match}"):
        MedusaHeads.from_pretrained(heads_folder)


@pytest.mark.parametrize("field, value", [("num_heads", True), ("use_base_lm_head", 1), ("num_layers", False)])
def test_a_boolean_where_an_integer_belongs_and_back_is_refused(heads_folder, field, value):
    config_file = heads_folder / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), field: value}))
    with raises(HeadsFileError, match=f"MedusaConfig.{field} must be"):
        MedusaHeads.from_pretrained(heads_folder)


# -- tree.json ---------------------------------------------------------------------------------
GOOD_TREE = {"format": TREE_FILE_FORMAT, "num_nodes": 3, "paths": [[0], [0, 0]]}
GOOD_DYNAMIC = {"max_nodes": 4, "row_costs": [1.0, 1.1], "tokens_per_cost": 2.0}


@pytest.mark.parametrize(
    "values, match",
    [
        (
            {**GOOD_TREE, "format": "medusa-lite-tree/2"},
            r"has format 'medusa-lite-tree/2'; this medusa-lite reads 'medusa-lite-tree/1': upgrade",
        ),
        ({**GOOD_TREE, "format": 1}, "has format 1"),
        ({**GOOD_TREE, "paths": 5}, "must hold a JSON object with a 'paths' list"),
        ({**GOOD_TREE, "paths": [[0], [True]]}, r"'paths': tree path \(0, True\)|'paths': .*ranks must be integers"),
        ({**GOOD_TREE, "paths": [[0, 0]]}, "has no parent"),
        ({**GOOD_TREE, "num_nodes": 5}, "says num_nodes 5 but its paths make 3"),
        ({**GOOD_TREE, "num_nodes": True}, "says num_nodes True but its paths make 3"),
        ({**GOOD_TREE, "dynamic": {**GOOD_DYNAMIC, "max_nodes": True}}, "max_nodes >= 1"),
        (
            {**GOOD_TREE, "dynamic": {**GOOD_DYNAMIC, "row_costs": [1.0, True]}},
            "row_costs must be a non-empty list of positive step costs",
        ),
        (
            {**GOOD_TREE, "dynamic": {**GOOD_DYNAMIC, "tokens_per_costs": 2.0}},
            r"'dynamic' has unknown key\(s\) \['tokens_per_costs'\] \(a typo\?\)",
        ),
        ({**GOOD_TREE, "dynamic": [4]}, "'dynamic' must be an object"),
        ([[0], [1]], "must hold a JSON object"),
    ],
    ids=repr,
)
def test_bad_tree_files(tmp_path, values, match):
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(values))
    with raises(TreeError, match=f"tree file {path}.*{match}"):
        read_tree_file(path)


def test_tree_file_not_json_or_a_directory(tmp_path):
    (tmp_path / "tree.json").write_text("{paths: [[0]]}")
    with raises(TreeError, match="is not valid JSON"):
        read_tree_file(tmp_path / "tree.json")
    with raises(TreeError, match="is a directory"):
        read_tree_file(tmp_path)


def test_tree_files_of_this_format_or_none_are_read(tmp_path):
    path = tmp_path / "tree.json"
    path.write_text(json.dumps({**GOOD_TREE, "dynamic": GOOD_DYNAMIC, "notes": {"by": "hand"}}))
    assert read_tree_file(path).max_nodes == 4 and read_tree_file(path, dynamic=False).num_nodes == 3
    path.write_text(json.dumps({"paths": [[0], [1], [0, 0]]}))  # hand-written: no format, no num_nodes
    assert read_tree_file(path).paths == ((0,), (1,), (0, 0))


# -- datastore header --------------------------------------------------------------------------
def write_datastore(path, tokens: torch.Tensor, **metadata) -> None:
    header = {"format": DATASTORE_FORMAT, "vocab_size": "50", "documents": str(int((tokens == -1).sum()))}
    save_file({"tokens": tokens}, str(path), metadata={**header, **metadata})


TOKENS = torch.tensor([1, 2, 3, -1, 4, 5, -1], dtype=torch.int32)


@pytest.mark.parametrize(
    "tokens, metadata, match",
    [
        (
            TOKENS,
            dict(vocab_size="99999999999999999999"),
            rf"header says vocab_size 99999999999999999999, outside \[1, {largest_vocabulary()}\]",
        ),
        (TOKENS, dict(vocab_size="0"), r"header says vocab_size 0, outside \[1, "),
        (TOKENS, dict(vocab_size="-5"), "header field 'vocab_size' must be a whole number, found '-5'"),
        (TOKENS, dict(vocab_size="fifty"), "header field 'vocab_size' must be a whole number"),
        (TOKENS, dict(documents="7"), "header says 7 documents but the tokens hold 2"),
        (TOKENS, dict(documents="two"), "header field 'documents' must be a whole number"),
        (TOKENS, dict(format="medusa-lite-datastore/2"), "format 'medusa-lite-datastore/2'.*upgrade medusa-lite"),
        (
            TOKENS,
            dict(format="something-else"),
            "not a medusa-lite datastore .*build one with medusa-lite build-datastore",
        ),
        (TOKENS.view(1, -1), {}, r"'tokens' must be a 1-D integer tensor, found torch.int32 \(1, 7\)"),
        (TOKENS.float(), {}, "'tokens' must be a 1-D integer tensor, found torch.float32"),
        (TOKENS > 0, dict(documents="0"), "'tokens' must be a 1-D integer tensor, found torch.bool"),
        (
            torch.tensor([1, 2, 60, -1], dtype=torch.int32),
            dict(documents="1"),
            r"datastore file .*: datastore holds ids outside \[0, 50\).*corrupt",
        ),
    ],
    ids=repr,
)
def test_bad_datastore_files(tmp_path, tokens, metadata, match):
    path = tmp_path / "datastore.safetensors"
    write_datastore(path, tokens, **metadata)
    with raises(DatastoreError, match=match) as caught:
        Datastore.load(path)
    assert str(path) in str(caught.value)


def test_datastore_extra_tensor_and_directory(tmp_path):
    path = tmp_path / "datastore.safetensors"
    save_file(
        {"tokens": TOKENS, "extra": TOKENS.clone()},
        str(path),
        metadata={"format": DATASTORE_FORMAT, "vocab_size": "50", "documents": "2"},
    )
    with raises(DatastoreError, match=r"must hold exactly one tensor 'tokens', found \['extra', 'tokens'\]"):
        Datastore.load(path)
    with raises(DatastoreError, match="is a directory"):
        Datastore.load(tmp_path)


def test_a_well_formed_datastore_still_loads(tmp_path):
    path = tmp_path / "datastore.safetensors"
    write_datastore(path, TOKENS)
    store = Datastore.load(path, 50)
    assert store.num_documents == 2 and store.num_tokens == 5


# -- training data -----------------------------------------------------------------------------
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there friend"}]}


@pytest.mark.parametrize(
    "name, content, error, match",
    [
        (
            "bad.jsonl",
            [json.dumps(CHAT), json.dumps(CHAT)[:-3], json.dumps(CHAT)],
            TrainingDataError,
            r"bad.jsonl, line 2: not valid JSON \(.* at column \d+\).*fix or remove that line",
        ),
        ("gap.jsonl", [json.dumps(CHAT), "", "", "{oops}"], TrainingDataError, r"gap.jsonl, line 4: not valid JSON"),
        (
            "list.jsonl",
            [json.dumps(CHAT), "[1, 2]"],
            TrainingDataError,
            r"list.jsonl, line 2: expected a JSON object .* got \[1, 2\]",
        ),
        ("empty_object.jsonl", ["{}"], TrainingDataError, r"line 1: expected a JSON object"),
        ("empty.json", ["[]"], EmptyDatasetError, "holds an empty list: no records to train on"),
        ("blank.jsonl", ["", "  ", ""], EmptyDatasetError, "holds only blank lines: no records to train on"),
        (
            "array.json",
            [json.dumps([CHAT, "just text"])],
            TrainingDataError,
            r"array.json, record 2: expected a JSON object .* got \"just text\"",
        ),
        (
            "broken.json",
            ["[", json.dumps(CHAT) + ",", '{"text": oops}', "]"],
            TrainingDataError,
            r"broken.json, line 3: not valid JSON",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "",
)
def test_bad_training_data_names_the_line(tmp_path, name, content, error, match):
    path = tmp_path / name
    path.write_text("\n".join(content) + "\n")
    with raises(error, match=match):
        read_records(path)


def test_training_data_not_utf8_directory_and_through_load_training_data(tmp_path):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(CHAT).encode().replace(b"hello", b"h\xe9llo"))
    with raises(TrainingDataError, match="latin.jsonl is not UTF-8 text"):
        read_records(latin)
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps(CHAT) + "\n")
    with raises(
        TrainingDataError,
        match=r"data path .*data is a directory \(it holds a.jsonl\); give the data file\(s\) inside it",
    ):
        read_records(folder)
    (folder / "b.jsonl").write_text(json.dumps(CHAT) + "\n" + "not json\n")
    with raises(TrainingDataError, match="b.jsonl, line 2: not valid JSON"):
        load_training_data(
            [folder / "a.jsonl", folder / "b.jsonl"], make_tiny_tokenizer(), max_length=64, eval_fraction=0.0, seed=0
        )


def test_well_formed_json_lines_and_arrays_still_read(tmp_path):
    lines, array = tmp_path / "chat.jsonl", tmp_path / "chat.json"
    lines.write_text("\n".join([json.dumps(CHAT)] * 3) + "\n\n")
    array.write_text(json.dumps([CHAT] * 3, indent=2))
    assert [len(read_records(p)[1]) for p in (lines, array)] == [3, 3]


# -- training config ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, match",
    [
        (["--weight_decay", "nan"], "weight_decay must be a finite number, got 'nan'"),
        (["--learning_rate", "inf"], "learning_rate must be a finite number"),
        (["--max_grad_norm", "-inf"], "max_grad_norm must be a finite number"),
        (["--head_loss_weights", "[1.0, .nan]"], r"head_loss_weights\[1\] must be a finite number"),
        (["--weight_decay", "-0.1"], "weight_decay must be >= 0"),
        (["--max_grad_norm", "-1"], r"max_grad_norm must be >= 0 \(0 turns clipping off\)"),
        (["--max_cache_gb", "1e999"], "max_cache_gb must be a finite number"),
        (["--lora", "{dropout: 1.5}"], r"lora.dropout must be in \[0, 1\)"),
        (["--lora", "{alpha: 0}"], "lora.alpha must be >= 1"),
        (["--lora", "{dropout: .nan}"], "lora.dropout must be a finite number"),
    ],
    ids=repr,
)
def test_non_finite_or_impossible_hyper_parameters_fail_at_config_time(overrides, match):
    with raises(TrainingConfigError, match=match):
        load_config(None, ["--data", "train.jsonl", *overrides])


def test_nan_in_a_yaml_config_names_the_file_and_key(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("data: [train.jsonl]\nweight_decay: .nan\n")
    with raises(TrainingConfigError, match=f"{path}: weight_decay must be a finite number"):
        load_config(path)
