"""Training on several data files: their sequences are pooled, each file is checked by name."""

from __future__ import annotations

import pytest
from tiny_tokenizer import make_tiny_tokenizer
from training_fixtures import TINY_CONFIG, write_pattern_data

from medusa_lite.training.config import config_from_dict, load_config
from medusa_lite.training.data import load_training_data
from medusa_lite.training.errors import TrainingDataError

SETTINGS = dict(max_length=512, eval_fraction=0.1, seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def test_files_are_pooled(tmp_path, tokenizer):
    first = write_pattern_data(tmp_path / "a.jsonl", 12, seed=1)
    second = write_pattern_data(tmp_path / "b.jsonl", 8, seed=2, style="messages")
    one = load_training_data(first, tokenizer, **SETTINGS)
    both = load_training_data([first, second], tokenizer, **SETTINGS)
    assert both.stats.records == 20
    assert len(both.train) + len(both.eval) == 20 > len(one.train) + len(one.eval)
    assert both.stats.path == f"{first} + {second}"
    assert f"{first} + {second}: 20 chat records" in both.stats.describe()


def test_a_missing_file_is_named(tmp_path, tokenizer):
    present = write_pattern_data(tmp_path / "a.jsonl", 4)
    with pytest.raises(TrainingDataError, match="missing.jsonl does not exist"):
        load_training_data([present, tmp_path / "missing.jsonl"], tokenizer, **SETTINGS)


def test_no_file_at_all_is_refused(tokenizer):
    with pytest.raises(TrainingDataError, match="no data file"):
        load_training_data([], tokenizer, **SETTINGS)


def test_config_takes_one_path_a_list_or_a_comma_separated_override():
    assert config_from_dict({"data": "a.jsonl"}).data == ["a.jsonl"]
    assert config_from_dict({"data": ["a.jsonl", "b.jsonl"]}).data == ["a.jsonl", "b.jsonl"]
    assert load_config(str(TINY_CONFIG), ["--data", "a.jsonl,b.jsonl"]).data == ["a.jsonl", "b.jsonl"]
