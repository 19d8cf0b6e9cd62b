"""Heads that also read the next token (``MedusaConfig.next_token_input``).

The tree's root (token n+1) is chosen by the target before the heads guess, so the heads can read
it. These tests check the config and file format, the pass-through start, that the token is read,
clear errors, exact decoding (greedy identical to plain, sampling by chi-square), and that training
learns what plain heads cannot: on answers made of pairs (random word w, then f(w)), the token two
ahead of a position is f(w) with w the (random) next token, which only heads that read w can know.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
import training_fixtures
from exact_distribution import ALPHA, NUM_SAMPLES, PARTIAL_TREE, chi_square_p_value, exact_distribution, sample_counts
from tiny_models import FAMILIES, NextTokenOracle, plain_greedy, random_heads, tiny_base_model
from training_fixtures import CYCLE, QUESTIONS, tiny_argv, write_records

from medusa_lite import MedusaConfig, MedusaHeads, MedusaModel, SamplingSettings, Tree, generate
from medusa_lite.commands import train as train_heads
from medusa_lite.errors import HeadsFileError
from medusa_lite.training.losses import gather_rows

tiny_target, single_thread = training_fixtures.tiny_target, training_fixtures.single_thread

TREE = Tree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)])
PAIR_WORDS = CYCLE[:5]  # w is one of these; f(w) is the word at the same place in CYCLE[5:]
PAIR_RECORDS = 120
PAIRS_PER_ANSWER = 12


def next_token_model(family: str = "llama", *, seed: int = 0, heads_seed: int = 1, **base_kwargs) -> MedusaModel:
    base = tiny_base_model(family, seed=seed, **base_kwargs)
    return MedusaModel(base, random_heads(base, num_heads=3, seed=heads_seed, next_token_input=True))


# -- config and files ----------------------------------------------------------------------------
def test_config_defaults_to_plain_heads_and_rejects_non_booleans():
    assert MedusaConfig(num_heads=2, hidden_size=8, vocab_size=16).next_token_input is False
    with pytest.raises(ValueError, match="next_token_input"):
        MedusaConfig(num_heads=2, hidden_size=8, vocab_size=16, next_token_input="yes")


def test_save_and_load_keep_the_fuse_layer(tmp_path):
    base = tiny_base_model("llama")
    heads = random_heads(base, next_token_input=True)
    heads.save_pretrained(tmp_path)
    loaded = MedusaHeads.from_pretrained(tmp_path)
    assert loaded.config.next_token_input is True
    assert torch.equal(loaded.next_token_fuse.weight, heads.next_token_fuse.weight)
    # A file of plain heads does not fit a next-token config: strict loading names the tensors.
    random_heads(base).save_pretrained(tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    (tmp_path / "plain" / "config.json").write_text(json.dumps({**config, "next_token_input": True}))
    with pytest.raises(HeadsFileError, match="next_token_fuse"):
        MedusaHeads.from_pretrained(tmp_path / "plain")


# -- behaviour -----------------------------------------------------------------------------------
def test_fresh_heads_start_as_plain_heads():
    """The fuse layer starts as the identity on the hidden state: training starts from Medusa."""
    base = tiny_base_model("llama")
    plain = MedusaModel.with_new_heads(base, 2)
    reading = MedusaModel.with_new_heads(base, 2, next_token_input=True)
    hidden = torch.randn(5, base.config.hidden_size)
    next_tokens = torch.randint(0, base.config.vocab_size, (5,))
    torch.testing.assert_close(reading.head_logits(hidden, next_tokens=next_tokens), plain.head_logits(hidden))


def test_guesses_depend_on_the_next_token():
    model = next_token_model()
    hidden = torch.randn(model.config.hidden_size).expand(2, -1)
    logits = model.head_logits(hidden, next_tokens=torch.tensor([3, 7]))
    assert not torch.allclose(logits[0], logits[1])


def test_missing_or_unexpected_next_tokens_are_clear_errors():
    model = next_token_model()
    hidden = torch.randn(model.config.hidden_size)
    with pytest.raises(ValueError, match="next_token_input"):
        model.head_logits(hidden)
    plain_heads = random_heads(model.base_model)
    with pytest.raises(ValueError, match="next_token_input is false"):
        plain_heads(hidden, next_token_embeds=torch.randn(model.config.hidden_size))


def test_forward_feeds_the_shifted_input_ids():
    model = next_token_model()
    ids = torch.randint(0, model.config.vocab_size, (1, 6))
    logits, head_logits = model(ids)
    hidden = model.target_forward(ids).hidden
    expected_next = torch.cat([ids[:, 1:], logits[:, -1:].argmax(-1)], dim=1)
    torch.testing.assert_close(head_logits, model.head_logits(hidden, next_tokens=expected_next))


# -- exactness -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lookup_tokens", [0, 3])
def test_greedy_matches_plain_greedy(family, lookup_tokens):
    model = next_token_model(family, logit_scale=20.0)
    prompt = torch.tensor([[5, 9, 2, 5, 9, 14, 3]])
    out = generate(model, prompt, 30, tree=TREE, lookup_tokens=lookup_tokens)
    assert torch.equal(out.sequences, plain_greedy(model.base_model, prompt, 30))


@pytest.mark.parametrize("family", FAMILIES)
def test_oracle_next_token_heads_are_fed_the_root_and_accept_full_depth(family):
    """Heads right exactly when fed the right next token: every step accepts the whole tree depth.

    Random heads never get a guess accepted, so this is the run where the next token after an
    accepted path (the new root) is what decides the guesses.
    """
    model = next_token_model(family, logit_scale=20.0)
    prompt = torch.tensor([[5, 9, 2, 5, 9, 14, 3]])
    full_step, steps = TREE.depth + 1, 7
    new_tokens = 1 + steps * full_step  # the prefill's token, then full steps only: every step has room for guesses
    expected = plain_greedy(model.base_model, prompt, new_tokens)
    oracle = NextTokenOracle(model.base_model, model.heads, expected[0])
    out = generate(oracle, prompt, new_tokens, tree=TREE, lookup_tokens=0, datastore=False)
    assert torch.equal(out.sequences, expected)
    assert out.stats.tokens_per_step == [full_step] * steps, "oracle guesses were rejected"
    assert len(oracle.fed) == steps, "the heads should be asked once per step"
    wrong = [(position, fed, right) for position, fed, right in oracle.fed if fed != right]
    assert not wrong, f"heads fed the wrong next token (position, fed, right): {wrong}"


def test_sampling_matches_the_exact_target_distribution():
    """Chi-square on the 81-outcome joint of 4 tokens, alpha 1e-3 (power: test_sampling_exact)."""
    base = tiny_base_model("llama", vocab_size=3, seed=42, logit_scale=5.0)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=43, next_token_input=True))
    settings = SamplingSettings(0.7)
    counts = sample_counts(model, settings, PARTIAL_TREE, NUM_SAMPLES, seed=3, lookup_tokens=3)
    p_value = chi_square_p_value(counts, exact_distribution(base, settings), NUM_SAMPLES)
    assert p_value > ALPHA, f"samples differ from the target's distribution (p={p_value:.2e})"


# -- training ------------------------------------------------------------------------------------
def test_rows_carry_the_token_after_each_hidden_state():
    ids = torch.tensor([[4, 5, 6, 7, 8, 9]])
    mask = torch.tensor([[False, False, True, True, True, True]])
    hidden = torch.arange(6.0).view(1, 6, 1).expand(1, 6, 3)  # hidden state n holds n
    rows = gather_rows(hidden, ids, mask, num_heads=2, with_teacher=False)
    positions = rows.hidden[:, 0].long()
    assert positions.numel() > 0 and torch.equal(rows.path_tokens[:, 0], ids[0, positions + 1])


def pair_answer(rng: random.Random) -> str:
    words = []
    for _ in range(PAIRS_PER_ANSWER):
        index = rng.randrange(len(PAIR_WORDS))
        words += [PAIR_WORDS[index], CYCLE[len(PAIR_WORDS) + index]]
    return " ".join(words)


@pytest.fixture(scope="module")
def pair_data(tmp_path_factory):
    rng = random.Random(0)
    records = [
        {
            "conversations": [
                {"from": "human", "value": rng.choice(QUESTIONS)},
                {"from": "gpt", "value": pair_answer(rng)},
            ]
        }
        for _ in range(PAIR_RECORDS)
    ]
    return write_records(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", records)


def trained_head1_top1(tiny_target, pair_data, output_dir, next_token_input: bool) -> float:
    """Held-out head-1 top-1 accuracy of a short training run; checks the saved config too."""
    run = train_heads.main(
        tiny_argv(tiny_target, pair_data, output_dir, next_token_input=next_token_input, max_steps=80)
    )
    assert MedusaHeads.from_pretrained(run.heads_dir).config.next_token_input is next_token_input
    return run.summary["top1_accuracy"][0]


def test_training_learns_what_plain_heads_cannot(tiny_target, pair_data, tmp_path):
    """Head 1 at a pair's first word must guess f(next word): ~1/2 of positions for next-token heads, ~1/5 at best
    otherwise.
    """
    plain = trained_head1_top1(tiny_target, pair_data, tmp_path / "plain", next_token_input=False)
    reading = trained_head1_top1(tiny_target, pair_data, tmp_path / "reading", next_token_input=True)
    assert plain < 0.35, f"plain heads cannot know the next word, yet head-1 top-1 is {plain:.2f}"
    assert reading > 0.45 and reading > plain + 0.15, (
        f"next-token heads: head-1 top-1 {reading:.2f} vs plain {plain:.2f}"
    )


def test_model_card_states_the_next_token_input_and_counts_every_parameter():
    heads = random_heads(tiny_base_model("llama"), next_token_input=True)
    card = str(heads.generate_model_card())
    assert "next-token input" in card
    assert f"| parameters | {sum(p.numel() for p in heads.parameters()):,} (" in card
