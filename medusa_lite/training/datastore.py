"""The datastore ``generate`` looks up guesses in, built from head-training data
(:mod:`medusa_lite.proposers.datastore`).

It reads the config's data files exactly as training does (same tokenizer, chat template,
max_length and held-out split) and keeps the assistant tokens of each *training* sequence, one
document per answer: the held-out split stays unseen, so replays on it measure the datastore on
answers it does not hold.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoTokenizer

from medusa_lite.proposers.datastore import Datastore
from medusa_lite.training.config import DEFAULT_MODEL_KEYWORD, TrainConfig
from medusa_lite.training.data import DataStats, Sample, load_training_data


def answer_tokens(samples: list[Sample]) -> list:
    """The training-target (assistant) tokens of each sequence."""
    return [sample.input_ids[sample.loss_mask.bool()] for sample in samples]


def tokenizer_and_vocab_size(model: str):
    """The target's tokenizer and vocabulary size, without loading its weights."""
    if model == DEFAULT_MODEL_KEYWORD:
        from medusa_lite.artifacts.default_model import (
            ensure_default_model,  # lazy: converts the GGUF file on first use
        )

        model = str(ensure_default_model())
    return AutoTokenizer.from_pretrained(model), AutoConfig.from_pretrained(model).get_text_config().vocab_size


def datastore_from_training_data(config: TrainConfig) -> tuple[Datastore, DataStats]:
    """The datastore of the training split's answers, and the statistics of the data read."""
    tokenizer, vocab_size = tokenizer_and_vocab_size(config.model)
    data = load_training_data(
        config.data, tokenizer, max_length=config.max_length, eval_fraction=config.eval_fraction, seed=config.seed
    )
    return Datastore.from_documents(answer_tokens(data.train), vocab_size=vocab_size), data.stats
