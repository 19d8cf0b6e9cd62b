"""Every family a user would plausibly speed up: greedy identical to model.generate, or refused up front by name."""

import pytest
import torch
from tiny_models import PartlyRightOracle, plain_greedy, random_heads, tiny_base_model
from transformers import AutoConfig, FalconConfig, Gemma2Config, LlamaConfig, MptConfig

from medusa_lite import MedusaModel, UnsupportedModelError, attach, generate
from medusa_lite.decoding.architectures import (
    check_architecture,
    model_class_for,
    tree_attention_implementation,
    uses_alibi,
)
from medusa_lite.decoding.attention import TREE_SDPA

VOCAB = 96
NEW_TOKENS = 30
WINDOW = 6  # shorter than the prompt plus what is generated: decoding runs past it
PROMPT = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
GPT2_SIZES = dict(n_embd=32, n_layer=2, n_head=4, n_positions=256)
ROTARY = dict(rotary_dim=4)
HEAD_DIM = dict(head_dim=8)
# The families, each with what its tiny config needs beyond the shared tiny sizes (tests/tiny_models.py).
EXACT_FAMILIES = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "mistral": dict(sliding_window=WINDOW),
    "gemma": HEAD_DIM,
    "gemma2": dict(HEAD_DIM, sliding_window=WINDOW),  # sliding and full layers, soft-capped logits
    "gemma3_text": dict(HEAD_DIM, sliding_window=WINDOW),
    "phi": dict(partial_rotary_factor=0.5),
    "phi3": {},
    "gpt2": GPT2_SIZES,
    "gpt_bigcode": GPT2_SIZES,
    "gpt_neox": {},
    "gptj": dict(GPT2_SIZES, **ROTARY),
    "codegen": dict(GPT2_SIZES, n_ctx=256, **ROTARY),
    "opt": dict(ffn_dim=64, word_embed_proj_dim=32),
    "falcon": {},
    "olmo2": {},
    "granite": {},
    "starcoder2": {},
    "cohere": {},
    "cohere2": dict(HEAD_DIM, sliding_window=WINDOW),
    "smollm3": {},
    "exaone4": dict(HEAD_DIM, sliding_window=WINDOW),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(
        moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2
    ),
    "qwen3_moe": dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(HEAD_DIM, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW),
}
REFUSED_FAMILIES = {
    "bloom": (dict(n_layer=2, n_head=4), "ALiBi"),
    "mpt": (dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=256), "ALiBi"),
    "jamba": (
        dict(
            num_experts=2,
            expert_layer_period=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            mamba_d_state=4,
            mamba_d_conv=2,
            mamba_dt_rank=4,
        ),
        "recurrent",
    ),
}


def family_model(family: str, **extra):
    implementation = tree_attention_implementation(model_class_for(AutoConfig.for_model(family)))
    return tiny_base_model(family, vocab_size=VOCAB, seed=1, attn_implementation=implementation, **extra)


@pytest.mark.parametrize("family", list(EXACT_FAMILIES))
def test_each_family_decodes_greedy_identical_to_model_generate(family):
    base = family_model(family, **EXACT_FAMILIES[family])
    expected = plain_greedy(base, PROMPT, NEW_TOKENS)
    oracle = PartlyRightOracle(base, random_heads(base, num_heads=3, seed=2), expected[0])
    out = generate(oracle, PROMPT, NEW_TOKENS, tree=TREE, lookup_tokens=0, datastore=False)
    assert torch.equal(out.sequences, expected), f"{family}: medusa-lite diverged from model.generate"
    assert out.stats.steps < NEW_TOKENS - 1, f"{family}: no guess accepted, the tree was never verified"


@pytest.mark.parametrize("family", list(REFUSED_FAMILIES))
def test_a_family_no_tree_verifies_is_refused_by_name_at_attach_and_generate(family, tmp_path):
    extra, reason = REFUSED_FAMILIES[family]
    base = family_model(family, **extra)
    heads = random_heads(base, num_heads=3, seed=2)
    with pytest.raises(UnsupportedModelError, match=f"^{family} .*{reason}"):
        generate(MedusaModel(base, heads), PROMPT, NEW_TOKENS)
    heads.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=f"^{family} .*{reason}"):
        attach(base, tmp_path)


def test_alibi_is_read_from_each_familys_own_setting():
    assert uses_alibi(AutoConfig.for_model("bloom"))
    assert uses_alibi(FalconConfig(alibi=True)) and not uses_alibi(FalconConfig())
    assert uses_alibi(MptConfig()) and not uses_alibi(MptConfig(attn_config={"alibi": False}))
    assert not uses_alibi(LlamaConfig())
    with pytest.raises(UnsupportedModelError, match="^falcon uses ALiBi"):
        check_architecture(FalconConfig(alibi=True))


def test_falcon_with_alibi_is_refused_though_plain_falcon_is_exact():
    base = family_model("falcon", alibi=True)
    with pytest.raises(UnsupportedModelError, match="^falcon uses ALiBi"):
        generate(MedusaModel(base, random_heads(base, num_heads=3, seed=2)), PROMPT, NEW_TOKENS)


def test_the_attention_implementation_follows_the_class_capability():
    assert tree_attention_implementation(model_class_for(LlamaConfig())) == TREE_SDPA
    assert tree_attention_implementation(model_class_for(Gemma2Config())) == "eager"  # no SDPA in Gemma-2
    assert tree_attention_implementation(model_class_for(FalconConfig())) == "sdpa"  # SDPA, no attention registry
    assert tree_attention_implementation(None) == TREE_SDPA  # unknown here: transformers says if it cannot
