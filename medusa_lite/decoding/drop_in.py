"""medusa-lite called the way ``model.generate`` is: :meth:`MedusaModel.generate` and ``custom_generate``.

Options come as ``model.generate`` takes them (``generation_config=``, keyword options, a tokenizer's
output as ``**inputs``) and are merged in its order: the call's keywords, then the call's
``generation_config``, then the target's own ``generation_config``, then transformers' defaults.
The result is what ``model.generate`` returns: the sequences tensor, or with
``return_dict_in_generate=True`` a ``GenerateDecoderOnlyOutput`` holding them. An option medusa-lite
cannot apply exactly (beams, several return sequences, attentions...) is refused by name,
never ignored: :data:`HANDLED_OPTIONS` are the ones it applies.
"""

from __future__ import annotations

import math

from transformers import GenerationConfig
from transformers.generation.utils import GenerateDecoderOnlyOutput

from medusa_lite.decoding.generate import generate
from medusa_lite.decoding.inputs import as_prompts
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.errors import GenerationInputError

# Generation-config fields medusa-lite applies, each as model.generate does.
HANDLED_OPTIONS = frozenset(
    {
        "max_new_tokens",
        "max_length",
        "min_new_tokens",
        "min_length",
        "max_time",
        "stop_strings",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
        "no_repeat_ngram_size",
        "bad_words_ids",
        "eos_token_id",
        "return_dict_in_generate",
        "output_scores",
        "output_logits",
    }
)
# Fields that change nothing in the tokens of one unpadded sequence (bookkeeping, padding, the cache's
# use: medusa-lite always keeps one; "hybrid" is the sliding-window default transformers itself unsets).
INERT_OPTIONS = frozenset({"transformers_version", "pad_token_id", "bos_token_id", "use_cache"})
INERT_VALUES = {"cache_implementation": (None, "hybrid")}
# Keyword arguments of model.generate that are not generation-config fields and that medusa-lite takes.
INPUT_KEYWORDS = frozenset({"input_ids", "attention_mask", "tokenizer"})
# model.generate's other parameters, which a custom_generate method is handed too: accepted when unset
# (None or False), refused by name otherwise.
TRANSFORMERS_ONLY_KEYWORDS = frozenset(
    {
        "prefix_allowed_tokens_fn",
        "synced_gpus",
        "assistant_model",
        "assistant_tokenizer",
        "negative_prompt_ids",
        "negative_prompt_attention_mask",
        "use_model_defaults",
    }
)
# medusa_lite.generate's own keywords, accepted here too.
OWN_KEYWORDS = frozenset({"proposers", "tree", "lookup_tokens", "datastore", "datastore_tokens", "generator"})


def transformers_defaults() -> dict:
    """Every generation-config field with the value ``model.generate`` uses when nothing sets it."""
    defaults = GenerationConfig().to_dict()
    global_defaults = getattr(GenerationConfig, "_get_default_generation_params", None)  # transformers >= 5
    return defaults | (global_defaults() if global_defaults is not None else {})


def set_fields(config: GenerationConfig | None) -> dict:
    """The fields a generation config sets (None: unset, as transformers reads it)."""
    if config is None:
        return {}
    if not isinstance(config, GenerationConfig):
        raise GenerationInputError(
            f"generation_config must be a transformers GenerationConfig, got {type(config).__name__}"
        )
    return {key: value for key, value in config.to_dict().items() if value is not None}


def merged_options(
    model: MedusaModel, generation_config: GenerationConfig | None, keywords: dict
) -> tuple[dict, dict]:
    """(every generation option's value for this call, the keywords that are not generation options)."""
    defaults = transformers_defaults()
    own_config = getattr(model.base_model, "generation_config", None)
    # max_length unset stays None: transformers then makes its default the count of new tokens
    options = defaults | {"max_length": None} | set_fields(own_config) | set_fields(generation_config)
    others = {}
    for key, value in keywords.items():
        if key in defaults or hasattr(GenerationConfig(), key):
            options[key] = value
        else:
            others[key] = value
    return options, others


def refused_options(options: dict) -> list[str]:
    """The options set to something medusa-lite does not apply (each named, with its value)."""
    defaults = transformers_defaults()
    refused = []
    for key, value in sorted(options.items()):
        if key in HANDLED_OPTIONS or key in INERT_OPTIONS or key.startswith("_"):
            continue
        if value is None or value is False or value in INERT_VALUES.get(key, ()) or value == defaults.get(key):
            continue  # unset, off, or transformers' own default
        refused.append(f"{key}={value!r}")
    return refused


def new_token_counts(options: dict, prompt_length: int) -> tuple[int, int | None]:
    """(the most new tokens, the fewest or None) from ``max_new_tokens``/``max_length`` and
    ``min_new_tokens``/``min_length``, as ``model.generate`` reads them (the ``*_new_tokens`` win; with
    no length set at all, transformers' default ``max_length`` counts new tokens)."""
    most = options.get("max_new_tokens")
    if most is None and options.get("max_length") is None:  # nothing sets a length: 20 new tokens, as in transformers
        most = transformers_defaults()["max_length"]
    elif most is None:
        most = options["max_length"] - prompt_length
        if most <= 0:
            raise GenerationInputError(
                f"max_length={options['max_length']} leaves no room after the {prompt_length}-token prompt: "
                "pass max_new_tokens="
            )
    fewest = options.get("min_new_tokens")
    if fewest is None and options.get("min_length"):
        fewest = max(options["min_length"] - prompt_length, 0)
    return most, fewest


def sampling_arguments(options: dict) -> dict:
    """temperature / top_k / top_p for :func:`medusa_lite.generate` (temperature 0: greedy)."""
    if not options.get("do_sample"):
        return {"temperature": 0.0}
    temperature = options.get("temperature")
    if temperature is None or not temperature > 0:
        raise GenerationInputError(f"do_sample=True needs a temperature > 0, got temperature={temperature!r}")
    top_k, top_p = options.get("top_k"), options.get("top_p")
    return {
        "temperature": temperature,
        "top_k": top_k if top_k else None,  # 0 or None: no top-k, as in model.generate
        "top_p": top_p if top_p is not None and top_p < 1 else None,
    }


def generate_like_transformers(
    model: MedusaModel,
    inputs=None,
    generation_config: GenerationConfig | None = None,
    logits_processor=None,
    stopping_criteria=None,
    streamer=None,
    **keywords,
):
    """``model.generate``'s call, decoded by :func:`medusa_lite.generate` (see the module docstring)."""
    options, others = merged_options(model, generation_config, keywords)
    refused = refused_options(options)
    if refused:
        raise GenerationInputError(
            f"medusa-lite cannot apply {', '.join(refused)} exactly (it decodes each sequence with exact "
            f"speculative decoding; it applies {', '.join(sorted(HANDLED_OPTIONS))})"
        )
    unset = {key for key in TRANSFORMERS_ONLY_KEYWORDS & set(others) if others[key] is None or others[key] is False}
    for key in unset:
        del others[key]
    unknown = sorted(set(others) - INPUT_KEYWORDS - OWN_KEYWORDS)
    if unknown:
        raise GenerationInputError(f"generate() got argument(s) medusa-lite does not take: {', '.join(unknown)}")
    input_ids = others.pop("input_ids", None)
    if inputs is not None and input_ids is not None:
        raise GenerationInputError("the prompt is given twice: as inputs and as input_ids; pass one")
    input_ids = inputs if inputs is not None else input_ids
    if input_ids is None:
        raise GenerationInputError("no prompt given: pass input_ids (e.g. **tokenizer(text, return_tensors='pt'))")
    attention_mask = others.pop("attention_mask", None)
    ids, _ = as_prompts(input_ids, model.device, attention_mask)  # checked here for its length; generate reads it
    most, fewest = new_token_counts(options, ids.shape[1])
    max_time = options.get("max_time")
    as_dict = bool(options.get("return_dict_in_generate"))  # scores and logits come only with it, as in transformers
    output = generate(
        model,
        input_ids,
        most,
        attention_mask=attention_mask,
        pad_token_id=options.get("pad_token_id"),
        **sampling_arguments(options),
        eos_token_id=options.get("eos_token_id"),
        repetition_penalty=options.get("repetition_penalty"),
        no_repeat_ngram_size=options.get("no_repeat_ngram_size"),
        min_new_tokens=fewest,
        bad_words_ids=options.get("bad_words_ids"),
        stop_strings=options.get("stop_strings"),
        max_time=None if max_time is None or math.isinf(max_time) else max_time,
        stopping_criteria=stopping_criteria,
        logits_processor=logits_processor,
        streamer=streamer,
        output_scores=as_dict and bool(options.get("output_scores")),
        output_logits=as_dict and bool(options.get("output_logits")),
        **others,
    )
    if as_dict:
        return GenerateDecoderOnlyOutput(sequences=output.sequences, scores=output.scores, logits=output.logits)
    return output.sequences
