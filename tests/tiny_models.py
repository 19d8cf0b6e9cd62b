"""Tiny random models (built from a config, nothing downloaded) and oracle heads for tests."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from medusa_lite import MedusaConfig, MedusaHeads, MedusaModel
from medusa_lite.attention import TREE_SDPA

TINY_SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
CONFIG_CLASSES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
FAMILIES = tuple(CONFIG_CLASSES)


def tiny_base_model(family: str = "llama", *, vocab_size: int = 128, seed: int = 0, logit_scale: float = 1.0, attn_implementation: str = TREE_SDPA, eos_token_id: int | None = None, **overrides):
    """A fp32 random causal LM of the given family; ``logit_scale`` sharpens its distributions."""
    torch.manual_seed(seed)
    config = CONFIG_CLASSES[family](vocab_size=vocab_size, **{**TINY_SIZES, **overrides}, eos_token_id=eos_token_id, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id if eos_token_id is not None else 0
    return model


def random_heads(base_model, num_heads: int = 3, *, seed: int = 1, num_layers: int = 1, use_base_lm_head: bool = True, next_token_input: bool = False) -> MedusaHeads:
    """Heads with random (not identity) weights, so their guesses are mostly wrong."""
    config = MedusaConfig(
        num_heads=num_heads,
        hidden_size=base_model.config.hidden_size,
        vocab_size=base_model.config.vocab_size,
        num_layers=num_layers,
        use_base_lm_head=use_base_lm_head,
        next_token_input=next_token_input,
    )
    heads = MedusaHeads(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return heads


def tiny_medusa(family: str = "llama", num_heads: int = 3, **base_kwargs) -> MedusaModel:
    base = tiny_base_model(family, **base_kwargs)
    return MedusaModel(base, random_heads(base, num_heads))


class OracleMedusaModel(MedusaModel):
    """Heads that always guess right: head k returns the reference continuation k+1 tokens ahead.

    The position of a hidden state is found by matching it against the hidden states of a full
    forward over the reference sequence (exact greedy output of the target).
    """

    def __init__(self, base_model, heads, reference: torch.Tensor):
        super().__init__(base_model, heads)
        self.reference = reference
        with torch.no_grad():
            self.reference_hidden = base_model(reference[None], output_hidden_states=True).hidden_states[-1][0]

    def head_logits(self, hidden: torch.Tensor, num_heads: int | None = None, next_tokens: torch.Tensor | None = None) -> torch.Tensor:
        distance = (self.reference_hidden - hidden).abs().amax(dim=-1)
        position = int(distance.argmin())
        assert float(distance[position]) < 1e-3, "oracle: hidden state not on the reference path"
        count = self.num_heads if num_heads is None else num_heads
        logits = torch.zeros(count, self.config.vocab_size)
        for k in range(count):
            ahead = position + 2 + k
            if ahead < self.reference.numel():
                logits[k, self.reference[ahead]] = 1.0
        return logits


def plain_greedy(base_model, prompt: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    """The reference: transformers' own greedy generate (explicit mask: token 0 is not padding)."""
    return base_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
