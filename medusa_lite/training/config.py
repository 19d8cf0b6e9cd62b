"""The training config: one dataclass, loaded from YAML, overridable from the command line.

Unknown keys are errors (a typo must not silently fall back to a default). Values are coerced
to the declared type, so ``learning_rate: 1e-3`` (a string to PyYAML) and ``--epochs 3`` both
work. Nested sections (``lora``, ``wandb``) are dataclasses too and are checked the same way;
override one of their keys with a dotted name: ``--lora.r 16``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from medusa_lite.drafters.registry import kind_named, kind_names
from medusa_lite.dtypes import DTYPE_CHOICES
from medusa_lite.training.errors import TrainingConfigError

GIGABYTE = 1e9  # bytes: the unit of max_cache_gb and of every size training reports
DEFAULT_HEAD_DECAY = 0.8
DEFAULT_MODEL_KEYWORD = "default"
DATA_FORMATS = ("auto", "chat", "text")
MIXED_PRECISIONS = ("no", "bf16", "fp16")
LR_SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


@dataclass
class LoraSettings:
    """Medusa-2 mode: a peft LoRA on the backbone, trained jointly with the heads."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    # weight of KL(frozen original || adapted) on the next-token distribution of response tokens
    distill_weight: float = 1.0


@dataclass
class WandbSettings:
    """Log to Weights & Biases. ``WANDB_MODE=offline`` works with no key or network."""

    project: str = ""
    entity: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class TrainConfig:
    # -- what to train on
    model: str = DEFAULT_MODEL_KEYWORD  # a local folder, a Hub id, or "default" (SmolLM2-135M-Instruct)
    # one or more files (a YAML list, or comma-separated on the command line), pooled:
    # .jsonl/.json (ShareGPT "conversations" or "messages", or "text") or .txt
    data: list[str] = field(default_factory=list)
    data_format: str = "auto"  # auto | chat | text
    output_dir: str = "runs/heads"
    # the target's dtype; auto: as stored (bf16 for "default"), in float32 on CPUs without AMX or AVX512-BF16
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    # autocast of the trained module's forward (accelerate's mixed_precision): None = what
    # `accelerate launch --mixed_precision` / ACCELERATE_MIXED_PRECISION says (default "no")
    mixed_precision: str | None = None
    # -- heads
    # What to train, a kind's name in medusa_lite.drafters.registry: Medusa heads (each guesses one depth from the
    # target's hidden state), "sequential" (one decoder layer drafting depth d from its own depth d-1) or "hydra"
    # (head k also reads the k tokens drafted on its path).
    drafter: str = "medusa_heads"
    num_heads: int = 4  # Medusa heads; for the sequential drafter, the depths training unrolls
    num_layers: int = 1
    use_base_lm_head: bool = True
    head_loss_weights: list[float] | None = None  # default: DEFAULT_HEAD_DECAY ** k for head k
    distill_weight: float = 0.0  # weight of KL(target's shifted distribution || head)
    # sequential drafter only: weight of the regression of its output features on the target's
    # (EAGLE-1's feature loss, training/drafter_objective.py)
    feature_weight: float = 0.0
    # sequential drafter only: the target's hidden states depth 1 reads, as indices into its
    # hidden_states (0: embeddings, i: after decoder layer i); None: the final hidden state alone.
    # EAGLE-3 reads a low, a middle and a high layer (e.g. [2, 15, 27] of SmolLM2-135M's 30)
    feature_layers: list[int] | None = None
    # heads guess among the D most frequent response tokens of the training split only (None: all
    # V tokens): the projection costs D/V as much; decoding stays exact (see training/draft_vocab.py)
    draft_vocab_size: int | None = None
    # heads also read the embedding of the token after the hidden state (the tree's root at
    # decoding time, already chosen by the target): see MedusaConfig.next_token_input
    next_token_input: bool = False
    # -- data
    max_length: int = 512
    eval_fraction: float = 0.05
    # -- optimisation
    batch_size: int = 4  # sequences per process per step
    epochs: int = 1
    max_steps: int = 0  # > 0 overrides epochs
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    lr_scheduler: str = "cosine"
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    seed: int = 0
    loss_chunk_positions: int = 1024  # bounds the [positions, heads, vocab] logits held at once
    # -- evaluation and logging
    topk: int = 5
    log_every: int = 10
    eval_every: int = 0  # 0: evaluate only at the end
    wandb: WandbSettings | None = None
    # -- hidden-state cache (fast path for weak hardware)
    precompute_hidden: bool = False
    hidden_cache_dir: str | None = None  # default: <output_dir>/hidden_cache
    max_cache_gb: float = 20.0
    # -- checkpoints
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    overwrite_output_dir: bool = False
    # -- Medusa-2
    lora: LoraSettings | None = None
    # -- fault injection for tests (never set in real configs)
    debug_nan_at_step: int = 0  # make the loss NaN at this (1-based) step
    debug_step_sleep_s: float = 0.0  # sleep after every step (to kill a run mid-way in tests)

    def loss_weights(self) -> list[float]:
        if self.head_loss_weights is not None:
            return list(self.head_loss_weights)
        return [DEFAULT_HEAD_DECAY**k for k in range(1, self.num_heads + 1)]

    def cache_dir(self) -> Path:
        return Path(self.hidden_cache_dir) if self.hidden_cache_dir else Path(self.output_dir) / "hidden_cache"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# -- loading ------------------------------------------------------------------------------------


def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> TrainConfig:
    """Read a YAML config (or start from defaults when ``path`` is None) and apply overrides."""
    values: dict = {}
    if path is not None:
        values = read_yaml(Path(path))
    for key, value in parse_overrides(overrides).items():
        set_dotted(values, key, value)
    return config_from_dict(values, source=str(path) if path else "command line")


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise TrainingConfigError(f"config file {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise TrainingConfigError(f"config file {path} is not valid YAML: {error}") from error
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise TrainingConfigError(
            f"config file {path} must hold a mapping of keys to values, got {type(values).__name__}"
        )
    return values


def parse_overrides(tokens: typing.Sequence[str]) -> dict:
    """``["--lr", "1e-3", "--lora.r=4"]`` -> ``{"lr": "1e-3", "lora.r": "4"}`` (values still text)."""
    overrides: dict = {}
    tokens = list(tokens)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or len(token) <= 2:
            raise TrainingConfigError(f"expected an override like --key value, got {token!r}")
        key = token[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(tokens):
            value = tokens[i + 1]
            i += 2
        else:
            raise TrainingConfigError(f"override --{key} has no value")
        overrides[key.replace("-", "_")] = value
    return overrides


def set_dotted(values: dict, key: str, value) -> None:
    parts = key.split(".")
    target = values
    for part in parts[:-1]:
        existing = target.get(part)
        if existing is None:
            existing = target[part] = {}
        if not isinstance(existing, dict):
            raise TrainingConfigError(f"override --{key}: {part!r} is not a section")
        target = existing
    target[parts[-1]] = value


def config_from_dict(values: dict, source: str = "config") -> TrainConfig:
    config = build_dataclass(TrainConfig, values, prefix="", source=source)
    validate(config)
    return config


def build_dataclass(cls, values: dict, prefix: str, source: str):
    if not isinstance(values, dict):
        raise TrainingConfigError(f"{source}: {prefix.rstrip('.') or 'config'} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        names = ", ".join(prefix + key for key in unknown)
        raise TrainingConfigError(
            f"{source}: unknown config key(s) {names}; known keys: {', '.join(prefix + k for k in known)}"
        )
    kwargs = {key: coerce(value, hints[key], prefix + key, source) for key, value in values.items()}
    return cls(**kwargs)


def coerce(value, annotation, key: str, source: str):
    """Convert ``value`` to the type ``annotation`` declares, or raise naming the key."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], key, source)
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, str):  # --lora "{r: 8, alpha: 16}" on the command line
            value = yaml.safe_load(value)
        return build_dataclass(annotation, value, prefix=key + ".", source=source)
    if origin is list:
        if isinstance(value, str):
            value = (
                yaml.safe_load(value)
                if value.strip().startswith("[")
                else [v.strip() for v in value.split(",") if v.strip()]
            )
        if not isinstance(value, (list, tuple)):
            raise TrainingConfigError(f"{source}: {key} must be a list, got {value!r}")
        return [coerce(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value)]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in TRUE_WORDS + FALSE_WORDS:
            return value.lower() in TRUE_WORDS
        raise TrainingConfigError(f"{source}: {key} must be true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise TrainingConfigError(f"{source}: {key} must be an integer, got {value!r}")
        try:
            number = float(value) if isinstance(value, str) else value
            if float(number) != int(number):
                raise ValueError
            return int(number)
        except (TypeError, ValueError):
            raise TrainingConfigError(f"{source}: {key} must be an integer, got {value!r}") from None
    if annotation is float:
        if isinstance(value, bool):
            raise TrainingConfigError(f"{source}: {key} must be a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise TrainingConfigError(f"{source}: {key} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise TrainingConfigError(f"{source}: {key} must be a finite number, got {value!r}")
        return number
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise TrainingConfigError(f"{source}: {key} must be text, got {value!r}")
        return str(value)
    raise TrainingConfigError(f"{source}: {key} has an unsupported type {annotation}")  # pragma: no cover


def validate(config: TrainConfig) -> None:
    """Reject values and combinations that cannot work, before anything is loaded."""

    def require(condition: bool, message: str) -> None:
        if not condition:
            raise TrainingConfigError(message)

    require(bool(config.data), "config: data is required (one or more .jsonl/.json conversation files or .txt files)")
    require(
        config.data_format in DATA_FORMATS,
        f"config: data_format must be one of {DATA_FORMATS}, got {config.data_format!r}",
    )
    require(config.dtype in DTYPE_CHOICES, f"config: dtype must be one of {DTYPE_CHOICES}, got {config.dtype!r}")
    require(
        config.mixed_precision in (None, *MIXED_PRECISIONS),
        f"config: mixed_precision must be one of {MIXED_PRECISIONS} or null, got {config.mixed_precision!r}",
    )
    kind = kind_named(config.drafter)
    trainable = tuple(name for name in kind_names() if kind_named(name).training is not None)
    require(
        kind is not None and kind.training is not None,
        f"config: drafter must be one of {trainable}, got {config.drafter!r}"
        + ("" if kind is None else " (a kind medusa-lite decodes but does not train)"),
    )
    training = kind.training
    if not training.trains_target:
        require(
            config.lora is None,
            f"config: drafter: {config.drafter} cannot be combined with lora (Medusa-2 trains Medusa heads with "
            "the backbone)",
        )
        require(
            config.use_base_lm_head,
            f"config: drafter: {config.drafter} always reuses the target's lm_head; set use_base_lm_head: true",
        )
    require(
        config.lr_scheduler in LR_SCHEDULERS,
        f"config: lr_scheduler must be one of {LR_SCHEDULERS}, got {config.lr_scheduler!r}",
    )
    for name in (
        "num_heads",
        "batch_size",
        "max_length",
        "topk",
        "log_every",
        "checkpoint_every",
        "keep_checkpoints",
        "loss_chunk_positions",
    ):
        require(getattr(config, name) >= 1, f"config: {name} must be >= 1, got {getattr(config, name)}")
    for name in ("num_layers", "epochs", "max_steps", "warmup_steps", "eval_every", "debug_nan_at_step"):
        require(getattr(config, name) >= 0, f"config: {name} must be >= 0, got {getattr(config, name)}")
    require(config.epochs > 0 or config.max_steps > 0, "config: set epochs >= 1 or max_steps >= 1")
    require(
        config.max_length >= 3,
        f"config: max_length must be >= 3 (a head needs a token 2 positions ahead), got {config.max_length}",
    )
    require(0.0 <= config.eval_fraction < 1.0, f"config: eval_fraction must be in [0, 1), got {config.eval_fraction}")
    require(config.learning_rate > 0, f"config: learning_rate must be > 0, got {config.learning_rate}")
    require(config.distill_weight >= 0, f"config: distill_weight must be >= 0, got {config.distill_weight}")
    require(config.feature_weight >= 0, f"config: feature_weight must be >= 0, got {config.feature_weight}")
    require(
        config.feature_weight == 0 or training.unrolled,
        "config: feature_weight regresses a sequential drafter's output features; Medusa heads have none to "
        "regress (set drafter: sequential, or feature_weight: 0)",
    )
    if config.feature_layers is not None:
        layers = config.feature_layers
        require(
            training.unrolled,
            "config: feature_layers chooses the target layers a sequential drafter reads; Medusa heads read the "
            "final hidden state (set drafter: sequential, or remove feature_layers)",
        )
        require(
            isinstance(layers, list)
            and layers
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)
            and len(set(layers)) == len(layers),
            f"config: feature_layers must be a non-empty list of distinct layer indices >= 0, got {layers!r}",
        )
    require(config.max_cache_gb > 0, f"config: max_cache_gb must be > 0, got {config.max_cache_gb}")
    require(config.weight_decay >= 0, f"config: weight_decay must be >= 0, got {config.weight_decay}")
    require(
        config.max_grad_norm >= 0,
        f"config: max_grad_norm must be >= 0 (0 turns clipping off), got {config.max_grad_norm}",
    )
    require(
        config.debug_step_sleep_s >= 0, f"config: debug_step_sleep_s must be >= 0, got {config.debug_step_sleep_s}"
    )
    if config.draft_vocab_size is not None:
        require(
            config.draft_vocab_size >= 1,
            f"config: draft_vocab_size must be >= 1 (or null for the full vocabulary), got {config.draft_vocab_size}",
        )
        require(
            config.use_base_lm_head,
            "config: draft_vocab_size needs use_base_lm_head: true (a draft vocabulary selects rows of the "
            "base model's lm_head)",
        )
    weights = config.loss_weights()
    require(
        len(weights) == config.num_heads,
        f"config: head_loss_weights has {len(weights)} entries but num_heads is {config.num_heads}",
    )
    require(
        all(w >= 0 for w in weights) and sum(weights) > 0,
        f"config: head_loss_weights must be >= 0 and not all zero, got {weights}",
    )
    if config.lora is not None:
        require(config.lora.r >= 1, f"config: lora.r must be >= 1, got {config.lora.r}")
        require(config.lora.alpha >= 1, f"config: lora.alpha must be >= 1, got {config.lora.alpha}")
        require(0 <= config.lora.dropout < 1, f"config: lora.dropout must be in [0, 1), got {config.lora.dropout}")
        require(
            config.lora.distill_weight >= 0,
            f"config: lora.distill_weight must be >= 0, got {config.lora.distill_weight}",
        )
        require(
            bool(config.lora.target_modules),
            "config: lora.target_modules must name at least one module (e.g. [q_proj, v_proj])",
        )
        require(
            not config.precompute_hidden,
            "config: precompute_hidden cannot be combined with lora (Medusa-2 trains the backbone, so its "
            "hidden states change every step)",
        )
    if config.wandb is not None:
        require(bool(config.wandb.project), "config: wandb.project is required when a wandb section is given")
