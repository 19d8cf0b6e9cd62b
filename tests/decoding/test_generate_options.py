"""model.generate's options (processors and stopping criteria) applied exactly, and MedusaModel.generate as a drop-in.

Greedy: every option gives the tokens of ``base_model.generate`` with the same option, on two
families, with heads that guess right (the oracle follows the option's own greedy text, so whole
chains are accepted and each node's prefix matters) and partly right (accepts and rejects). That
the test can fail is shown by processing every node with the committed text only, the mistake it
guards against: the output then differs. Sampling: a chi-square test against the exact
distribution under a repetition penalty (its power shown against that same mistake).
"""

from collections import Counter

import pytest
import torch
from exact_distribution import (
    ALPHA,
    LOGIT_SCALE,
    NEW_TOKENS,
    NUM_SAMPLES,
    chi_square_p_value,
    continuation,
    sampled_outputs,
)
from tiny_models import OracleMedusaModel, PartlyRightOracle, plain_greedy, random_heads, tiny_base_model
from tiny_tokenizer import make_tiny_tokenizer
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

import medusa_lite.decoding.options as options_module
from medusa_lite import GenerationInputError, MedusaModel, SamplingSettings, Tree, generate, logits_to_probs

FAMILIES = ("llama", "qwen2")
VOCAB = 96
NEW = 30
WIDE_TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


class NoRecentRepeat(LogitsProcessor):
    """A user's processor that reads the prefix: none of the last five tokens may come again."""

    def __call__(self, input_ids, scores):
        return scores.scatter(-1, input_ids[:, -5:], float("-inf"))


class StopAfterToken(StoppingCriteria):
    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def base_for(family: str, **kwargs):
    return tiny_base_model(family, vocab_size=VOCAB, seed=11, **kwargs)


def prompt_for(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, 8), generator=generator)


def oracle_models(base, reference: torch.Tensor) -> list[MedusaModel]:
    """Heads right along ``reference`` (whole chains accepted), and right only some of the time."""
    heads = random_heads(base, num_heads=3)
    return [
        OracleMedusaModel(base, heads, reference[0]).eval(),
        PartlyRightOracle(base, heads, reference[0], seed=3).eval(),
    ]


def option_cases(base) -> dict[str, dict]:
    """Each option, with a value that changes the plain greedy text of ``base``."""
    plain = plain_greedy(base, prompt_for(0), NEW)[0, 8:].tolist()
    return {
        "repetition_penalty": dict(repetition_penalty=1.8),
        "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
        "bad_words_ids": dict(bad_words_ids=[[plain[3]], [plain[6], plain[7]]]),
        "logits_processor": dict(logits_processor=[NoRecentRepeat()]),
        "stopping_criteria": dict(stopping_criteria=[StopAfterToken(plain[12])]),
    }


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("option", list(option_cases(base_for("llama"))))
def test_each_option_matches_model_generate_with_it(family, option):
    base = base_for(family)
    arguments = option_cases(base)[option]
    changed = 0
    for seed in range(3):
        prompt = prompt_for(seed)
        expected = plain_greedy(base, prompt, NEW, **arguments)
        changed += not torch.equal(expected, plain_greedy(base, prompt, NEW))
        for model in oracle_models(base, expected):
            for tree in (None, WIDE_TREE):
                out = generate(model, prompt, NEW, tree=tree, **arguments)
                assert torch.equal(out.sequences, expected), f"{family}/{option}/{type(model).__name__}: diverged"
            assert max(out.stats.tokens_per_step) > 1, "no guess was accepted: the prefixes were never tested"
    assert changed, f"{option} changes nothing on these prompts"


def test_min_new_tokens_keeps_going_past_eos():
    base = base_for("llama")
    prompt = prompt_for(1)
    early = plain_greedy(base, prompt, NEW)[0, 8 + 2]  # the third new token, made the EOS
    base.generation_config.eos_token_id = int(early)
    expected = plain_greedy(base, prompt, NEW, min_new_tokens=12)
    assert expected.shape[1] > 8 + 3, "min_new_tokens changes nothing here"
    assert plain_greedy(base, prompt, NEW).shape[1] == 8 + 3
    for model in oracle_models(base, expected):
        assert torch.equal(generate(model, prompt, NEW, min_new_tokens=12).sequences, expected)


def test_stop_strings_match_model_generate():
    tokenizer = make_tiny_tokenizer()
    base = tiny_base_model("llama", vocab_size=len(tokenizer), seed=11)
    prompt = torch.tensor([tokenizer.encode("the cat sat on the mat")])
    plain = plain_greedy(base, prompt, NEW)
    stop = tokenizer.decode(plain[0, prompt.shape[1] + 9 : prompt.shape[1] + 11])
    expected = plain_greedy(base, prompt, NEW, stop_strings=stop, tokenizer=tokenizer)
    assert expected.shape[1] < plain.shape[1], "the stop string stops nothing here"
    for model in oracle_models(base, plain):
        assert torch.equal(generate(model, prompt, NEW, stop_strings=stop, tokenizer=tokenizer).sequences, expected)
    with pytest.raises(GenerationInputError, match="tokenizer"):
        generate(oracle_models(base, plain)[0], prompt, NEW, stop_strings=stop)


def committed_text_only(history, draft, depth):
    """The mistake the prefixes guard against: every node processed with the committed text alone."""
    nodes = torch.nonzero(draft.node_depths == depth).flatten()
    return nodes, history[None, :].expand(nodes.numel(), -1)


def test_a_node_processed_with_the_committed_text_alone_diverges(monkeypatch):
    """The greedy tests can fail: without each node's own prefix the output leaves model.generate's."""
    base = base_for("llama")
    prompt = prompt_for(0)
    arguments = dict(repetition_penalty=1.8)
    expected = plain_greedy(base, prompt, NEW, **arguments)
    monkeypatch.setattr(options_module, "node_prefixes", committed_text_only)
    try:
        diverged = not torch.equal(
            generate(oracle_models(base, expected)[0], prompt, NEW, **arguments).sequences, expected
        )
    except AssertionError as left_the_path:  # the oracle finds the text off the reference: diverged
        diverged = "not on the reference path" in str(left_the_path)
    assert diverged


# -- the drop-in ------------------------------------------------------------------------------------
def test_medusa_model_generate_is_a_drop_in_for_model_generate():
    base = base_for("qwen2")
    model = MedusaModel(base, random_heads(base, num_heads=3)).eval()
    prompt = prompt_for(2)
    inputs = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    config = GenerationConfig(max_new_tokens=NEW, repetition_penalty=1.4, no_repeat_ngram_size=3)
    expected = base.generate(**inputs, generation_config=config)
    assert torch.equal(model.generate(**inputs, generation_config=config), expected)
    assert torch.equal(
        model.generate(**inputs, max_new_tokens=NEW, repetition_penalty=1.4, no_repeat_ngram_size=3), expected
    )
    out = model.generate(prompt, generation_config=config, return_dict_in_generate=True)
    assert isinstance(out, GenerateDecoderOnlyOutput) and torch.equal(out.sequences, expected)
    # The target's own generation config is read as model.generate reads it (no length set: 20 new tokens).
    assert torch.equal(model.generate(prompt), base.generate(prompt, attention_mask=torch.ones_like(prompt)))


SCORED = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)


def assert_rows_close(rows, expected_rows, what: str):
    assert len(rows) == len(expected_rows), f"{what}: {len(rows)} rows for {len(expected_rows)} new tokens"
    for index, (row, expected) in enumerate(zip(rows, expected_rows, strict=True)):
        torch.testing.assert_close(row, expected, atol=1e-4, rtol=1e-4, msg=lambda m, i=index: f"{what}[{i}]: {m}")


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_scores_and_logits_are_model_generates(family):
    """output_scores / output_logits: one row per new token, as model.generate returns them, accepted guesses
    included (their rows come from the tree forward), under a processor that reads each token's prefix."""
    base = base_for(family)
    prompt = prompt_for(1)
    options = dict(max_new_tokens=NEW, repetition_penalty=1.4, no_repeat_ngram_size=3)
    expected = base.generate(prompt, attention_mask=torch.ones_like(prompt), **options, **SCORED)
    for model in oracle_models(base, expected.sequences):
        out = model.generate(prompt, **options, **SCORED)
        assert torch.equal(out.sequences, expected.sequences)
        assert_rows_close(out.scores, expected.scores, f"{family} scores")
        assert_rows_close(out.logits, expected.logits, f"{family} logits")
    assert not torch.equal(expected.scores[5], expected.logits[5]), "the processors changed no score: untested"


def test_sampled_scores_are_the_warped_scores_model_generate_returns_at_each_prefix():
    """Sampling: each new token's scores (processors, then temperature / top-k / top-p) and raw logits equal
    what model.generate returns for its first token from that token's own prefix."""
    base = base_for("llama")
    model = MedusaModel(base, random_heads(base, num_heads=3)).eval()
    prompt = prompt_for(2)
    options = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3)
    out = model.generate(prompt, max_new_tokens=12, generator=torch.Generator().manual_seed(0), **options, **SCORED)
    new_tokens = out.sequences.shape[1] - prompt.shape[1]
    assert len(out.scores) == len(out.logits) == new_tokens == 12
    for index in range(new_tokens):
        prefix = out.sequences[:, : prompt.shape[1] + index]
        first = base.generate(prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=1, **options, **SCORED)
        assert_rows_close([out.scores[index]], first.scores, f"scores at token {index}")
        assert_rows_close([out.logits[index]], first.logits, f"logits at token {index}")
    assert any(torch.isinf(row).any() for row in out.scores), "top-k / top-p removed nothing: the warpers untested"


def test_scores_come_only_when_asked_and_stop_with_the_tokens():
    base = base_for("llama")
    model = MedusaModel(base, random_heads(base, num_heads=3)).eval()
    prompt = prompt_for(0)
    assert generate(model, prompt, 5).scores is None and generate(model, prompt, 5).logits is None
    stop_token = int(plain_greedy(base, prompt, NEW)[0, 8 + 6])
    out = model.generate(prompt, max_new_tokens=NEW, stopping_criteria=[StopAfterToken(stop_token)], **SCORED)
    assert len(out.scores) == len(out.logits) == out.sequences.shape[1] - prompt.shape[1] <= 7


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(num_beams=2), "num_beams=2"),
        (dict(num_return_sequences=2), "num_return_sequences=2"),
        (dict(output_attentions=True), "output_attentions=True"),
        (dict(typical_p=0.5, do_sample=True), "typical_p=0.5"),
        (dict(colour="red"), "colour"),
        (dict(do_sample=True, temperature=0.0), "temperature"),
        (dict(max_length=4), "max_length=4"),
    ],
)
def test_options_it_cannot_apply_are_refused_by_name(options, named):
    base = base_for("llama")
    model = MedusaModel(base, random_heads(base, num_heads=2)).eval()
    with pytest.raises(GenerationInputError, match=named):
        model.generate(prompt_for(0), **({"max_new_tokens": 5} if "max_length" not in options else {}), **options)


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size"),
        (dict(bad_words_ids=[[-3]]), "bad_words_ids"),
        (dict(logits_processor=["not a processor"]), "logits_processor"),
        (dict(max_time=0), "max_time"),
        (dict(stop_strings=[""], tokenizer=object()), "stop_strings"),
    ],
)
def test_bad_option_values_are_named(options, named):
    base = base_for("llama")
    model = MedusaModel(base, random_heads(base, num_heads=2)).eval()
    with pytest.raises(GenerationInputError, match=named):
        generate(model, prompt_for(0), 5, **options)


# -- sampling ---------------------------------------------------------------------------------------
PENALTY = 2.0
# Token 0 alone: tokens 1 and 2 are penalised only once the continuation holds them, so a node's
# path decides its distribution.
PENALTY_PROMPT = torch.tensor([[0, 0]])
FULL_TREE = Tree.from_paths([(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)])


def penalised_distribution(base, settings: SamplingSettings) -> dict[tuple[int, ...], float]:
    """P(first NEW_TOKENS tokens after PENALTY_PROMPT) under the repetition penalty, enumerated with full forwards."""
    processor = RepetitionPenaltyLogitsProcessor(PENALTY)
    probs = {(): 1.0}
    for _ in range(NEW_TOKENS):
        prefixes = list(probs)
        continuations = torch.tensor(prefixes, dtype=torch.long).view(len(prefixes), -1)
        batch = torch.cat([PENALTY_PROMPT.repeat(len(prefixes), 1), continuations], dim=1)
        with torch.no_grad():
            scores = processor(batch, base(batch).logits[:, -1].float())
        next_probs = logits_to_probs(scores, settings)
        probs = {
            prefix + (t,): probs[prefix] * float(next_probs[i, t])
            for i, prefix in enumerate(prefixes)
            for t in range(base.config.vocab_size)
        }
    return probs


def penalised_counts(model, settings: SamplingSettings, seed: int) -> Counter:
    runs = sampled_outputs(
        model,
        PENALTY_PROMPT,
        NEW_TOKENS,
        settings,
        NUM_SAMPLES,
        seed,
        tree=FULL_TREE,
        lookup_tokens=0,
        repetition_penalty=PENALTY,
    )
    return Counter(continuation(out, PENALTY_PROMPT) for out in runs)


@pytest.fixture(scope="module")
def three_token_model():
    base = tiny_base_model("llama", vocab_size=3, seed=42, logit_scale=LOGIT_SCALE)
    return MedusaModel(base, random_heads(base, num_heads=2, seed=43)).eval()


def test_sampling_with_a_repetition_penalty_is_exact(three_token_model):
    """3,000 samples of 4 tokens (81 outcomes), chi-square at alpha 1e-3 against the enumerated distribution."""
    settings = SamplingSettings(1.0)
    exact = penalised_distribution(three_token_model.base_model, settings)
    p_value = chi_square_p_value(penalised_counts(three_token_model, settings, seed=1), exact, NUM_SAMPLES)
    assert p_value > ALPHA, f"samples differ from the penalised target's distribution (p={p_value:.2e})"


def test_the_penalty_chi_square_has_power(three_token_model, monkeypatch):
    """The same test rejects the samples of nodes processed with the committed text alone."""
    settings = SamplingSettings(1.0)
    exact = penalised_distribution(three_token_model.base_model, settings)
    monkeypatch.setattr(options_module, "node_prefixes", committed_text_only)
    p_value = chi_square_p_value(penalised_counts(three_token_model, settings, seed=2), exact, NUM_SAMPLES)
    assert p_value < ALPHA
