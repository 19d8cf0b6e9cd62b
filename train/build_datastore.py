"""Build the datastore ``generate`` looks up guesses in (medusa_lite.datastore) from head-training data.

    python train/build_datastore.py --config configs/smollm2_heads.yaml \\
        --out medusa_lite/assets/smollm2-135m-heads/datastore.safetensors

Reads the config's data files exactly as ``train/train_heads.py`` does (same tokenizer, chat
template, max_length and held-out split) and keeps the assistant tokens of each *training*
sequence, one document per answer: the held-out split stays unseen, so replays on it
(benchmarks/lookup_policy/) measure the datastore on answers it does not hold. Put the file
beside the heads: ``medusa_lite.load`` picks it up from there (a folder or a Hub repo).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from medusa_lite.datastore import Datastore
from medusa_lite.errors import MedusaError
from medusa_lite.training.config import DEFAULT_MODEL_KEYWORD, load_config
from medusa_lite.training.data import Sample, load_training_data

EXIT_USAGE = 2


def answer_tokens(samples: list[Sample]) -> list:
    """The training-target (assistant) tokens of each sequence."""
    return [sample.input_ids[sample.loss_mask.bool()] for sample in samples]


def tokenizer_and_vocab_size(model: str):
    """The target's tokenizer and vocabulary size, without loading its weights."""
    if model == DEFAULT_MODEL_KEYWORD:
        from medusa_lite.default_model import ensure_default_model  # lazy: converts the GGUF file on first use

        model = str(ensure_default_model())
    return AutoTokenizer.from_pretrained(model), AutoConfig.from_pretrained(model).get_text_config().vocab_size


def build(config_path: str, out: Path) -> Datastore:
    config = load_config(config_path, [])
    tokenizer, vocab_size = tokenizer_and_vocab_size(config.model)
    data = load_training_data(config.data, tokenizer, max_length=config.max_length, eval_fraction=config.eval_fraction, seed=config.seed)
    print(data.stats.describe())
    datastore = Datastore.from_documents(answer_tokens(data.train), vocab_size=vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    datastore.save(out)
    print(f"wrote {out}: {datastore.num_tokens} tokens of {datastore.num_documents} answers ({out.stat().st_size / 1e6:.1f} MB)")
    return datastore


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the heads' training config (configs/*.yaml)")
    parser.add_argument("--out", required=True, type=Path, help="where to write datastore.safetensors")
    args = parser.parse_args(argv)
    build(args.config, args.out)


if __name__ == "__main__":
    try:
        main()
    except MedusaError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
