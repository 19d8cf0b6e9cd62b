"""The arguments of ``generate``, checked by meaning in one place.

Each check raises a ``GenerationInputError`` naming the argument, what it got and what to pass
instead, and returns the value in the one form the decoding loop uses (a Python int, a 1-D long
tensor...). Numbers follow :mod:`medusa_lite.values`: numpy scalars and 0-d tensors are accepted
where a number is meant, booleans never are. The prompt may be what a tokenizer returns: a tensor,
a ``BatchEncoding`` or dict with ``input_ids`` (and an ``attention_mask``, which may mark left padding
only: a batch of prompts, :mod:`medusa_lite.decoding.batch`), a numpy array or a list of ids.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from medusa_lite.decoding.model import MedusaModel, text_config
from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.datastore import Datastore
from medusa_lite.values import as_integer, describe

TOKENIZE_FIRST = "tokenize the text first, e.g. tokenizer(text, return_tensors='pt')"


# -- the model ---------------------------------------------------------------------------------
def check_model(model: object) -> None:
    """A :class:`MedusaModel` whose weights are real tensors (not on the ``meta`` device)."""
    if not isinstance(model, MedusaModel):
        raise GenerationInputError(
            f"model must be a medusa_lite.MedusaModel (from medusa_lite.load() or MedusaModel(base_model, heads)), "
            f"got {type(model).__name__}"
        )
    meta = next((name for name, parameter in model.named_parameters() if parameter.is_meta), None)
    if meta is not None:
        raise GenerationInputError(
            f"the model's weights are on the meta device (e.g. {meta}): they were never loaded; load the model with "
            "real weights (from_pretrained without a 'meta' device map, or to_empty() then load_state_dict())"
        )


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode (dropout off) inside the block; every submodule's own mode restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def checked_model_in_eval_mode(generate_function):
    """Decorate ``generate(model, ...)``: the model is checked, then in eval mode for the call only.

    Greedy decoding is exact only if the target is deterministic, so it must not depend on the
    caller remembering ``.eval()``; the caller's training mode comes back afterwards.
    """

    @functools.wraps(generate_function)
    def generate_in_eval_mode(model, *args, **kwargs):
        check_model(model)
        with eval_mode(model):
            return generate_function(model, *args, **kwargs)

    return generate_in_eval_mode


# -- the prompt --------------------------------------------------------------------------------
def integer_tensor(values: object, name: str) -> torch.Tensor:
    """A tensor, numpy array or (nested) list of integer ids as an integer tensor; anything else refused."""
    if isinstance(values, (str, bytes)):
        raise GenerationInputError(f"{name} must be token ids, got text {describe(values)}: {TOKENIZE_FIRST}")
    if not isinstance(values, (torch.Tensor, np.ndarray, list, tuple)):
        raise GenerationInputError(
            f"{name} must be token ids (a torch.Tensor, a tokenizer's BatchEncoding, a numpy array or a list), "
            f"got {type(values).__name__}"
        )
    try:
        tensor = torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:
        raise GenerationInputError(
            f"{name} must be a rectangular array of integer token ids; it could not be read ({error})"
        ) from error
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise GenerationInputError(f"{name} must hold integer token ids, got dtype {tensor.dtype}")
    if tensor.is_meta:
        raise GenerationInputError(f"{name} is on the meta device: it holds no values")
    return tensor


def split_encoding(input_ids: object, attention_mask: object) -> tuple[object, object]:
    """(ids, mask) from a tokenizer's ``BatchEncoding`` or dict, or as given."""
    if not isinstance(input_ids, Mapping):
        return input_ids, attention_mask
    if "input_ids" not in input_ids:
        raise GenerationInputError(
            f"input_ids is a mapping without an 'input_ids' entry (keys {sorted(map(str, input_ids))}); "
            "pass a tokenizer's output or the token ids themselves"
        )
    if attention_mask is not None and input_ids.get("attention_mask") is not None:
        raise GenerationInputError(
            "attention_mask is given twice: in the input_ids mapping and as an argument; pass one"
        )
    return input_ids["input_ids"], attention_mask if attention_mask is not None else input_ids.get("attention_mask")


# The most sequences one call decodes side by side, a bound on one call's memory (a cache row per sequence, every
# row's draft in one forward); a data set is decoded in slices. Speed by batch size: docs/results.md, "Batches".
MAX_BATCH_SIZE = 64


def left_padding(attention_mask: object, shape: torch.Size) -> torch.Tensor:
    """Each row's padding [B] in ``attention_mask`` (None: none), which must mark left padding only (as
    ``model.generate`` wants for a decoder-only model) and leave every row a token."""
    rows = shape[0] if len(shape) == 2 else 1
    if attention_mask is None:
        return torch.zeros(rows, dtype=torch.long)
    mask = integer_tensor(attention_mask, "attention_mask")
    if mask.shape != shape:
        raise GenerationInputError(
            f"attention_mask has shape {tuple(mask.shape)} but input_ids has shape {tuple(shape)}; they must match"
        )
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise GenerationInputError("attention_mask must hold only 1 (a token) or 0 (padding)")
    mask = mask.reshape(rows, -1).cpu().long()
    padding = (mask.cumsum(dim=1) == 0).sum(dim=1)
    empty = torch.nonzero(padding == mask.shape[1]).flatten().tolist()
    if empty:
        raise GenerationInputError(
            f"attention_mask row(s) {empty} are all padding: every row needs at least one token of its own"
        )
    holes = torch.nonzero(mask.sum(dim=1) != mask.shape[1] - padding).flatten().tolist()
    if holes:
        raise GenerationInputError(
            f"attention_mask row(s) {holes} have padding after their first token: medusa-lite takes left-padded "
            "batches, as model.generate does for a decoder-only model; tokenize with padding_side='left'"
        )
    return padding


def check_rectangular(input_ids: object) -> None:
    """Per-row lists of ids must all have one length (a tokenizer pads them)."""
    if isinstance(input_ids, (list, tuple)) and input_ids and all(isinstance(row, (list, tuple)) for row in input_ids):
        lengths = sorted({len(row) for row in input_ids})
        if len(lengths) > 1:
            raise GenerationInputError(
                f"input_ids rows have different lengths {lengths}: pad them on the left and pass the attention_mask "
                "(tokenizer(texts, padding=True, padding_side='left', return_tensors='pt'))"
            )


def as_prompts(
    input_ids: object, device: torch.device, attention_mask: object = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the prompts as a [B, L] long tensor on ``device``, each row's left padding [B]), from whatever form a
    tokenizer gives them in: one sequence [L] or [1, L], or a left-padded batch with its ``attention_mask``."""
    input_ids, attention_mask = split_encoding(input_ids, attention_mask)
    check_rectangular(input_ids)
    ids = integer_tensor(input_ids, "input_ids")
    if ids.dim() not in (1, 2):
        raise GenerationInputError(f"input_ids must have shape [batch, length] or [length], got {tuple(ids.shape)}")
    if ids.shape[-1] == 0 or (ids.dim() == 2 and ids.shape[0] == 0):
        raise GenerationInputError("the prompt is empty: give at least one token (e.g. the BOS token)")
    padding = left_padding(attention_mask, ids.shape)
    ids = ids.reshape(-1, ids.shape[-1])
    if ids.shape[0] > MAX_BATCH_SIZE:
        raise GenerationInputError(
            f"batch size {ids.shape[0]} is over the limit of {MAX_BATCH_SIZE} sequences per call: call generate on "
            f"slices of at most {MAX_BATCH_SIZE} rows"
        )
    return ids.to(device=device, dtype=torch.long), padding.to(device)


def check_token_ids(prompt: torch.Tensor, vocab_size: int) -> None:
    low, high = int(prompt.min()), int(prompt.max())
    if low < 0 or high >= vocab_size:
        raise GenerationInputError(
            f"prompt holds token id {low if low < 0 else high}, outside the model's vocabulary [0, {vocab_size})"
        )


# -- counts ------------------------------------------------------------------------------------
def count(value: object, name: str, meaning: str = "") -> int:
    """An integer >= 0 (a Python int, numpy integer or 0-d integer tensor), as a Python int."""
    number = as_integer(value)
    if number is None or number < 0:
        raise GenerationInputError(f"{name} must be an integer >= 0{meaning}, got {describe(value)}")
    return number


def check_max_new_tokens(max_new_tokens: object) -> int:
    return count(max_new_tokens, "max_new_tokens")


def check_lookup_tokens(lookup_tokens: object, name: str = "lookup_tokens") -> int:
    return count(lookup_tokens, name, " (0 turns that lookup off)")


# -- the datastore -----------------------------------------------------------------------------
def as_datastore(datastore: object, model: MedusaModel) -> Datastore | None:
    """``True``: the model's own datastore (if any); ``False``/``None``: none; else a :class:`Datastore` that fits."""
    if datastore is True:
        datastore = model.datastore
    if datastore is None or datastore is False:
        return None
    if not isinstance(datastore, Datastore):
        raise GenerationInputError(
            f"datastore must be True (the model's own), False or None (no datastore), or a medusa_lite.Datastore; "
            f"got {type(datastore).__name__} (to read a file: medusa_lite.Datastore.load(path))"
        )
    datastore.check_fits(model.vocab_size)
    return datastore


# -- limits ------------------------------------------------------------------------------------
def context_limit(model: MedusaModel) -> int | None:
    """The most positions the target takes: its max positions (a sliding window is no limit: ``decoding/windows``)."""
    limit = getattr(text_config(model.base_model), "max_position_embeddings", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def check_context(prompt_len: int, max_new_tokens: int, limit: int | None) -> None:
    """Raise before decoding when prompt + new tokens cannot fit; the tree is pruned to fit at run time."""
    if limit is not None and prompt_len + max_new_tokens > limit:
        raise GenerationInputError(
            f"prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} exceeds the model's context of "
            f"{limit} positions; shorten the prompt or lower max_new_tokens to at most {max(limit - prompt_len, 0)}"
        )


# -- token ids ---------------------------------------------------------------------------------
def is_id_sequence(value: object) -> bool:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim == 1
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def token_ids(value: object, name: str, vocab_size: int) -> list[int]:
    """One token id or a sequence of them (list, tuple, 1-D tensor or array), each in [0, vocab_size)."""
    single = as_integer(value)
    if single is not None:
        ids = [single]
    elif is_id_sequence(value):
        ids = [as_integer(item) for item in value]
        bad = next((item for item, number in zip(value, ids) if number is None), None)
        if any(number is None for number in ids):
            raise GenerationInputError(f"{name} must hold integer token ids, found {describe(bad)}")
    else:
        hint = f"; convert tokens with tokenizer.convert_tokens_to_ids({value!r})" if isinstance(value, str) else ""
        raise GenerationInputError(f"{name} must be a token id or a list of token ids, got {describe(value)}{hint}")
    outside = next((number for number in ids if not 0 <= number < vocab_size), None)
    if outside is not None:
        raise GenerationInputError(
            f"{name} holds token id {outside}, outside the model's vocabulary [0, {vocab_size})"
        )
    return ids


def eos_ids(eos_token_id: int | Sequence[int] | None, model: MedusaModel) -> torch.Tensor:
    """EOS ids as a tensor; None means the model's generation_config EOS (as ``model.generate`` does)."""
    if eos_token_id is None:
        generation_config = getattr(model.base_model, "generation_config", None)
        default = getattr(generation_config, "eos_token_id", None)
        ids = [] if default is None else [int(i) for i in ([default] if isinstance(default, int) else default)]
    else:
        ids = token_ids(eos_token_id, "eos_token_id", model.vocab_size)
    return torch.tensor(ids, dtype=torch.long, device=model.device)


def pad_id(pad_token_id: object, model: MedusaModel, eos: torch.Tensor) -> int | None:
    """The id a batch's shorter rows are filled with: ``pad_token_id``, else the model's generation_config
    pad token, else its first EOS id (as ``model.generate`` falls back), else None."""
    if pad_token_id is not None:
        if is_id_sequence(pad_token_id):
            raise GenerationInputError(f"pad_token_id must be one token id, got {describe(pad_token_id)}")
        return token_ids(pad_token_id, "pad_token_id", model.vocab_size)[0]
    default = getattr(getattr(model.base_model, "generation_config", None), "pad_token_id", None)
    if isinstance(default, int):
        return default
    return int(eos[0]) if eos.numel() else None


def check_batch_outputs(streamer: object, output_scores: bool, output_logits: bool) -> None:
    """What a batch cannot return yet, refused by name (a streamer takes one sequence, as in transformers)."""
    given = [
        name
        for name, value in (("streamer", streamer), ("output_scores", output_scores), ("output_logits", output_logits))
        if value
    ]
    if given:
        raise GenerationInputError(
            f"{' and '.join(given)} work with one prompt only, not with a batch: decode the prompts one at a time "
            "for them"
        )


# -- sampling randomness and streaming ---------------------------------------------------------
def check_generator(generator: object, device: torch.device) -> None:
    """None, or a ``torch.Generator`` on the model's device type (``torch.multinomial`` needs it there)."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise GenerationInputError(
            f"generator must be a torch.Generator (e.g. torch.Generator(device=model.device).manual_seed(0)) or None, "
            f"got {type(generator).__name__}"
        )
    if generator.device.type != torch.device(device).type:
        raise GenerationInputError(
            f"generator is on {generator.device} but the model is on {device}; "
            "create it there: torch.Generator(device=model.device)"
        )


def check_streamer(streamer: object) -> None:
    """None, or an object with ``put(token_ids)`` and ``end()`` (as ``transformers.TextStreamer``)."""
    if streamer is None:
        return
    missing = [method for method in ("put", "end") if not callable(getattr(streamer, method, None))]
    if missing:
        raise GenerationInputError(
            f"streamer must have put(token_ids) and end() methods (e.g. transformers.TextStreamer); "
            f"{type(streamer).__name__} lacks {' and '.join(missing)}"
        )
