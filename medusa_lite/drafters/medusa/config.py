"""The config of Medusa heads: their shape, the model they were trained for, and what training found."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from medusa_lite.artifacts.base import ArtifactConfig
from medusa_lite.errors import HeadsConfigError, HeadsFileError, TreeError
from medusa_lite.trees.tree import validate_paths
from medusa_lite.values import as_integer, as_real, describe

# How errors name what a folder or repo was meant to hold.
HEADS_WHAT = "Medusa heads"


@dataclass
class MedusaConfig(ArtifactConfig):
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

    config_what: ClassVar[str] = "Medusa heads"

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

    @classmethod
    def from_dict(cls, values: dict) -> MedusaConfig:
        """Build a config from a dict, rejecting keys it does not know (typos are errors) and lacking required ones."""
        values = cls.known_values(values)
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
