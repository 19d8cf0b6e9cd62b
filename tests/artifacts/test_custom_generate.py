"""transformers' own ``model.generate(custom_generate=<folder>, trust_remote_code=True)`` decodes with medusa-lite.

Offline, from local folders: an artifact's ``custom_generate/generate.py`` attaches its heads to the
model transformers hands it and returns what ``model.generate`` returns, token-identical to plain
greedy and to ``medusa_lite.generate`` on the same model and heads.
"""

import pytest
import torch
from tiny_checkpoint import save_tiny_checkpoint
from transformers import AutoModelForCausalLM

import medusa_lite.decoding.drop_in as drop_in
from medusa_lite import MedusaHeads, MedusaModel, generate
from medusa_lite.artifacts.custom_generate import (
    CUSTOM_GENERATE_DIR,
    GENERATE_FILE,
    custom_generate_source,
    write_custom_generate,
)
from medusa_lite.artifacts.loading import DEFAULT_HEADS_DIR
from medusa_lite.errors import MedusaError

NEW = 24


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path_factory.mktemp("custom_generate"))
    write_custom_generate(heads_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return base, heads_dir


def prompt_of(seed: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (1, 10), generator=torch.Generator().manual_seed(seed))


def test_custom_generate_matches_plain_greedy_and_medusa_lite(checkpoint, monkeypatch):
    base, heads_dir = checkpoint
    medusa = MedusaModel(base, MedusaHeads.from_pretrained(heads_dir)).eval()
    calls = []

    def counted(*args, **kwargs):  # medusa-lite's loop, counted: transformers' own loop is not what ran
        calls.append(args[0])
        return generate(*args, **kwargs)

    monkeypatch.setattr(drop_in, "generate", counted)
    for seed in range(3):
        prompt = prompt_of(seed, base.config.vocab_size)
        mask = torch.ones_like(prompt)
        plain = base.generate(prompt, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
        through_transformers = base.generate(
            prompt,
            attention_mask=mask,
            max_new_tokens=NEW,
            custom_generate=str(heads_dir),
            trust_remote_code=True,
            medusa_heads=str(heads_dir),
        )
        assert torch.equal(through_transformers, plain)
        assert len(calls) == seed + 1 and calls[-1].base_model is base and calls[-1].num_heads == medusa.num_heads
        assert torch.equal(generate(medusa, prompt, NEW).sequences, plain)


def test_custom_generate_takes_model_generate_options(checkpoint):
    base, heads_dir = checkpoint
    prompt = prompt_of(7, base.config.vocab_size)
    options = dict(max_new_tokens=NEW, repetition_penalty=1.5, return_dict_in_generate=True)
    plain = base.generate(prompt, attention_mask=torch.ones_like(prompt), **options)
    out = base.generate(
        prompt, custom_generate=str(heads_dir), trust_remote_code=True, medusa_heads=str(heads_dir), **options
    )
    assert torch.equal(out.sequences, plain.sequences)


def test_custom_generate_runs_only_when_trusted(checkpoint):
    base, heads_dir = checkpoint
    prompt = prompt_of(0, base.config.vocab_size)
    with pytest.raises(ValueError, match="trust_remote_code"):
        base.generate(prompt, max_new_tokens=4, custom_generate=str(heads_dir), trust_remote_code=False)


def test_without_heads_named_a_model_other_than_the_default_gets_a_clear_error(checkpoint):
    base, heads_dir = checkpoint
    prompt = prompt_of(0, base.config.vocab_size)
    with pytest.raises(MedusaError, match="no Medusa heads given"):
        base.generate(prompt, max_new_tokens=4, custom_generate=str(heads_dir), trust_remote_code=True)


def test_the_shipped_heads_carry_the_current_custom_generate():
    shipped = DEFAULT_HEADS_DIR / CUSTOM_GENERATE_DIR / GENERATE_FILE
    assert shipped.read_text(encoding="utf-8") == custom_generate_source(None), (
        "rewrite it: python -c 'from medusa_lite.artifacts.custom_generate import write_custom_generate; "
        "from medusa_lite.artifacts.loading import DEFAULT_HEADS_DIR; write_custom_generate(DEFAULT_HEADS_DIR)'"
    )


def test_a_pushed_artifact_names_its_repo():
    source = custom_generate_source("someone/smollm2-heads")
    assert "ARTIFACT = 'someone/smollm2-heads'" in source
    namespace: dict = {}
    exec(compile(source.replace("import medusa_lite", "medusa_lite = None"), GENERATE_FILE, "exec"), namespace)
    assert namespace["ARTIFACT"] == "someone/smollm2-heads"


@pytest.mark.integration
def test_the_default_model_decodes_through_custom_generate_with_its_shipped_heads():
    """SmolLM2-135M-Instruct as transformers loads it: custom_generate=<the shipped heads> is plain greedy's text."""
    from medusa_lite.artifacts.loading import load_target

    base, tokenizer = load_target(None, torch.float32, "cpu")
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    plain = base.generate(**inputs, max_new_tokens=48, do_sample=False)
    out = base.generate(**inputs, max_new_tokens=48, custom_generate=str(DEFAULT_HEADS_DIR), trust_remote_code=True)
    assert torch.equal(out, plain)
