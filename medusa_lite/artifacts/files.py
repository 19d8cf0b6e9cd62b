"""A Medusa artifact: every file ``load()`` needs, in one folder or Hub repo, loaded and pushed whole.

The layout (a training run writes it as ``<output_dir>/heads/``; a Hub repo holds it at its root)::

    config.json                  MedusaConfig: the heads' shape, their base model, the training summary
    model.safetensors            the heads' weights
    adapter/                     Medusa-2 only: the PEFT (LoRA) adapter of the base model, trained with the heads
        adapter_config.json
        adapter_model.safetensors
    tree.json                    optional: the tree calibrated for some hardware (infer/calibrate_tree.py)
    datastore.safetensors        optional: the base model's answers for datastore lookup
    README.md                    the model card (medusa_lite.artifacts.card)

Heads trained with an adapter read the *adapted* model's hidden states, so they only run on it:
:func:`find_adapter` returns the artifact's adapter, and raises when the config says the heads
need one (``MedusaConfig.backbone_adapter``) that is not there; :func:`apply_adapter` merges it
into the base model's weights, which leaves a plain transformers model (tree attention and the
packed fast path apply to it unchanged), and refuses an adapter that does not fit the model.
Decoding is then exact with respect to the adapted model.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from medusa_lite.artifacts.base import CONFIG_NAME, WEIGHTS_NAME
from medusa_lite.artifacts.resolve import ArtifactSource
from medusa_lite.drafters.medusa.config import MedusaConfig
from medusa_lite.errors import AdapterError
from medusa_lite.extras import require_extra
from medusa_lite.proposers.datastore import DATASTORE_FILE_NAME

TREE_FILE_NAME = "tree.json"
CARD_NAME = "README.md"
ADAPTER_DIR = "adapter"
# peft's own file names (peft.utils.constants), spelled here so that reading the layout needs no peft.
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
# How many lines of peft's error (one per mismatched tensor) an AdapterError quotes.
MESSAGE_LINES = 3
ADAPTER_FILES = (f"{ADAPTER_DIR}/{ADAPTER_CONFIG_NAME}", f"{ADAPTER_DIR}/{ADAPTER_WEIGHTS_NAME}")
# Every file of the layout but the card (generated when pushing), required ones first.
REQUIRED_FILES = (CONFIG_NAME, WEIGHTS_NAME)
OPTIONAL_FILES = (TREE_FILE_NAME, DATASTORE_FILE_NAME, *ADAPTER_FILES)


def artifact_files(folder: str | os.PathLike) -> list[str]:
    """The layout's files present in a local artifact folder (paths relative to it, ``/``-separated)."""
    folder = Path(folder)
    return [name for name in (*REQUIRED_FILES, *OPTIONAL_FILES) if (folder / name).is_file()]


def find_adapter(source: ArtifactSource, config: MedusaConfig) -> Path | None:
    """The local folder of the artifact's adapter (downloaded for a Hub repo), or None when it has none."""
    config_path = source.file(ADAPTER_FILES[0], required=config.backbone_adapter and not source.is_local)
    if config_path is None:
        check_no_adapter_expected(source, config)
        return None
    weights_path = source.file(ADAPTER_FILES[1], required=not source.is_local)
    if weights_path is None or weights_path.parent != config_path.parent:
        raise AdapterError(
            f"{config_path.parent} has {ADAPTER_CONFIG_NAME} but no {ADAPTER_WEIGHTS_NAME}: the adapter is "
            "incomplete; "
            "copy the whole adapter/ folder the training run wrote"
        )
    return config_path.parent


def check_no_adapter_expected(source: ArtifactSource, config: MedusaConfig) -> None:
    """Refuse heads that need an adapter the artifact lacks (a silent fallback would decode the wrong model)."""
    where = source.folder if source.is_local else f"Hub repo {source.name!r}"
    if config.backbone_adapter:
        raise AdapterError(
            f"these Medusa heads were trained with a LoRA adapter on the base model (config backbone_adapter=true), "
            f"but {where} has no {ADAPTER_DIR}/{ADAPTER_CONFIG_NAME}: copy the training run's {ADAPTER_DIR}/ folder "
            "into the heads folder"
        )
    sibling = source.folder.parent / ADAPTER_DIR if source.is_local else None
    if sibling is not None and (sibling / ADAPTER_CONFIG_NAME).is_file():
        raise AdapterError(
            f"{sibling} is a Medusa-2 adapter beside the heads folder {source.folder}, which has none: the heads "
            "would decode with the unadapted model. Move it into the heads folder: "
            f"mv {sibling} {source.folder / ADAPTER_DIR}"
        )


def apply_adapter(base_model: nn.Module, adapter_dir: str | os.PathLike) -> nn.Module:
    """``base_model`` with the PEFT adapter in ``adapter_dir`` merged into its weights (modified in place).

    Every tensor of the adapter must load: a missing, unexpected or misshapen one, or target
    modules the model lacks, raise :class:`AdapterError` (peft itself would only warn).
    """
    require_extra("peft", f"Applying a Medusa artifact's LoRA adapter ({adapter_dir})")
    from peft import PeftConfig, PeftModel

    name = getattr(base_model.config, "_name_or_path", None) or type(base_model).__name__
    try:
        config = PeftConfig.from_pretrained(str(adapter_dir))
        adapted = PeftModel(base_model, config)
        result = adapted.load_adapter(str(adapter_dir), adapted.active_adapter)
    except (ValueError, RuntimeError, KeyError, TypeError, OSError) as error:
        detail = " ".join(line.strip() for line in str(error).splitlines()[:MESSAGE_LINES])
        raise AdapterError(f"the adapter in {adapter_dir} does not fit the model {name}: {detail}") from error
    if result.missing_keys or result.unexpected_keys:
        problems = [
            f"{label} {keys[:4]}{'...' if len(keys) > 4 else ''}"
            for label, keys in (
                ("missing tensors", result.missing_keys),
                ("unexpected tensors", result.unexpected_keys),
            )
            if keys
        ]
        raise AdapterError(f"the adapter in {adapter_dir} does not fit the model {name}: " + "; ".join(problems))
    if not hasattr(adapted, "merge_and_unload"):
        raise AdapterError(
            f"the adapter in {adapter_dir} ({config.peft_type}) cannot be merged into the model's weights"
        )
    return adapted.merge_and_unload()


def adapt_target(base_model: nn.Module, source: ArtifactSource | None, config: MedusaConfig) -> nn.Module:
    """The target the heads run on: ``base_model``, with the artifact's adapter merged in when it has one.

    ``source`` None (heads given as a module, not as an artifact) is refused for heads that need an adapter.
    """
    if source is None:
        if config.backbone_adapter:
            raise AdapterError(
                "these Medusa heads were trained with a LoRA adapter on the base model "
                "(config backbone_adapter=true), "
                "which a heads module does not carry: pass the artifact's folder or Hub repo as heads= so that its "
                f"{ADAPTER_DIR}/ is applied"
            )
        return base_model
    adapter_dir = find_adapter(source, config)
    return base_model if adapter_dir is None else apply_adapter(base_model, adapter_dir).eval()
