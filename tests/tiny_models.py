"""Tiny random models (built from a config, nothing downloaded) and oracle heads for tests."""

from __future__ import annotations

import math

import torch
from tiny_tokenizer import IM_END
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, Qwen2Config

from medusa_lite import MedusaConfig, MedusaHeads, MedusaModel
from medusa_lite.decoding.attention import TREE_SDPA

TINY_SIZES = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
CONFIG_CLASSES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
FAMILIES = tuple(CONFIG_CLASSES)
CHATTY_HIDDEN_SIZE = 32
STOP_PROBABILITY = 0.1  # chance per step that the "chatty" model ends its turn
FAVOURITE_WORD_PROBABILITY = 0.3  # so that greedy answers are words, not an immediate stop
DOMINANT_EMBEDDING_COMPONENT = 1.0
MASKED_LOGIT = -30.0


def tiny_base_model(
    family: str = "llama",
    *,
    vocab_size: int = 128,
    seed: int = 0,
    logit_scale: float = 1.0,
    attn_implementation: str = TREE_SDPA,
    eos_token_id: int | None = None,
    **overrides,
):
    """A fp32 random causal LM of the given family (a model_type); ``logit_scale`` sharpens its distributions."""
    torch.manual_seed(seed)
    make_config = CONFIG_CLASSES.get(family) or (lambda **kwargs: AutoConfig.for_model(family, **kwargs))
    config = make_config(
        vocab_size=vocab_size,
        **{**TINY_SIZES, **overrides},
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id if eos_token_id is not None else 0
    return model


def random_heads(
    base_model,
    num_heads: int = 3,
    *,
    seed: int = 1,
    num_layers: int = 1,
    use_base_lm_head: bool = True,
    next_token_input: bool = False,
) -> MedusaHeads:
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

    def reference_position(self, hidden: torch.Tensor) -> int:
        """The position p of the reference whose hidden state ``hidden`` is (the next token is reference[p + 1])."""
        distance = (self.reference_hidden - hidden).abs().amax(dim=-1)
        position = int(distance.argmin())
        assert float(distance[position]) < 1e-3, "oracle: hidden state not on the reference path"
        return position

    def head_logits(
        self, hidden: torch.Tensor, num_heads: int | None = None, next_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        position = self.reference_position(hidden)
        count = self.num_heads if num_heads is None else num_heads
        logits = torch.zeros(count, self.config.vocab_size)
        for k in range(count):
            ahead = position + 2 + k
            if ahead < self.reference.numel():
                logits[k, self.reference[ahead]] = 1.0
        return logits


# Logits of a partly-right oracle's three guesses, best first (every other token: 0). On a
# 96-token vocabulary their softmax is about 0.31 / 0.11 / 0.04: a dynamic tree keeps several.
GUESS_LOGITS = (4.0, 3.0, 2.0)
# Where a partly-right head ranks the right token: rank 0, 1, 2, or not among its guesses (None).
RIGHT_RANK_CHOICES = (0, 0, 0, 0, 0, 1, 1, 2, None, None)


class PartlyRightOracle(OracleMedusaModel):
    """Heads right only some of the time, so a run takes both the accept and the reject paths.

    At reference position p, head k ranks the right token (the reference k + 2 tokens ahead) at a
    rank drawn once per (p, k) from RIGHT_RANK_CHOICES (seeded), and fills its other ranks with
    wrong tokens; their logits are GUESS_LOGITS.
    """

    def __init__(self, base_model, heads, reference: torch.Tensor, seed: int = 0):
        super().__init__(base_model, heads, reference)
        generator = torch.Generator().manual_seed(seed)
        draws = torch.randint(0, len(RIGHT_RANK_CHOICES), (reference.numel(), self.num_heads), generator=generator)
        self.right_rank = [[RIGHT_RANK_CHOICES[int(i)] for i in row] for row in draws]

    def head_logits(
        self, hidden: torch.Tensor, num_heads: int | None = None, next_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        position = self.reference_position(hidden)
        count = self.num_heads if num_heads is None else num_heads
        vocab = self.config.vocab_size
        logits = torch.zeros(count, vocab)
        for k in range(count):
            ahead = position + 2 + k
            right = int(self.reference[ahead]) if ahead < self.reference.numel() else 0
            wrong = [(right + 1 + j) % vocab for j in range(len(GUESS_LOGITS))]
            rank = self.right_rank[position][k] if ahead < self.reference.numel() else None
            tokens = wrong if rank is None else wrong[:rank] + [right] + wrong[rank:]
            for token, logit in zip(tokens, GUESS_LOGITS):
                logits[k, token] = logit
        return logits


class NextTokenOracle(OracleMedusaModel):
    """Oracle heads that read the next token (``next_token_input``) and are right only when it is right.

    At reference position p head k guesses reference[p + 2 + k] when the next token it is fed is
    reference[p + 1], and a wrong token otherwise; every call is recorded in ``fed`` as
    (p, the token fed, the right one).
    """

    def __init__(self, base_model, heads, reference: torch.Tensor):
        assert heads.config.next_token_input, "NextTokenOracle stands for heads that read the next token"
        super().__init__(base_model, heads, reference)
        self.fed: list[tuple[int, int, int]] = []

    def head_logits(
        self, hidden: torch.Tensor, num_heads: int | None = None, next_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        assert next_tokens is not None and next_tokens.numel() == 1, "next-token heads must be fed the tree's root"
        position = self.reference_position(hidden)
        right_next = int(self.reference[position + 1])
        self.fed.append((position, int(next_tokens), right_next))
        logits = super().head_logits(hidden, num_heads, next_tokens)
        if int(next_tokens) != right_next:
            logits = logits.roll(1, dims=-1)  # every guess off by one token: wrong
        return logits


def plain_greedy(base_model, prompt: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    """The reference: transformers' own greedy generate (explicit mask: token 0 is not padding)."""
    return base_model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False, **kwargs
    )


# -- a chatty model: writes words and ends its turn, for chat-data tests ------------------------


def chatty_config(tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=CHATTY_HIDDEN_SIZE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def word_token_ids(tokenizer) -> list[int]:
    """Tokens that decode to a space followed by letters (byte-level BPE marks the space as Ġ)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return [i for i, token in enumerate(tokens) if token.startswith("Ġ") and token[1:].isalpha()]


def chatty_next_token_logits(tokenizer) -> torch.Tensor:
    """Log-probabilities: a favourite word, the end-of-turn token, the other words uniformly."""
    favourite, *other_words = word_token_ids(tokenizer)
    probs = torch.zeros(len(tokenizer))
    probs[other_words] = (1 - FAVOURITE_WORD_PROBABILITY - STOP_PROBABILITY) / len(other_words)
    probs[favourite] = FAVOURITE_WORD_PROBABILITY
    probs[tokenizer.convert_tokens_to_ids(IM_END)] = STOP_PROBABILITY
    return probs.log().clamp(min=MASKED_LOGIT)


def make_chatty_model(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    """A tiny random Llama that writes words and ends its turn with probability ~10% per step.

    A large shared component in every token embedding dominates the residual stream, so the
    final hidden state is nearly constant and the lm_head column on that component sets the
    next-token logits; the random weights still make them depend a little on the context.
    """
    torch.manual_seed(seed)
    model = LlamaForCausalLM(chatty_config(tokenizer)).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += DOMINANT_EMBEDDING_COMPONENT
        model.lm_head.weight[:, 0] = chatty_next_token_logits(tokenizer) / math.sqrt(CHATTY_HIDDEN_SIZE)
    return model
