"""Load what ``train_heads.py`` wrote: the artifact ``<out>/heads`` (with ``adapter/`` in Medusa-2 mode).

Medusa-2 heads were trained on the *adapted* model's hidden states, so they must run on the
adapted model: :func:`load_trained` merges the LoRA adapter into the base model's weights, so
the result is a plain transformers model that tree verification handles like any other; the
decoding is then exact with respect to the adapted model. ``medusa_lite.load(model,
heads="<out>/heads")`` does the same from a model path; the layout is :mod:`medusa_lite.artifacts.files`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from medusa_lite.artifacts.files import adapt_target
from medusa_lite.artifacts.resolve import resolve_source
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.drafters.medusa.config import HEADS_WHAT
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.training.checks import HEADS_DIR
from medusa_lite.training.errors import TrainingConfigError


def load_trained(output_dir: str | os.PathLike, base_model) -> MedusaModel:
    """``MedusaModel`` from a training output folder and the base model it was trained on.

    With an adapter in ``<out>/heads/adapter`` (Medusa-2), the adapter is merged into
    ``base_model`` (modified in place).
    """
    heads_dir = Path(output_dir) / HEADS_DIR
    if not heads_dir.is_dir():
        raise TrainingConfigError(f"{output_dir} holds no {HEADS_DIR}/ folder: not a finished training run")
    source = resolve_source(heads_dir, HEADS_WHAT)
    heads = MedusaHeads.from_source(source)
    return MedusaModel(adapt_target(base_model, source, heads.config).eval(), heads)
