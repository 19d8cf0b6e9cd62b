"""Sliding-window targets decode past their window exactly: each tree node sees only its own window."""

from collections import Counter

import pytest
import torch
from exact_distribution import (
    ALPHA,
    LOGIT_SCALE,
    NUM_SAMPLES,
    PARTIAL_TREE,
    PROMPT,
    chi_square_p_value,
    continuation,
    exact_distribution,
    sampled_outputs,
)
from exact_distribution import (
    NEW_TOKENS as SAMPLED_TOKENS,
)
from exact_distribution import VOCAB as SAMPLING_VOCAB
from tiny_models import PartlyRightOracle, plain_greedy, random_heads, tiny_base_model
from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

from medusa_lite import LookaheadProposer, MedusaModel, SamplingSettings, UnsupportedModelError, generate
from medusa_lite.decoding import windows
from medusa_lite.decoding.windows import FULL_ATTENTION, SLIDING_ATTENTION, layer_windows, step_masks

VOCAB = 96
WINDOW = 6
PROMPT_LEN = 10  # longer than the window before the first new token
NEW_TOKENS = 30
TREE = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
# Every layer sliding (mistral), sliding and full layers mixed (qwen2 with use_sliding_window,
# gemma3: its own attention, norms and scaled embeddings).
FAMILIES = {
    "mistral": dict(sliding_window=WINDOW),
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "gemma3_text": dict(sliding_window=WINDOW, head_dim=8, layer_types=[SLIDING_ATTENTION, FULL_ATTENTION]),
}


def windowed_base(family: str, seed: int = 2):
    return tiny_base_model(family, vocab_size=VOCAB, seed=seed, **FAMILIES[family])


def prompts(count: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (1, PROMPT_LEN), generator=generator) for _ in range(count)]


def test_layer_kinds_are_read_from_the_config():
    assert layer_windows(MistralConfig(sliding_window=WINDOW)) == {SLIDING_ATTENTION: WINDOW}
    assert layer_windows(MistralConfig(sliding_window=None)) == {FULL_ATTENTION: None}
    assert layer_windows(LlamaConfig()) == {FULL_ATTENTION: None}
    mixed = Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, num_hidden_layers=2)
    assert layer_windows(mixed) == {FULL_ATTENTION: None, SLIDING_ATTENTION: WINDOW}
    assert layer_windows(Qwen2Config(sliding_window=WINDOW)) == {FULL_ATTENTION: None}  # use_sliding_window off
    gemma = Gemma3TextConfig(sliding_window=WINDOW, num_hidden_layers=2, layer_types=[SLIDING_ATTENTION] * 2)
    assert layer_windows(gemma) == {SLIDING_ATTENTION: WINDOW}


def test_a_layer_kind_without_a_tree_mask_is_refused_by_name():
    config = LlamaConfig(num_hidden_layers=2)
    config.layer_types = [FULL_ATTENTION, "chunked_attention"]
    with pytest.raises(UnsupportedModelError, match="llama has chunked_attention layers"):
        layer_windows(config)


def test_a_node_sees_its_ancestors_and_the_prefix_inside_its_window_only():
    config = MistralConfig(sliding_window=3, num_hidden_layers=1)
    prefix_len = 4
    allowed = torch.ones(2, prefix_len + 2, dtype=torch.bool)  # two chained nodes, depths 0 and 1
    allowed[0, prefix_len + 1] = False
    mask = step_masks(config, allowed, torch.tensor([4, 5]), torch.float32, torch.device("cpu"))[0, 0]
    seen = mask == 0
    # position 4 sees 2, 3, 4; position 5 sees 3, 4, 5 (keys at positions 0..3, then the nodes 4, 5)
    assert seen.tolist() == [
        [False, False, True, True, True, False],
        [False, False, False, True, True, True],
    ]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_past_the_window_matches_plain_greedy(family):
    base = windowed_base(family)
    heads = random_heads(base, num_heads=3, seed=4)
    for index, prompt in enumerate(prompts(3)):
        expected = plain_greedy(base, prompt, NEW_TOKENS)
        assert expected.shape[1] == PROMPT_LEN + NEW_TOKENS > 2 * WINDOW
        out = generate(MedusaModel(base, heads), prompt, NEW_TOKENS, tree=TREE)
        assert torch.equal(out.sequences, expected), f"{family}: random heads diverged past the window"
        oracle = PartlyRightOracle(base, heads, expected[0], seed=index)
        oracle_out = generate(oracle, prompt, NEW_TOKENS, tree=TREE, lookup_tokens=0, datastore=False)
        assert torch.equal(oracle_out.sequences, expected), f"{family}: accepted guesses diverged past the window"
        assert oracle_out.stats.steps < NEW_TOKENS - 1, "the oracle accepted nothing: the tree was never tested"


def test_lookahead_side_rows_past_the_window_match_plain_greedy():
    base = windowed_base("qwen2")
    model = MedusaModel(base, None)
    for prompt in prompts(2, seed=1):
        out = generate(model, prompt, NEW_TOKENS, proposers=[LookaheadProposer(window=3, ngram_size=3, candidates=2)])
        assert torch.equal(out.sequences, plain_greedy(base, prompt, NEW_TOKENS))


def test_without_the_window_the_tree_diverges(monkeypatch):
    """Negative control: a tree mask that ignores the window is caught by the comparison above."""
    base = windowed_base("mistral")
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    monkeypatch.setattr(windows, "within_window", lambda query_positions, keys, window: None)
    outputs = [(generate(model, prompt, NEW_TOKENS, tree=TREE).sequences, prompt) for prompt in prompts(3)]
    diverged = sum(not torch.equal(out, plain_greedy(base, prompt, NEW_TOKENS)) for out, prompt in outputs)
    assert diverged > 0


SAMPLING_WINDOW = 2  # the 3-token prompt and 4 sampled tokens lie well past it


def test_sampling_past_the_window_has_the_targets_distribution():
    """Chi-square against the windowed target's exact distribution; power: the samples reject the unwindowed one.

    The full-attention model has the same weights (same seed, no window), so rejecting it shows the
    test tells a node that sees its window from one that sees everything, at this sample size.
    """
    windowed, unwindowed = (
        tiny_base_model("mistral", vocab_size=SAMPLING_VOCAB, seed=0, logit_scale=LOGIT_SCALE, sliding_window=window)
        for window in (SAMPLING_WINDOW, None)
    )
    settings = SamplingSettings(temperature=1.0)
    model = MedusaModel(windowed, random_heads(windowed, num_heads=3, seed=1))
    runs = sampled_outputs(model, PROMPT, SAMPLED_TOKENS, settings, NUM_SAMPLES, seed=3, tree=PARTIAL_TREE)
    counts = Counter(continuation(out, PROMPT) for out in runs)
    assert chi_square_p_value(counts, exact_distribution(windowed, settings), NUM_SAMPLES) > ALPHA
    assert chi_square_p_value(counts, exact_distribution(unwindowed, settings), NUM_SAMPLES) < ALPHA
