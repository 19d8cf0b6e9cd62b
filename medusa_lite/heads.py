"""Medusa heads: K small residual blocks on the target's last hidden state.

Head k (k = 1..K) guesses the token k+1 positions ahead of the hidden state it reads: with the
hidden state at position n (whose base logits predict token n+1), head k predicts token n+1+k.

The heads are an adapter in the PEFT sense: a config dataclass naming its base model, a module,
and a Hub folder of ``config.json`` + ``model.safetensors`` (saved and pushed with
``PyTorchModelHubMixin``, loaded strictly with clear errors by :meth:`MedusaHeads.from_pretrained`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import PyTorchModelHubMixin, hf_hub_download
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from medusa_lite.errors import HeadsFileError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass
class MedusaConfig:
    """Shape of a set of Medusa heads and the model they were trained for.

    ``use_base_lm_head=True`` (the default) makes every head reuse the target's frozen output
    projection: a head then only maps hidden state to hidden state, its weights are
    ``num_layers * (hidden_size**2 + hidden_size)`` numbers, and one read of the lm_head serves
    all heads. ``False`` gives each head its own ``vocab_size x hidden_size`` projection
    (Medusa's original layout), initialised from the base lm_head by :class:`MedusaModel`.
    """

    num_heads: int
    hidden_size: int
    vocab_size: int
    num_layers: int = 1
    use_base_lm_head: bool = True
    base_model_name_or_path: str | None = None
    # Free-form facts about how the heads were made (data, accuracies); never read by the code.
    training_summary: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("num_heads", "hidden_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MedusaConfig.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.num_layers, int) or self.num_layers < 0:
            raise ValueError(f"MedusaConfig.num_layers must be an integer >= 0, got {self.num_layers!r}")

    @classmethod
    def from_dict(cls, values: dict) -> "MedusaConfig":
        """Build a config from a dict, rejecting keys it does not know (typos are errors)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise HeadsFileError(f"unknown key(s) in Medusa heads config: {unknown}; known keys: {sorted(known)}")
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.name in ("num_heads", "hidden_size", "vocab_size") and f.name not in values)
        if missing:
            raise HeadsFileError(f"Medusa heads config lacks required key(s) {missing}")
        return cls(**values)


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
        self.lm_head = None if config.use_base_lm_head else nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.blocks(hidden)


class MedusaHeads(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="medusa-lite",
    tags=["medusa-lite", "speculative-decoding", "medusa"],
    repo_url="https://github.com/medusa-lite/medusa-lite",
):
    """K independent heads (each its own module: no weight sharing between heads)."""

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(MedusaHead(config) for _ in range(config.num_heads))

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Hidden states [..., H] -> the first ``num_heads`` (default all) heads' hidden states [..., k, H]."""
        return torch.stack([head(hidden) for head in self.heads[:num_heads]], dim=-2)

    def project(self, head_hidden: torch.Tensor, base_lm_head: nn.Module) -> torch.Tensor:
        """Per-head hidden states [..., k, H] (the first k heads) -> per-head logits [..., k, V]."""
        if self.config.use_base_lm_head:
            return base_lm_head(head_hidden)
        return torch.stack([self.heads[k].lm_head(head_hidden[..., k, :]) for k in range(head_hidden.shape[-2])], dim=-2)

    def init_lm_heads_from(self, base_lm_head: nn.Module) -> None:
        """Copy the base model's output projection into each head's own lm_head (if any)."""
        if self.config.use_base_lm_head:
            return
        with torch.no_grad():
            for head in self.heads:
                head.lm_head.weight.copy_(base_lm_head.weight)

    def generate_model_card(self, *args, **kwargs):
        """The README written by ``save_pretrained``/``push_to_hub``: our card, from the config."""
        from huggingface_hub import ModelCard

        from medusa_lite.hub import model_card

        return ModelCard(model_card(self.config))

    # -- loading -------------------------------------------------------------------------------
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
    ) -> "MedusaHeads":
        """Load heads from a local folder or a Hub repo, strictly, with errors that name the file."""
        if unused:
            raise TypeError(f"MedusaHeads.from_pretrained got unexpected arguments {sorted(unused)}")
        source = str(pretrained_model_name_or_path)

        def fetch(filename: str) -> Path:
            if os.path.isdir(source):
                path = Path(source) / filename
                if not path.is_file():
                    raise HeadsFileError(f"{path} is missing: a Medusa heads folder holds {CONFIG_NAME} and {WEIGHTS_NAME}")
                return path
            if os.path.exists(source):
                raise HeadsFileError(f"{source} is a file; pass the heads folder (holding {CONFIG_NAME} and {WEIGHTS_NAME})")
            return Path(hf_hub_download(source, filename, revision=revision, cache_dir=cache_dir, token=token, local_files_only=local_files_only))

        config = read_config(fetch(CONFIG_NAME))
        heads = cls(config)
        heads.load_state_dict(read_weights(fetch(WEIGHTS_NAME), map_location), strict=True)
        return heads

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Strict by default; a mismatch names the missing/unexpected/misshapen tensors."""
        if strict:
            check_state_dict(self.state_dict(), state_dict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


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
        raise HeadsFileError(f"{path} could not be read as safetensors ({error}); the file is truncated or corrupt") from error


def check_state_dict(expected: dict[str, torch.Tensor], given: dict[str, torch.Tensor]) -> None:
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    misshapen = [f"{k}: expected {tuple(expected[k].shape)}, found {tuple(given[k].shape)}" for k in sorted(set(expected) & set(given)) if expected[k].shape != given[k].shape]
    if missing or unexpected or misshapen:
        details = []
        if missing:
            details.append(f"missing tensors {missing[:6]}{'...' if len(missing) > 6 else ''}")
        if unexpected:
            details.append(f"unexpected tensors {unexpected[:6]}{'...' if len(unexpected) > 6 else ''}")
        if misshapen:
            details.append("wrong shapes " + "; ".join(misshapen[:4]))
        raise HeadsFileError("Medusa heads weights do not match their config: " + ", ".join(details))
