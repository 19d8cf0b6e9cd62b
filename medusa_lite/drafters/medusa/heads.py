"""Medusa heads: K small residual blocks on the target's last hidden state.

Head k (k = 1..K) guesses the token k+1 positions ahead of the hidden state it reads: with the
hidden state at position n (whose base logits predict token n+1), head k predicts token n+1+k.
Heads with ``next_token_input`` also read token n+1 itself (the tree's root, which the target has
chosen before the heads guess): see :class:`MedusaConfig`.

The heads are an adapter in the PEFT sense: a config dataclass naming its base model, a module,
and a Hub folder of ``config.json`` + ``model.safetensors`` (saved and pushed with
``PyTorchModelHubMixin``, loaded strictly with clear errors by :meth:`MedusaHeads.from_pretrained`).

A *draft vocabulary* (``MedusaConfig.draft_vocab_size = D``, as EAGLE-3's draft vocab) lets the
heads guess among D frequent tokens only instead of all V: their projection then multiplies by
D rows of the base lm_head instead of V (on SmolLM2-135M, 8192 of 49,152 rows), which makes
training ~6x cheaper and decoding steps cheaper too. Decoding stays exact (the target verifies
every guess); a token outside the draft vocabulary can simply never be guessed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from huggingface_hub import ModelCard, PyTorchModelHubMixin
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from medusa_lite.artifacts.card import LIBRARY_NAME, PROJECT_URL, TAGS, model_card
from medusa_lite.artifacts.resolve import ArtifactSource, resolve_source
from medusa_lite.cpu.kernels import pack_for_row_gemm
from medusa_lite.cpu.prepack import packed_copy_applies, row_gemm_linear, weight_signature
from medusa_lite.errors import DraftVocabError, HeadsConfigError, HeadsFileError, TreeError
from medusa_lite.trees.tree import validate_paths
from medusa_lite.values import as_integer, as_real, describe

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# The heads' buffer of draft-vocabulary token ids (saved in model.safetensors with the weights).
DRAFT_IDS_NAME = "draft_token_ids"
# How errors name what a folder or repo was meant to hold.
HEADS_WHAT = "Medusa heads"


@dataclass
class MedusaConfig:
    """Shape of a set of Medusa heads and the model they were trained for.

    ``use_base_lm_head=True`` (the default) makes every head reuse the target's frozen output
    projection: a head then only maps hidden state to hidden state, its weights are
    ``num_layers * (hidden_size**2 + hidden_size)`` numbers, and one read of the lm_head serves
    all heads. ``False`` gives each head its own ``vocab_size x hidden_size`` projection
    (Medusa's original layout), initialised from the base lm_head by :class:`MedusaModel`.

    ``draft_vocab_size = D`` (None: the full vocabulary) restricts the heads' guesses to D token
    ids (stored in the heads' ``draft_token_ids`` buffer), projecting with those D rows of the base
    lm_head only. It needs ``use_base_lm_head=True``: the rows it selects are the base model's.
    """

    num_heads: int
    hidden_size: int
    vocab_size: int
    num_layers: int = 1
    use_base_lm_head: bool = True
    draft_vocab_size: int | None = None
    next_token_input: bool = False
    base_model_name_or_path: str | None = None
    # Trained on the base model with a LoRA adapter (Medusa-2): they run only on the adapted model, and the
    # artifact holds the adapter in adapter/ (medusa_lite.artifacts.files).
    backbone_adapter: bool = False
    # Facts about how the heads were made (data, accuracies). Free-form, except the entries the
    # code reads (check_training_summary): "tree" and "topk_accuracy" shape the default tree, and
    # "top1_accuracy" the model card.
    training_summary: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("num_heads", "hidden_size", "vocab_size"):
            setattr(self, name, config_integer(self, name, minimum=1))
        self.num_layers = config_integer(self, "num_layers", minimum=0)
        for name in ("use_base_lm_head", "next_token_input", "backbone_adapter"):
            if not isinstance(getattr(self, name), bool):
                raise HeadsConfigError(
                    f"MedusaConfig.{name} must be true or false, got {describe(getattr(self, name))}"
                )
        if self.draft_vocab_size is not None:
            self.draft_vocab_size = config_integer(
                self, "draft_vocab_size", minimum=1, maximum=self.vocab_size, none="None (full vocabulary) or "
            )
            if not self.use_base_lm_head:
                raise HeadsConfigError(
                    "MedusaConfig.draft_vocab_size needs use_base_lm_head=True: a draft vocabulary selects "
                    "rows of the base "
                    "model's lm_head, but these heads have their own lm_head (use_base_lm_head=False)"
                )
        if self.base_model_name_or_path is not None and not isinstance(self.base_model_name_or_path, str):
            raise HeadsConfigError(
                "MedusaConfig.base_model_name_or_path must be text or None, "
                f"got {describe(self.base_model_name_or_path)}"
            )
        check_training_summary(self.training_summary, self.num_heads)

    @property
    def guess_vocab_size(self) -> int:
        """How many distinct tokens the heads can guess: the draft vocabulary's size, or the vocabulary's."""
        return self.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    @classmethod
    def from_dict(cls, values: dict) -> MedusaConfig:
        """Build a config from a dict, rejecting keys it does not know (typos are errors)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise HeadsFileError(f"unknown key(s) in Medusa heads config: {unknown}; known keys: {sorted(known)}")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.name in ("num_heads", "hidden_size", "vocab_size") and f.name not in values
        )
        if missing:
            raise HeadsFileError(f"Medusa heads config lacks required key(s) {missing}")
        return cls(**values)


def config_integer(config: MedusaConfig, name: str, minimum: int, maximum: int | None = None, none: str = "") -> int:
    """``config.<name>`` as a Python int in [minimum, maximum]; numpy and 0-d tensor integers too, booleans never."""
    value = getattr(config, name)
    number = as_integer(value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        if maximum is not None:
            kind = f"an integer in [{minimum}, vocab_size = {maximum}]"
        else:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise HeadsConfigError(f"MedusaConfig.{name} must be {none}{kind}, got {describe(value)}")
    return number


def accuracies_problem(values: object) -> str | None:
    """What is wrong with a list of accuracies (numbers in [0, 1]), or None."""
    if not isinstance(values, list) or not values:
        return f"must be a non-empty list of numbers in [0, 1], got {describe(values)}"
    for value in values:
        number = as_real(value)
        if number is None or not 0 <= number <= 1:
            return f"must hold numbers in [0, 1], found {describe(value)}"
    return None


def check_training_summary(summary: object, num_heads: int) -> None:
    """The ``training_summary`` entries the code reads, checked (the rest is free-form JSON).

    ``tree``: top-k rank paths no deeper than the heads; ``topk_accuracy``: per head (at most
    ``num_heads`` rows), per rank, the probability the guess is right; ``top1_accuracy``: per head.
    """
    if not isinstance(summary, dict):
        raise HeadsConfigError(f"MedusaConfig.training_summary must be a JSON object (dict), got {describe(summary)}")
    where = "MedusaConfig.training_summary"
    if summary.get("tree") is not None:
        try:
            paths = validate_paths(summary["tree"])
        except TreeError as error:
            raise HeadsConfigError(f"{where}['tree'] is not a tree of top-k rank paths: {error}") from error
        deepest = max((len(path) for path in paths), default=0)
        if deepest > num_heads:
            raise HeadsConfigError(
                f"{where}['tree'] reaches depth {deepest} but there are {num_heads} heads "
                "(a node at depth d needs head d)"
            )
    if summary.get("topk_accuracy") is not None:
        rows = summary["topk_accuracy"]
        if not isinstance(rows, list) or not rows or len(rows) > num_heads:
            raise HeadsConfigError(
                f"{where}['topk_accuracy'] must be a list of 1 to {num_heads} rows (one per head), "
                f"got {describe(rows)}"
            )
        for head, row in enumerate(rows, start=1):
            problem = accuracies_problem(row)
            if problem is not None:
                raise HeadsConfigError(f"{where}['topk_accuracy'] row {head} (head {head}) {problem}")
    if summary.get("top1_accuracy") is not None:
        problem = accuracies_problem(summary["top1_accuracy"])
        if problem is not None:
            raise HeadsConfigError(f"{where}['top1_accuracy'] {problem}")


class ResBlock(nn.Module):
    """x + SiLU(W x + b). W starts at zero, so a fresh block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHead(nn.Module):
    """One head: ``num_layers`` residual blocks, then its own lm_head if configured."""

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.blocks = nn.Sequential(*(ResBlock(config.hidden_size) for _ in range(config.num_layers)))
        self.lm_head = (
            None if config.use_base_lm_head else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.blocks(hidden)


def pass_through_fuse(hidden_size: int) -> nn.Linear:
    """Linear [hidden; next-token embedding] (2H) -> H that starts as the identity on the hidden half."""
    fuse = nn.Linear(2 * hidden_size, hidden_size)
    with torch.no_grad():
        fuse.weight.zero_()
        fuse.weight[:, :hidden_size].copy_(torch.eye(hidden_size))
        fuse.bias.zero_()
    return fuse


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


def draft_rows(base_lm_head: nn.Module, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The base lm_head's weight rows (and bias entries, if any) of ``token_ids``: a [D, H] copy."""
    weight = base_lm_head.weight.detach()
    token_ids = token_ids.to(weight.device)
    bias = getattr(base_lm_head, "bias", None)
    return weight[token_ids], None if bias is None else bias.detach()[token_ids]


class DraftLMHead(nn.Module):
    """The base lm_head restricted to a draft vocabulary, gathered once: logits [..., D].

    Its rows are derived data (a copy of D rows of the frozen base lm_head), so they live in
    non-persistent buffers: never saved, moved and cast with the module that owns them.
    :class:`~medusa_lite.decoding.model.MedusaModel` keeps one so that decoding does not gather D x H
    weights at every step.
    """

    def __init__(self, base_lm_head: nn.Module, token_ids: torch.Tensor):
        super().__init__()
        weight, bias = draft_rows(base_lm_head, token_ids)
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        # A copy for the row_gemm kernel (pack_for_few_rows): plain attributes, never saved or moved.
        self.packed_weight: torch.Tensor | None = None
        self.packed_from: tuple | None = None
        self.packed_rows = 0

    def pack_for_few_rows(self, rows: int, dtype: torch.dtype = torch.float32) -> None:
        """Multiply inputs of up to ``rows`` rows (a step's heads) through medusa_lite's row_gemm kernel.

        The heads' few rows then read the D x H weights once, at the kernel's speed: on a 2-core
        AMD EPYC PyTorch's float32 product of 4 rows by 8192 x 576 weights took ~3 ms a step.
        Float32 CPU weights only; the packed copy is used only while the weights are the very
        tensor, version, dtype and device it was packed from (else the usual path, as
        :class:`~medusa_lite.cpu.prepack.PrepackedLinear`). ``dtype`` bfloat16: a packed copy of half the
        bytes (:func:`~medusa_lite.cpu.kernels.pack_for_row_gemm`), for guesses that need not match float32's.
        """
        self.packed_weight = pack_for_row_gemm(self.weight, dtype=dtype)
        self.packed_from, self.packed_rows = weight_signature(self.weight), rows

    def packed_path_applies(self, hidden: torch.Tensor) -> bool:
        return self.packed_weight is not None and packed_copy_applies(
            self.weight, self.packed_from, hidden, 1, self.packed_rows
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_path_applies(hidden):
            return row_gemm_linear(hidden, self.packed_weight, self.weight.shape[0], self.bias)
        return F.linear(hidden, self.weight, self.bias)


def guess_logits(
    hidden: torch.Tensor, base_lm_head: nn.Module, draft_token_ids: torch.Tensor | None, what: str
) -> torch.Tensor:
    """Output features [..., H] of a drafter that reuses the target's lm_head -> logits [..., G].

    G: the draft vocabulary's size (``draft_token_ids``), else V. ``base_lm_head``: the target's
    output layer (the draft rows are then gathered for this call, as training does), or a
    :class:`DraftLMHead` gathered once from these ids (what decoding passes). ``what`` names the
    drafter in errors.
    """
    if isinstance(base_lm_head, DraftLMHead):
        if draft_token_ids is None or base_lm_head.weight.shape[0] != draft_token_ids.numel():
            size = None if draft_token_ids is None else draft_token_ids.numel()
            raise DraftVocabError(
                f"a DraftLMHead of {base_lm_head.weight.shape[0]} rows does not fit a {what} whose draft "
                f"vocabulary size is {size}"
            )
        return base_lm_head(hidden.to(base_lm_head.weight.dtype))
    if draft_token_ids is not None:
        weight, bias = draft_rows(base_lm_head, draft_token_ids)
        return F.linear(hidden.to(weight.dtype), weight, bias)
    return base_lm_head(hidden.to(base_lm_head.weight.dtype))


class StrictArtifact:
    """Loading shared by medusa-lite's artifact classes (the heads, the drafter): ``from_pretrained``
    resolves a local folder or Hub repo (:func:`~medusa_lite.artifacts.resolve.resolve_source`: a path that
    does not exist, or a repo that cannot be had, raises
    :class:`~medusa_lite.errors.ArtifactNotFoundError` saying which) and hands it to the class's
    ``from_source``; ``load_state_dict`` is strict by default and names every mismatching tensor and
    a corrupt draft vocabulary. ``artifact_what`` names the artifact in errors. Listed before
    ``PyTorchModelHubMixin`` so its ``from_pretrained`` is the one that runs."""

    artifact_what: ClassVar[str]

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


class MedusaHeads(
    StrictArtifact,
    nn.Module,
    PyTorchModelHubMixin,
    library_name=LIBRARY_NAME,
    tags=list(TAGS),
    repo_url=PROJECT_URL,
):
    """K independent heads (each its own module: no weight sharing between heads).

    With a draft vocabulary, ``draft_token_ids`` (a persistent LongTensor buffer [D], saved and
    strictly loaded with the weights) names the tokens the heads can guess: index i of the heads'
    logits is token ``draft_token_ids[i]``. Training stores them most frequent first (ties by id);
    any order of distinct in-range ids is valid. A fresh module holds the placeholder ids
    ``0..D-1`` until :meth:`set_draft_vocab` or loading replaces them. Without one it is None.
    """

    artifact_what: ClassVar[str] = HEADS_WHAT

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(MedusaHead(config) for _ in range(config.num_heads))
        self.next_token_fuse = pass_through_fuse(config.hidden_size) if config.next_token_input else None
        placeholder = None if config.draft_vocab_size is None else torch.arange(config.draft_vocab_size)
        self.register_buffer(DRAFT_IDS_NAME, placeholder, persistent=True)

    def set_draft_vocab(self, token_ids: torch.Tensor | list[int]) -> None:
        """Set the D token ids the heads guess among (D = ``config.draft_vocab_size``)."""
        if self.draft_token_ids is None:
            raise DraftVocabError(
                "these heads have no draft vocabulary (config.draft_vocab_size is None); build them with "
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

    def forward(
        self, hidden: torch.Tensor, num_heads: int | None = None, next_token_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hidden states [..., H] -> the first ``num_heads`` (default all) heads' hidden states [..., k, H].

        ``next_token_embeds`` [..., H]: the base model's input embeddings of the token following
        each hidden state; required by heads with ``config.next_token_input``, refused by others.
        """
        if self.next_token_fuse is not None:
            if next_token_embeds is None:
                raise ValueError("these heads read the next token (config.next_token_input): pass next_token_embeds")
            hidden = self.next_token_fuse(torch.cat([hidden, next_token_embeds.to(hidden.dtype)], dim=-1))
        elif next_token_embeds is not None:
            raise ValueError(
                "next_token_embeds given to heads that do not read the next token (config.next_token_input is false)"
            )
        return torch.stack([head(hidden) for head in self.heads[:num_heads]], dim=-2)

    def project(self, head_hidden: torch.Tensor, base_lm_head: nn.Module) -> torch.Tensor:
        """Per-head hidden states [..., k, H] (the first k heads) -> per-head logits [..., k, G].

        G is ``config.guess_vocab_size``: V, or D with a draft vocabulary (logit i is then token
        ``draft_token_ids[i]``). ``base_lm_head`` is the base model's output layer; with a draft
        vocabulary it may instead be a :class:`DraftLMHead` gathered once for these heads (what
        ``MedusaModel`` passes while decoding). Given the full layer, the draft rows are gathered
        for this call (cheap next to the projection; what training does, where the ids may change
        on resume).
        """
        if isinstance(base_lm_head, DraftLMHead):
            if self.draft_token_ids is None or base_lm_head.weight.shape[0] != self.config.draft_vocab_size:
                raise DraftVocabError(
                    f"a DraftLMHead of {base_lm_head.weight.shape[0]} rows was given to heads whose draft "
                    "vocabulary size is "
                    f"{self.config.draft_vocab_size}; pass the base model's lm_head or a DraftLMHead made "
                    "from these heads' ids"
                )
            return base_lm_head(head_hidden)
        if self.draft_token_ids is not None:
            return F.linear(head_hidden, *draft_rows(base_lm_head, self.draft_token_ids))
        if self.config.use_base_lm_head:
            return base_lm_head(head_hidden)
        return torch.stack(
            [self.heads[k].lm_head(head_hidden[..., k, :]) for k in range(head_hidden.shape[-2])], dim=-2
        )

    def init_lm_heads_from(self, base_lm_head: nn.Module) -> None:
        """Copy the base model's output projection into each head's own lm_head (if any)."""
        if self.config.use_base_lm_head:
            return
        with torch.no_grad():
            for head in self.heads:
                head.lm_head.weight.copy_(base_lm_head.weight)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        """The README written by ``save_pretrained``/``push_to_hub``: our card, from the config."""
        return ModelCard(model_card(self.config))

    # -- loading (from_pretrained, strict load_state_dict: StrictArtifact) ---------------------
    @classmethod
    def from_source(cls, source: ArtifactSource, *, map_location: str | torch.device = "cpu") -> MedusaHeads:
        """Load heads from a resolved :class:`~medusa_lite.artifacts.resolve.ArtifactSource` (strictly)."""
        config = read_config(heads_file(source, CONFIG_NAME))
        heads = cls(config)
        heads.load_state_dict(read_weights(heads_file(source, WEIGHTS_NAME), map_location), strict=True)
        return heads


def heads_file(source: ArtifactSource, file_name: str) -> Path:
    """One of the two files of heads (or a drafter); a local folder lacking it is a broken folder."""
    path = source.file(file_name, required=not source.is_local)
    if path is None:
        raise HeadsFileError(
            f"{source.folder / file_name} is missing: a {source.what} folder holds {CONFIG_NAME} and {WEIGHTS_NAME}"
        )
    return path


def read_config(path: Path) -> MedusaConfig:
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HeadsFileError(f"{path} is not valid JSON ({error}); the heads folder is corrupt") from error
    if not isinstance(values, dict):
        raise HeadsFileError(f"{path} must hold a JSON object, got {type(values).__name__}")
    try:
        return MedusaConfig.from_dict(values)
    except (TypeError, ValueError) as error:
        if isinstance(error, HeadsFileError):
            raise HeadsFileError(f"{path}: {error}") from error
        raise HeadsFileError(f"{path}: invalid Medusa heads config: {error}") from error


def read_weights(path: Path, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise HeadsFileError(
            f"{path} could not be read as safetensors ({error}); the file is truncated or corrupt"
        ) from error


def check_state_dict(
    expected: dict[str, torch.Tensor], given: dict[str, torch.Tensor], what: str = HEADS_WHAT
) -> None:
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
