"""Models whose forward takes the KV cache as ``past_key_values`` (transformers before the rename
to ``cache``, e.g. 5.17) decode exactly like the others."""

import torch
from tiny_models import plain_greedy, random_heads, tiny_base_model
from transformers import LlamaForCausalLM

from medusa_lite import MedusaModel, generate
from medusa_lite.decoding.model import cache_keyword

MAX_NEW_TOKENS = 24


class OldCacheKeywordLlama(LlamaForCausalLM):
    """A Llama with the older forward signature: ``past_key_values``, and an unknown ``cache``
    silently dropped (as transformers 5.17 did, which then built a cache of its own)."""

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None, **kwargs
    ):
        kwargs.pop("cache", None)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )


def old_style(model: LlamaForCausalLM) -> OldCacheKeywordLlama:
    model.__class__ = OldCacheKeywordLlama
    return model


def test_cache_keyword_follows_the_forward_signature():
    assert cache_keyword(LlamaForCausalLM) in ("cache", "past_key_values")
    assert cache_keyword(OldCacheKeywordLlama) == "past_key_values"


def test_old_cache_keyword_model_matches_plain_greedy():
    reference = tiny_base_model("llama", vocab_size=96, seed=3)
    base = old_style(tiny_base_model("llama", vocab_size=96, seed=3))
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(2))
    out = generate(model, prompt, MAX_NEW_TOKENS, tree=[(0,), (1,), (0, 0)])
    assert torch.equal(out.sequences, plain_greedy(reference, prompt, MAX_NEW_TOKENS))
