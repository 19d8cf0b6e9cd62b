"""What every drafter artifact shares: its two files, strict loading, and its draft vocabulary.

An artifact (Medusa heads, Hydra-style heads, a sequential drafter) is a folder or Hub repo of
``config.json`` + ``model.safetensors``. :class:`StrictArtifact` loads one strictly whatever its
kind: the kind's config class reads ``config.json``, every tensor must match the config's module,
and a draft vocabulary (``draft_token_ids``: the D token ids the drafter guesses among) must be
distinct in-range ids. Errors name the file and what is wrong with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import ClassVar

import torch
from huggingface_hub import PyTorchModelHubMixin
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from medusa_lite.artifacts.card import LIBRARY_NAME, PROJECT_URL
from medusa_lite.artifacts.resolve import ArtifactSource, resolve_source
from medusa_lite.errors import DraftVocabError, HeadsFileError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# An artifact's buffer of draft-vocabulary token ids (saved in model.safetensors with the weights).
DRAFT_IDS_NAME = "draft_token_ids"


class StrictArtifact:
    """Loading shared by medusa-lite's artifact classes: ``from_pretrained`` resolves a local folder
    or Hub repo (:func:`~medusa_lite.artifacts.resolve.resolve_source`: a path that does not exist,
    or a repo that cannot be had, raises :class:`~medusa_lite.errors.ArtifactNotFoundError` saying
    which) and :meth:`from_source` reads it; ``load_state_dict`` is strict by default and names
    every mismatching tensor and a corrupt draft vocabulary. A kind names itself in errors
    (``artifact_what``) and the class of its config (``config_class``, read by ``from_dict``).
    Listed before ``PyTorchModelHubMixin`` so its ``from_pretrained`` is the one that runs."""

    artifact_what: ClassVar[str]
    config_class: ClassVar[type]

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        local_files_only: bool = False,
        map_location: str | torch.device = "cpu",
        **unused,
    ):
        """Load from a local folder or a Hub repo, strictly, with errors that name the file."""
        if unused:
            raise TypeError(f"{cls.__name__}.from_pretrained got unexpected arguments {sorted(unused)}")
        source = resolve_source(
            pretrained_model_name_or_path,
            cls.artifact_what,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            local_files_only=local_files_only,
        )
        return cls.from_source(source, map_location=map_location)

    @classmethod
    def from_source(cls, source: ArtifactSource, *, map_location: str | torch.device = "cpu"):
        """Load from a resolved :class:`~medusa_lite.artifacts.resolve.ArtifactSource`, strictly."""
        artifact = cls(read_config(heads_file(source, CONFIG_NAME), cls.config_class, cls.artifact_what))
        weights = heads_file(source, WEIGHTS_NAME)
        try:
            artifact.load_state_dict(read_weights(weights, map_location), strict=True)
        except HeadsFileError as error:
            raise HeadsFileError(naming_file(weights, error)) from error
        return artifact

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Strict by default; a mismatch names the missing/unexpected/misshapen tensors."""
        if strict:
            check_state_dict(self.state_dict(), state_dict, self.artifact_what)
        token_ids = state_dict.get(DRAFT_IDS_NAME)
        if token_ids is not None and self.draft_token_ids is not None:
            problem = draft_ids_problem(token_ids, self.config.vocab_size)
            if problem is not None:
                raise HeadsFileError(
                    f"{self.artifact_what} weights: {DRAFT_IDS_NAME} {problem}; the file is corrupt or was written "
                    "for another vocabulary"
                )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def set_draft_vocab(self, token_ids: torch.Tensor | list[int]) -> None:
        """Set the D token ids guessed among (D = ``config.draft_vocab_size``)."""
        if self.draft_token_ids is None:
            raise DraftVocabError(
                f"{self.artifact_what}: no draft vocabulary (config.draft_vocab_size is None); build with "
                "draft_vocab_size set"
            )
        token_ids = torch.as_tensor(token_ids)
        problem = draft_ids_problem(token_ids, self.config.vocab_size)
        if problem is None and token_ids.numel() != self.config.draft_vocab_size:
            problem = f"holds {token_ids.numel()} ids but config.draft_vocab_size is {self.config.draft_vocab_size}"
        if problem is not None:
            raise DraftVocabError(f"draft vocabulary {problem}")
        with torch.no_grad():
            self.draft_token_ids.copy_(token_ids.to(self.draft_token_ids.device))

    def guess_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Indices into this artifact's logits -> full-vocabulary token ids."""
        return indices if self.draft_token_ids is None else self.draft_token_ids[indices]


class ArtifactConfig:
    """What every kind's config dataclass shares: the count of tokens it guesses among, and reading it from a
    ``config.json`` dict that may hold only keys it knows (``config_what`` names it in the error)."""

    config_what: ClassVar[str]

    @property
    def guess_vocab_size(self) -> int:
        """How many distinct tokens it can guess: the draft vocabulary's size, or the vocabulary's."""
        return self.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    @classmethod
    def known_values(cls, values: dict) -> dict:
        """``values``, when it holds only keys the config knows (typos are errors)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise HeadsFileError(f"unknown key(s) in {cls.config_what} config: {unknown}; known keys: {sorted(known)}")
        return values

    @classmethod
    def from_dict(cls, values: dict):
        """Build a config from a dict, rejecting keys it does not know."""
        return cls(**cls.known_values(values))


def check_draft_vocab_size(owner: str, draft, vocab_size: int) -> None:
    """``draft`` (a config's ``draft_vocab_size``) None or an integer in [1, ``vocab_size``]; else a ValueError."""
    if draft is not None and (not isinstance(draft, int) or isinstance(draft, bool) or not 1 <= draft <= vocab_size):
        raise ValueError(
            f"{owner}.draft_vocab_size must be None or an integer in [1, vocab_size = {vocab_size}], got {draft!r}"
        )


class HubArtifact(StrictArtifact, nn.Module, PyTorchModelHubMixin, library_name=LIBRARY_NAME, repo_url=PROJECT_URL):
    """The base of every kind's module: strict loading (:class:`StrictArtifact`), a torch module, and
    ``save_pretrained`` / ``push_to_hub`` / a model card from ``huggingface_hub``'s mixin. A kind subclasses it
    with its own ``tags=[...]``."""


def heads_file(source: ArtifactSource, file_name: str) -> Path:
    """One of the two files of an artifact; a local folder lacking it is a broken folder."""
    path = source.file(file_name, required=not source.is_local)
    if path is None:
        raise HeadsFileError(
            f"{source.folder / file_name} is missing: a {source.what} folder holds {CONFIG_NAME} and {WEIGHTS_NAME}"
        )
    return path


def naming_file(path: Path, error: Exception) -> str:
    """``error``'s message, led by the file it is about unless it names it already."""
    return str(error) if str(path) in str(error) else f"{path}: {error}"


def read_config_values(path: Path) -> dict:
    """The JSON object a ``config.json`` holds."""
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HeadsFileError(f"{path} is not valid JSON ({error}); the folder is corrupt") from error
    if not isinstance(values, dict):
        raise HeadsFileError(f"{path} must hold a JSON object, got {type(values).__name__}")
    return values


def read_config(path: Path, config_class: type, what: str):
    """``config_class.from_dict`` of a ``config.json``; every problem a :class:`HeadsFileError` naming the file."""
    values = read_config_values(path)
    try:
        return config_class.from_dict(values)
    except HeadsFileError as error:
        raise HeadsFileError(f"{path}: {error}") from error
    except (TypeError, ValueError) as error:
        raise HeadsFileError(f"{path}: invalid {what} config: {error}") from error


def config_kind(path: Path) -> str | None:
    """The ``kind`` a config.json records (None for Medusa heads, whose configs predate kinds)."""
    return read_config_values(path).get("kind")


def read_weights(path: Path, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise HeadsFileError(
            f"{path} could not be read as safetensors ({error}); the file is truncated or corrupt"
        ) from error


def check_state_dict(expected: dict[str, torch.Tensor], given: dict[str, torch.Tensor], what: str) -> None:
    """Raise :class:`HeadsFileError` naming every missing, unexpected or misshapen tensor of ``what``'s weights."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    misshapen = [
        f"{k}: expected {tuple(expected[k].shape)}, found {tuple(given[k].shape)}"
        for k in sorted(set(expected) & set(given))
        if expected[k].shape != given[k].shape
    ]
    if missing or unexpected or misshapen:
        details = []
        if missing:
            details.append(f"missing tensors {missing[:6]}{'...' if len(missing) > 6 else ''}")
        if unexpected:
            details.append(f"unexpected tensors {unexpected[:6]}{'...' if len(unexpected) > 6 else ''}")
        if misshapen:
            details.append("wrong shapes " + "; ".join(misshapen[:4]))
        raise HeadsFileError(f"{what} weights do not match their config: " + ", ".join(details))


def draft_ids_problem(token_ids: torch.Tensor, vocab_size: int) -> str | None:
    """What is wrong with a draft vocabulary's token ids (integers, distinct, in [0, vocab_size)), or None."""
    if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex or token_ids.dtype == torch.bool:
        return f"must hold integer token ids, found dtype {token_ids.dtype}"
    if token_ids.dim() != 1 or token_ids.numel() == 0:
        return f"must be a non-empty 1-D list of token ids, found shape {tuple(token_ids.shape)}"
    low, high = int(token_ids.min()), int(token_ids.max())
    if low < 0 or high >= vocab_size:
        return f"holds token id {low if low < 0 else high}, outside the vocabulary [0, {vocab_size})"
    if torch.unique(token_ids).numel() != token_ids.numel():
        return (
            f"repeats token ids ({token_ids.numel() - torch.unique(token_ids).numel()} duplicate(s)); each id "
            "must appear once"
        )
    return None
