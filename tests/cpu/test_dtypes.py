"""The one dtype vocabulary (medusa_lite.dtypes) and the places that read it: commands and the training config."""

from __future__ import annotations

import pytest
import torch

from medusa_lite.cli import build_parser
from medusa_lite.commands import benchmark, calibrate, distill, microbench
from medusa_lite.dtypes import AUTO, DTYPE_CHOICES, DTYPES, SHORT_NAMES, DtypeError, dtype_name, parse_dtype
from medusa_lite.errors import MedusaError
from medusa_lite.training.config import config_from_dict
from medusa_lite.training.errors import TrainingConfigError


@pytest.mark.parametrize("short, full", sorted(SHORT_NAMES.items()))
def test_short_and_full_names_mean_the_same_dtype(short, full):
    assert parse_dtype(short) is parse_dtype(full) is DTYPES[full]
    assert dtype_name(parse_dtype(short)) == full


def test_auto_leaves_the_choice_to_the_device():
    assert parse_dtype(AUTO) is None


def test_an_unknown_name_is_a_clear_error():
    with pytest.raises(DtypeError, match="unknown dtype 'float64'.*bf16") as error:
        parse_dtype("float64")
    assert isinstance(error.value, MedusaError)


@pytest.mark.parametrize(
    "parser",
    [build_parser(), benchmark.build_parser(), calibrate.build_parser()],
    ids=["generate", "benchmark", "calibrate"],
)
def test_commands_accept_every_spelling(parser):
    for name in DTYPE_CHOICES:
        assert parser.parse_args(["--dtype", name]).dtype == name


def test_commands_without_auto_accept_every_explicit_spelling():
    for parser in (distill.build_parser(), microbench.build_parser()):
        assert parser.parse_args(["--dtype", "bf16"]).dtype == "bf16"
        assert parser.parse_args(["--dtype", "bfloat16"]).dtype == "bfloat16"
        with pytest.raises(SystemExit):
            parser.parse_args(["--dtype", AUTO])


def test_training_config_takes_the_same_vocabulary():
    base = {"model": "m", "data": "d.jsonl"}
    assert config_from_dict({**base, "dtype": "bf16"}).dtype == "bf16"
    assert config_from_dict({**base, "dtype": "float32"}).dtype == "float32"
    with pytest.raises(TrainingConfigError, match="dtype must be one of"):
        config_from_dict({**base, "dtype": "float64"})


def test_dtype_name_is_torchs_own():
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(torch.float32) == "float32"
