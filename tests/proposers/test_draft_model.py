"""Draft-model speculative decoding (medusa_lite.DraftModelProposer) is exact: greedy and sampled, chains and trees.

Greedy: token-identical to plain greedy on every tiny-model family, with the draft a different
random model of the same vocabulary (guesses often wrong) and the target itself (always right).
Sampling: the chi-square test of tests/distribution_check.py on the first tokens' joint
distribution at T=1, T=0.7 with top-k and with top-p, for chains and trees; power is shown by the
negative control (the same rule without the residual step), which the same test at the same
sample size must reject. The sampling pair (target and draft) has one layer each, not two: the
acceptance rule's exactness does not depend on depth, and a forward costs about a quarter less (the
greedy tests above keep the two-layer targets of every family).
"""

import copy

import pytest
import torch
from distribution_check import ALPHA, chi_square_p_value, exact_distribution, sampled_counts
from tiny_models import FAMILIES, plain_greedy, random_heads, tiny_base_model
from tiny_tokenizer import make_tiny_tokenizer
from transformers import AutoModelForCausalLM

import medusa_lite.decoding.acceptance
from medusa_lite import DraftModelError, DraftModelProposer, MedusaModel, SamplingSettings, generate
from medusa_lite.drafters.medusa.proposer import default_proposers


def truncated(base, num_layers: int = 1):
    """The target's first ``num_layers`` layers, embeddings, norm and lm_head: a cheap draft that often agrees."""
    config = copy.deepcopy(base.config)
    config.num_hidden_layers = num_layers
    draft = AutoModelForCausalLM.from_config(config, attn_implementation=base.config._attn_implementation).eval()
    kept = {
        name: tensor
        for name, tensor in base.state_dict().items()
        if ".layers." not in name or int(name.split(".layers.")[1].split(".")[0]) < num_layers
    }
    draft.load_state_dict(kept, strict=True)
    return draft


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_greedy_is_identical_to_plain_greedy(family, shape):
    base = tiny_base_model(family, vocab_size=16, seed=3, logit_scale=3.0)
    draft = truncated(base)
    branching = (2, 2, 1) if shape == "tree" else None
    model = MedusaModel(base)
    accepted = 0
    for seed in range(3):
        prompt = torch.randint(0, 16, (1, 6), generator=torch.Generator().manual_seed(seed))
        expected = plain_greedy(base, prompt, 30)
        out = generate(model, prompt, 30, proposers=[DraftModelProposer(draft, branching=branching)])
        assert torch.equal(out.sequences, expected), f"{family}/{shape}: diverged from plain greedy"
        accepted += out.stats.accepted_by_source.get("draft_model", 0)
        itself = generate(model, prompt, 30, proposers=[DraftModelProposer(base, k=3, max_k=3, branching=branching)])
        assert torch.equal(itself.sequences, expected)
        assert itself.stats.tokens_per_step[:-1] == [4] * (
            itself.stats.steps - 1
        )  # the target as its own draft: all accepted
    assert accepted > 0, "no drafted token was ever accepted: the test did not reach its case"


def test_adaptive_k_grows_while_everything_is_accepted_and_shrinks_on_rejection():
    base = tiny_base_model("llama", vocab_size=16, seed=3, logit_scale=3.0)
    prompt = torch.tensor([[1, 2, 3]])
    out = generate(MedusaModel(base), prompt, 40, proposers=[DraftModelProposer(base, k=1, max_k=7)])
    assert out.stats.tokens_per_step[:4] == [2, 4, 6, 8]  # k = 1, 3, 5, 7 (+ the bonus), capped at max_k
    other = tiny_base_model("llama", vocab_size=16, seed=9, logit_scale=3.0)
    out = generate(MedusaModel(base), prompt, 40, proposers=[DraftModelProposer(other, k=6, max_k=8)])
    assert out.stats.verified_rows < out.stats.steps * 7  # rejections shrank k below its start


def test_the_draft_cache_is_cut_back_not_recomputed():
    """The draft model never sees a committed token twice: fed tokens = prompt + new tokens + drafted ones."""
    base = tiny_base_model("llama", vocab_size=16, seed=3, logit_scale=3.0)
    draft = tiny_base_model("llama", vocab_size=16, seed=9, logit_scale=3.0)
    fed = []
    handle = draft.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        out = generate(
            MedusaModel(base),
            torch.tensor([[1, 2, 3]]),
            30,
            proposers=[DraftModelProposer(draft, k=3, adaptive=False)],
        )
    finally:
        handle.remove()
    # Each step feeds the committed tokens the cache lacks (>= 1) once, then k - 1 drafted tokens one by one.
    assert sum(fed) <= 3 + 30 + out.stats.steps * 2
    assert len(fed) <= out.stats.steps * 3  # at most k forwards a step (fewer near max_new_tokens)


# -- sampling: the exact distribution ------------------------------------------------------------
VOCAB = 3
NEW_TOKENS = 4
NUM_SAMPLES = 3000
PROMPT = torch.tensor([[0, 2, 1]])
SAMPLING_LAYERS = 1  # see the module docstring


@pytest.fixture(scope="module")
def pair():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=42, logit_scale=5.0, num_hidden_layers=SAMPLING_LAYERS)
    draft = tiny_base_model("llama", vocab_size=VOCAB, seed=7, logit_scale=5.0, num_hidden_layers=SAMPLING_LAYERS)
    return MedusaModel(base), draft


CASES = {
    "T1.0-chain": (SamplingSettings(1.0), {"k": 3, "adaptive": False}),
    "T0.7-topk2-chain": (SamplingSettings(0.7, top_k=2), {"k": 2}),
    "T1.0-topp0.8-chain": (SamplingSettings(1.0, top_p=0.8), {"k": 2}),
    "T1.0-tree": (SamplingSettings(1.0), {"branching": (2, 2)}),
    "T0.7-topk2-tree": (SamplingSettings(0.7, top_k=2), {"branching": (2, 1)}),
    "T1.0-topp0.8-tree": (SamplingSettings(1.0, top_p=0.8), {"branching": (3, 1)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sampling_matches_the_target_distribution(pair, case):
    model, draft = pair
    settings, options = CASES[case]
    exact = exact_distribution(model.base_model, PROMPT, NEW_TOKENS, settings)
    counts = sampled_counts(
        model, PROMPT, NEW_TOKENS, settings, NUM_SAMPLES, seed=1, proposers=[DraftModelProposer(draft, **options)]
    )
    p_value = chi_square_p_value(counts, exact, NUM_SAMPLES)
    assert p_value > ALPHA, f"draft-model samples differ from the target's distribution (p={p_value:.2e})"


@pytest.mark.parametrize("options", [{"k": 3, "adaptive": False}, {"branching": (2, 2)}], ids=["chain", "tree"])
def test_a_rule_without_the_residual_is_rejected(pair, options, monkeypatch):
    """Negative control (the power of the test above): after a rejection draw from p, not from norm(max(p - q, 0))."""
    model, draft = pair
    monkeypatch.setattr(medusa_lite.decoding.acceptance, "residual_distribution", lambda p, q: p)
    settings = SamplingSettings(1.0)
    exact = exact_distribution(model.base_model, PROMPT, NEW_TOKENS, settings)
    counts = sampled_counts(
        model, PROMPT, NEW_TOKENS, settings, NUM_SAMPLES, seed=2, proposers=[DraftModelProposer(draft, **options)]
    )
    assert chi_square_p_value(counts, exact, NUM_SAMPLES) < ALPHA


# -- bad input -----------------------------------------------------------------------------------
def test_bad_draft_settings_and_another_vocabulary_are_clear_errors():
    base = tiny_base_model("llama", vocab_size=16, seed=3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(DraftModelError, match="k \\(tokens drafted per step\\) must be an integer >= 1"):
            DraftModelProposer(base, k=bad)
    with pytest.raises(DraftModelError, match="max_k must be an integer >= k"):
        DraftModelProposer(base, k=4, max_k=2)
    with pytest.raises(DraftModelError, match="branching must be"):
        DraftModelProposer(base, branching=[2, 0])
    with pytest.raises(DraftModelError, match="must be a Hugging Face causal LM"):
        DraftModelProposer("path/to/model")
    other = tiny_base_model("llama", vocab_size=24, seed=3)
    with pytest.raises(DraftModelError, match="draft model's vocabulary has 24 tokens, the target's 16"):
        generate(MedusaModel(base), torch.tensor([[1, 2]]), 4, proposers=[DraftModelProposer(other)])


def test_another_tokenizer_is_a_clear_error():
    base = tiny_base_model("llama", vocab_size=16, seed=3)
    target_tokenizer = make_tiny_tokenizer()
    DraftModelProposer(base, tokenizer=make_tiny_tokenizer(), target_tokenizer=target_tokenizer)  # the same: accepted
    with pytest.raises(DraftModelError, match="tokenizer differs from the target's"):
        DraftModelProposer(base, tokenizer=make_tiny_tokenizer(vocab_size=300), target_tokenizer=target_tokenizer)


def test_draft_model_with_heads_and_lookups_together_is_exact():
    base = tiny_base_model("qwen2", vocab_size=16, seed=3, logit_scale=3.0)
    draft = tiny_base_model("qwen2", vocab_size=16, seed=9, logit_scale=3.0, num_hidden_layers=1)
    model = MedusaModel(base, random_heads(base, 2, seed=4))
    prompt = torch.tensor([[1, 2, 3, 1, 2, 3]])
    out = generate(model, prompt, 30, proposers=[*default_proposers(), DraftModelProposer(draft)])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 30))


def test_command_line_draft_model_is_identical_to_plain(tmp_path, capsys):
    """``python -m medusa_lite --draft-model PATH``: the target's own folder as its draft, greedy, compared with
    plain.
    """
    from tiny_checkpoint import save_tiny_checkpoint

    from medusa_lite.cli import main

    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    arguments = ["--model", str(model_dir), "--heads", str(heads_dir), "--draft-model", str(model_dir)]
    assert main([*arguments, "--prompt", "Why is the sky blue?", "--max-new-tokens", "12", "--compare"]) == 0
    out = capsys.readouterr().out
    assert f"draft model {model_dir}" in out and "identical outputs: yes" in out
