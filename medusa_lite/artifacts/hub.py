"""Publish a Medusa artifact on the Hugging Face Hub, whole, in one commit.

``push_heads_to_hub`` uploads every file ``medusa_lite.load`` reads (the layout in
:mod:`medusa_lite.artifacts.files`: the heads' ``config.json`` and ``model.safetensors``, and where the
folder has them ``tree.json``, ``datastore.safetensors`` and a Medusa-2 ``adapter/``), each
checked to load first, plus a ``README.md`` model card: for Medusa heads built by
:func:`medusa_lite.artifacts.card.model_card` from those files, for a sequential drafter or Hydra-style heads
(the ``kind`` their config.json records) their own card. A drafter's ``tree.json`` is the policy that
sizes its trees (a dynamic tree); drafters carry no adapter.

The upload goes through ``huggingface_hub`` (``HfApi.create_repo`` + ``HfApi.create_commit``),
so ``HF_TOKEN`` / ``hf auth login`` and ``HF_ENDPOINT`` work as everywhere in the ecosystem.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi

from medusa_lite.artifacts.base import CONFIG_NAME, WEIGHTS_NAME
from medusa_lite.artifacts.custom_generate import custom_generate_files
from medusa_lite.artifacts.files import ADAPTER_FILES, CARD_NAME, TREE_FILE_NAME, artifact_files, find_adapter
from medusa_lite.artifacts.loading import read_artifact, read_tree_file
from medusa_lite.artifacts.resolve import resolve_source
from medusa_lite.drafters.hydra.heads import HydraHeads
from medusa_lite.drafters.medusa.card import model_card
from medusa_lite.drafters.medusa.config import HEADS_WHAT
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.registry import artifact_classes
from medusa_lite.drafters.sequential.drafter import SequentialDrafter
from medusa_lite.errors import HeadsFileError
from medusa_lite.proposers.datastore import DATASTORE_FILE_NAME, Datastore
from medusa_lite.trees.dynamic_tree import DynamicTree


def push_heads_to_hub(
    heads_or_dir: MedusaHeads | SequentialDrafter | HydraHeads | str | os.PathLike,
    repo_id: str,
    *,
    token: str | bool | None = None,
    private: bool = False,
    commit_message: str = "Upload Medusa heads",
    revision: str | None = None,
    endpoint: str | None = None,
) -> str:
    """Upload an artifact (:class:`MedusaHeads`, a sequential drafter, Hydra-style heads, or a folder as training
    writes it) and a card, in one commit.

    Creates the repo if needed (``exist_ok``) and the branch ``revision`` if given. A folder must
    hold ``config.json`` and ``model.safetensors`` that load strictly; its ``tree.json``,
    ``datastore.safetensors`` and ``adapter/`` are uploaded with them when present, each checked
    first (heads that were trained with an adapter are refused without it), and a freshly
    generated ``README.md`` and ``custom_generate/`` naming ``repo_id`` (:mod:`medusa_lite.artifacts.custom_generate`;
    not for heads trained with an adapter, which ``custom_generate`` would have to merge into the
    caller's model) with them; other files in the folder are left alone.
    ``endpoint`` defaults to ``HF_ENDPOINT`` / https://huggingface.co. Returns the commit URL.
    """
    api = HfApi(endpoint=endpoint, token=token)
    with tempfile.TemporaryDirectory(prefix="medusa-heads-") as tmp:
        if isinstance(heads_or_dir, artifact_classes()):
            folder = Path(tmp)
            heads_or_dir.save_pretrained(folder)
            module = heads_or_dir
        elif isinstance(heads_or_dir, (str, os.PathLike)):
            folder = Path(heads_or_dir)
            module = _check_heads_folder(folder)
        else:
            raise TypeError(
                "push_heads_to_hub expects MedusaHeads, a SequentialDrafter, HydraHeads or a heads folder path, got "
                f"{type(heads_or_dir).__name__}"
            )
        names = [name for name in artifact_files(folder) if name != CARD_NAME]
        check_no_links(folder, names)  # only the folder's own files leave the machine
        described = _checked_contents(folder, names, module)  # refuses a bad file before anything is uploaded

        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in names]
        card = (
            model_card(module.config, repo_id=repo_id, **described)
            if isinstance(module, MedusaHeads)
            else str(module.generate_model_card())
        ).encode("utf-8")
        operations.append(CommitOperationAdd(path_in_repo=CARD_NAME, path_or_fileobj=card))
        if not getattr(module.config, "backbone_adapter", False):  # it would merge an adapter into the caller's model
            for name, text in custom_generate_files(repo_id).items():  # generate(custom_generate=repo_id)
                operations.append(CommitOperationAdd(path_in_repo=name, path_or_fileobj=text.encode("utf-8")))
        commit = api.create_commit(repo_id, operations, commit_message=commit_message, revision=revision)
    return commit.commit_url


def check_no_links(folder: Path, names: list[str]) -> None:
    """Refuse to upload a file reached through a symbolic link (to a file or a folder such as ``adapter/``): a link
    can point anywhere on the machine, and push uploads only what the artifact folder itself holds."""
    for name in names:
        parts = Path(name).parts
        for depth in range(1, len(parts) + 1):
            path = folder.joinpath(*parts[:depth])
            if path.is_symlink():
                raise HeadsFileError(
                    f"cannot push {folder}: {'/'.join(parts[:depth])} is a symbolic link (to {os.readlink(path)}); "
                    "push uploads only files inside the artifact folder: copy the file in instead of linking it"
                )


def _checked_contents(folder: Path, names: list[str], module: MedusaHeads | SequentialDrafter | HydraHeads) -> dict:
    """Check that the artifact's optional files load; their contents as :func:`model_card` describes them."""
    config = module.config
    if isinstance(module, MedusaHeads):
        find_adapter(resolve_source(folder, HEADS_WHAT), config)  # refuses an adapter needed, incomplete or beside
    elif any(name in names for name in ADAPTER_FILES):
        raise HeadsFileError(f"cannot push {folder}: a {module.artifact_what} folder carries no adapter/")
    datastore = (
        Datastore.load(folder / DATASTORE_FILE_NAME, config.vocab_size) if DATASTORE_FILE_NAME in names else None
    )
    tree = None
    if TREE_FILE_NAME in names:
        policy = read_tree_file(folder / TREE_FILE_NAME)
        if isinstance(module, MedusaHeads):
            policy.check_fits(config.num_heads)
        elif not isinstance(policy, DynamicTree):
            raise HeadsFileError(
                f"cannot push {folder}: a {module.artifact_what} grows its own trees; its {TREE_FILE_NAME} must be a "
                "dynamic tree (the budget and price of its rows), not static paths"
            )
        tree = json.loads((folder / TREE_FILE_NAME).read_text(encoding="utf-8"))
    adapter = (
        json.loads((folder / ADAPTER_FILES[0]).read_text(encoding="utf-8")) if ADAPTER_FILES[0] in names else None
    )
    return {"datastore": datastore, "adapter": adapter, "tree": tree}


# -- folder check ----------------------------------------------------------------------------


def _check_heads_folder(folder: Path) -> MedusaHeads | SequentialDrafter | HydraHeads:
    """The artifact a folder holds (by its kind); refuse to push one that would not load strictly."""
    if not folder.exists():
        raise HeadsFileError(
            f"cannot push {folder}: no such folder (expected a Medusa heads folder holding {CONFIG_NAME} and "
            f"{WEIGHTS_NAME})"
        )
    if not folder.is_dir():
        raise HeadsFileError(
            f"cannot push {folder}: it is a file; pass the heads folder holding {CONFIG_NAME} and {WEIGHTS_NAME}"
        )
    missing = [name for name in (CONFIG_NAME, WEIGHTS_NAME) if not (folder / name).is_file()]
    if missing:
        raise HeadsFileError(
            f"cannot push {folder}: missing {' and '.join(missing)}; a Medusa heads folder holds {CONFIG_NAME} and "
            f"{WEIGHTS_NAME} (write one with MedusaHeads.save_pretrained)"
        )
    try:
        return read_artifact(resolve_source(folder, HEADS_WHAT))  # strict: config and weights must agree
    except HeadsFileError as error:
        raise HeadsFileError(f"cannot push {folder}: {error}") from error
