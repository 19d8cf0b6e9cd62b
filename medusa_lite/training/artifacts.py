"""Load what ``train_heads.py`` wrote: ``<out>/heads`` and, in Medusa-2 mode, ``<out>/adapter``.

Medusa-2 heads were trained on the *adapted* model's hidden states, so they must run on the
adapted model: :func:`load_trained` applies the LoRA adapter to the base model and (by default)
merges it into the weights, so the result is a plain transformers model that tree verification
handles like any other. The decoding is then exact with respect to the adapted model.
"""

from __future__ import annotations

import os
from pathlib import Path

from medusa_lite.extras import require_extra
from medusa_lite.heads import MedusaHeads
from medusa_lite.model import MedusaModel
from medusa_lite.training.errors import TrainingConfigError

HEADS_DIR = "heads"
ADAPTER_DIR = "adapter"


def load_trained(output_dir: str | os.PathLike, base_model, *, merge: bool = True) -> MedusaModel:
    """``MedusaModel`` from a training output folder and the base model it was trained on.

    With an ``adapter`` folder (Medusa-2), the adapter is applied to ``base_model`` (modified in
    place) and, with ``merge=True``, merged into its weights.
    """
    output_dir = Path(output_dir)
    heads_dir = output_dir / HEADS_DIR
    if not heads_dir.is_dir():
        raise TrainingConfigError(f"{output_dir} holds no {HEADS_DIR}/ folder: not a finished training run")
    heads = MedusaHeads.from_pretrained(heads_dir)
    adapter_dir = output_dir / ADAPTER_DIR
    model = base_model
    if adapter_dir.is_dir():
        require_extra("peft", "Loading a LoRA adapter (Medusa-2)")
        from peft import PeftModel

        model = PeftModel.from_pretrained(base_model, str(adapter_dir))
        model = model.merge_and_unload() if merge else model
    return MedusaModel(model.eval(), heads)
