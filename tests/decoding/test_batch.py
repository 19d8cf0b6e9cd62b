"""Batches (medusa_lite.decoding.batch): every row of a left-padded batch decodes exactly as it does alone.

Greedy: each row's tokens equal the target's own greedy ``generate`` of that prompt alone (fp32), with prompts
of different lengths, rows ending at different steps, every proposer, every tiny family, sliding windows and
options; the layout is ``model.generate``'s for the same batch. Sampling: a chi-square test per row, with the
power shown by a negative control. Bad batches: clear errors.
"""

from __future__ import annotations

import pytest
import torch
from artifact_fixtures import fresh_kind_folder
from batch_checks import PAD, alone, an_eos_that_ends_rows_early, assert_each_row_as_alone
from distribution_check import ALPHA, chi_square_p_value, exact_distribution
from tiny_models import FAMILIES, PartlyRightOracle, plain_greedy, random_heads, tiny_base_model

import medusa_lite.decoding.acceptance
import medusa_lite.decoding.batch
import medusa_lite.decoding.generate
from medusa_lite import (
    DraftModelProposer,
    DynamicTree,
    GenerationInputError,
    LookaheadProposer,
    MedusaModel,
    SamplingSettings,
    Tree,
    generate,
    load,
)
from medusa_lite.bench.measure import left_padded
from medusa_lite.decoding.inputs import MAX_BATCH_SIZE
from medusa_lite.drafters.medusa.proposer import useful_nodes
from medusa_lite.proposers.base import SideRows
from medusa_lite.proposers.datastore import Datastore
from medusa_lite.trees.draft import DraftTree, Draw, chain_draft, draft_prefix, draft_tree, graft
from medusa_lite.trees.dynamic_tree import BatchCosts

VOCAB = 96
NEW_TOKENS = 24
LENGTHS = (3, 11, 1, 7, 16, 5)  # prompts of different lengths, the longest unpadded
TREE = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
# Each row 0.05 dearer: a dynamic tree keeps several of the partly-right heads' guesses.
DYNAMIC_TREE = DynamicTree(6, tuple(1.0 + 0.05 * rows for rows in range(16)), tokens_per_cost=0.5)


def random_prompts(lengths, seed: int = 0, vocab: int = VOCAB) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=generator) for length in lengths]


def padded(prompts: list[torch.Tensor]) -> dict:
    ids, mask = left_padded(prompts, PAD)
    return dict(input_ids=ids, attention_mask=mask)


class PartlyRightOnEveryRow(MedusaModel):
    """Partly-right oracle heads for several references at once: each hidden state is answered by the oracle of the
    reference it lies on (so every row accepts guesses of its own, right some of the time)."""

    def __init__(self, base_model, heads, references):
        super().__init__(base_model, heads)
        self.oracles = [PartlyRightOracle(base_model, heads, ref, seed=i) for i, ref in enumerate(references)]

    def head_logits(self, hidden, num_heads=None, next_tokens=None):
        distance = [float((oracle.reference_hidden - hidden).abs().amax(dim=-1).min()) for oracle in self.oracles]
        oracle = self.oracles[min(range(len(distance)), key=distance.__getitem__)]
        return oracle.head_logits(hidden, num_heads, next_tokens)


def oracle_model(base, prompts, new_tokens: int) -> PartlyRightOnEveryRow:
    references = [torch.cat([prompt, alone(base, prompt, new_tokens + 4, [])]) for prompt in prompts]
    return PartlyRightOnEveryRow(base, random_heads(base, num_heads=3, seed=4), references)


# -- greedy: every row as it decodes alone ----------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("heads", ["random", "oracle", "oracle-dynamic"])
def test_every_row_decodes_as_it_does_alone(family, heads):
    base = tiny_base_model(family, vocab_size=VOCAB, seed=3)
    prompts = random_prompts(LENGTHS, seed=1)
    eos = an_eos_that_ends_rows_early(base, prompts, NEW_TOKENS)
    if heads == "random":
        model, tree = MedusaModel(base, random_heads(base, num_heads=3, seed=4)), TREE
    else:
        model = oracle_model(base, prompts, NEW_TOKENS)
        tree = DYNAMIC_TREE if heads == "oracle-dynamic" else TREE
    out = generate(model, **padded(prompts), max_new_tokens=NEW_TOKENS, tree=tree, eos_token_id=eos, pad_token_id=PAD)
    counts = assert_each_row_as_alone(out, base, prompts, NEW_TOKENS, eos)
    assert len(set(counts)) > 1, "every row ended at the same step: the case is not reached"
    per_step = [tokens for stats in out.row_stats for tokens in stats.tokens_per_step]
    if heads != "random":
        assert max(per_step) > 2 and min(per_step) == 1, "rows did not accept different numbers of guesses"


def test_sixteen_rows_with_partly_right_heads():
    base = tiny_base_model("qwen2", vocab_size=VOCAB, seed=5)
    prompts = random_prompts([1 + (3 * b) % 13 for b in range(16)], seed=2)
    out = generate(oracle_model(base, prompts, 10), **padded(prompts), max_new_tokens=10, tree=TREE, eos_token_id=[])
    assert_each_row_as_alone(out, base, prompts, 10, [])
    assert out.stats.mean_tokens_per_step > 1.5


def test_the_layout_is_model_generates_for_the_same_batch():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    prompts = random_prompts(LENGTHS, seed=1)
    eos = an_eos_that_ends_rows_early(base, prompts, NEW_TOKENS)
    ids, mask = left_padded(prompts, PAD)
    out = generate(
        MedusaModel(base, random_heads(base, num_heads=3)),
        ids,
        NEW_TOKENS,
        attention_mask=mask,
        tree=TREE,
        eos_token_id=eos,
        pad_token_id=PAD,
    )
    expected = base.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=PAD
    )
    assert torch.equal(out.sequences, expected)
    drop_in = MedusaModel(base, random_heads(base, num_heads=3)).generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=PAD,
    )
    assert torch.equal(drop_in, expected), "MedusaModel.generate, called as model.generate is, differs"


def test_a_tokenizers_batch_encoding_goes_in_as_it_comes():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    prompts = random_prompts((4, 9), seed=3)
    ids, mask = left_padded(prompts, PAD)
    out = generate(
        MedusaModel(base, random_heads(base, num_heads=3)),
        {"input_ids": ids, "attention_mask": mask},
        NEW_TOKENS,
        eos_token_id=[],
    )
    assert_each_row_as_alone(out, base, prompts, NEW_TOKENS, [])


PROPOSERS = {
    "prompt-lookup": dict(tree=[], lookup_tokens=6, datastore=False),
    "datastore": dict(
        tree=[],
        lookup_tokens=0,
        datastore=Datastore.from_documents(random_prompts([40] * 4, seed=9, vocab=8), VOCAB),
    ),
    "draft-model": dict(
        proposers=[DraftModelProposer(tiny_base_model("llama", vocab_size=VOCAB, seed=3, num_hidden_layers=1), k=3)]
    ),
    "lookahead": dict(proposers=[LookaheadProposer(window=3, ngram_size=2, candidates=2)]),
}


@pytest.mark.parametrize("name", list(PROPOSERS))
def test_every_proposer_works_per_row(name):
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    # Repetitive prompts on a small alphabet, so the lookups find matches.
    prompts = [torch.randint(0, 8, (length,), generator=torch.Generator().manual_seed(length)) for length in LENGTHS]
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    out = generate(model, **padded(prompts), max_new_tokens=NEW_TOKENS, eos_token_id=[], **PROPOSERS[name])
    assert_each_row_as_alone(out, base, prompts, NEW_TOKENS, [])


@pytest.mark.parametrize("kind", ["hydra", "sequential"])
def test_every_drafter_kind_works_per_row(kind, tmp_path):
    target = tiny_base_model("qwen2", vocab_size=VOCAB, seed=3)
    target.save_pretrained(tmp_path / "target")
    model, _ = load(tmp_path / "target", heads=fresh_kind_folder(kind, target, tmp_path / kind), datastore=False)
    prompts = random_prompts(LENGTHS, seed=4)
    out = generate(model, **padded(prompts), max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert_each_row_as_alone(out, target, prompts, NEW_TOKENS, [])


def test_sliding_window_rows_past_the_window():
    base = tiny_base_model("mistral", vocab_size=VOCAB, seed=4, sliding_window=6)
    prompts = random_prompts(LENGTHS, seed=5)
    out = generate(
        oracle_model(base, prompts, NEW_TOKENS),
        **padded(prompts),
        max_new_tokens=NEW_TOKENS,
        tree=TREE,
        eos_token_id=[],
    )
    assert_each_row_as_alone(out, base, prompts, NEW_TOKENS, [])


def test_options_apply_per_row():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    prompts = random_prompts(LENGTHS, seed=6)
    eos = an_eos_that_ends_rows_early(base, prompts, NEW_TOKENS)
    options = dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=8)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    out = generate(model, **padded(prompts), max_new_tokens=NEW_TOKENS, tree=TREE, eos_token_id=eos, **options)
    assert_each_row_as_alone(out, base, prompts, NEW_TOKENS, eos, **options)


def test_finished_rows_leave_the_batch(monkeypatch):
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    prompts = random_prompts(LENGTHS, seed=1)
    eos = an_eos_that_ends_rows_early(base, prompts, NEW_TOKENS)
    widths = []
    verify = medusa_lite.decoding.batch.verify_batch

    def counting(model, cache, steps, committed, padding):
        widths.append((len(steps), cache.layers[0].keys.shape[0]))
        return verify(model, cache, steps, committed, padding)

    monkeypatch.setattr(medusa_lite.decoding.batch, "verify_batch", counting)
    out = generate(
        MedusaModel(base, random_heads(base, num_heads=3)),
        **padded(prompts),
        max_new_tokens=NEW_TOKENS,
        tree=TREE,
        eos_token_id=eos,
    )
    assert all(rows == cached for rows, cached in widths), "the cache holds rows of finished sequences"
    assert widths[0][0] == len(prompts) and widths[-1][0] < len(prompts)
    assert [rows for rows, _ in widths] == sorted((rows for rows, _ in widths), reverse=True)
    assert out.stats.target_calls == len(widths) + 1


def test_batch_stats_sum_the_rows():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    prompts = random_prompts(LENGTHS, seed=1)
    out = generate(
        oracle_model(base, prompts, NEW_TOKENS),
        **padded(prompts),
        max_new_tokens=NEW_TOKENS,
        tree=TREE,
        eos_token_id=[],
    )
    rows = out.row_stats
    assert out.stats.new_tokens == sum(row.new_tokens for row in rows) == len(prompts) * NEW_TOKENS
    assert out.stats.tokens_per_step == [tokens for row in rows for tokens in row.tokens_per_step]
    assert out.stats.verified_rows == sum(row.verified_rows for row in rows)
    assert out.stats.target_calls == 1 + max(row.steps for row in rows)


def test_one_left_padded_row_keeps_its_padding():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    prompt = random_prompts((6,), seed=7)[0]
    ids, mask = torch.cat([torch.zeros(3, dtype=torch.long), prompt])[None], torch.tensor([[0, 0, 0] + [1] * 6])
    out = generate(
        MedusaModel(base, random_heads(base, num_heads=3)), ids, NEW_TOKENS, attention_mask=mask, eos_token_id=[]
    )
    assert torch.equal(out.sequences[0, :3], ids[0, :3])
    assert torch.equal(out.sequences[0, 3:], plain_greedy(base, prompt[None], NEW_TOKENS)[0])


# -- the cost of a batch: speculation is priced per batch ---------------------------------------------
def test_a_fuller_batch_gets_smaller_trees_down_to_plain_steps():
    # A machine where rows cost little up to 8 (memory-bound) and then grow in proportion (compute-bound).
    costs = tuple(1.0 + 0.02 * (rows - 1) if rows <= 8 else 1.14 * rows / 8 for rows in range(1, 129))
    policy = DynamicTree(16, costs, tokens_per_cost=2.0)
    confident = [[0.9, 0.05, 0.02]] * 4  # each head's guesses' probabilities, best first
    nodes = [policy.for_batch(batch).choose(confident).num_nodes for batch in (1, 2, 4, 8, 16)]
    assert nodes == sorted(nodes, reverse=True) and nodes[0] >= 4, nodes
    assert nodes[-1] == 1, f"a batch that fills the machine should decode plainly ({nodes})"
    assert policy.for_batch(1) is policy
    assert useful_nodes(policy.for_batch(16), depth=4, rows_before=1) < useful_nodes(policy, depth=4, rows_before=1)


# -- sampling: each row follows the target's distribution --------------------------------------------
SAMPLE_VOCAB = 3
SAMPLE_TOKENS = 4
SAMPLE_PROMPTS = [torch.tensor([0, 2, 1]), torch.tensor([2, 2])]
COPIES = 10  # each prompt's copies per batch: a call gives 10 samples of each
NUM_CALLS = 300  # 3000 samples per prompt (the negative control below shows the power at this count)


@pytest.fixture(scope="module")
def sampling_model():
    base = tiny_base_model("llama", vocab_size=SAMPLE_VOCAB, seed=42, logit_scale=5.0)
    return MedusaModel(base, random_heads(base, num_heads=3, seed=43))


def batched_counts(model, settings: SamplingSettings, seed: int, tree=TREE) -> list[dict]:
    """Per prompt, how often each continuation came out of NUM_CALLS batched calls holding COPIES of each prompt."""
    ids, mask = left_padded([prompt for prompt in SAMPLE_PROMPTS for _ in range(COPIES)], PAD)
    generator = torch.Generator().manual_seed(seed)
    counts = [{} for _ in SAMPLE_PROMPTS]
    for _ in range(NUM_CALLS):
        out = generate(
            model,
            ids,
            SAMPLE_TOKENS,
            attention_mask=mask,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            tree=tree,
            lookup_tokens=3,
            eos_token_id=[],
            generator=generator,
        )
        for b, row in enumerate(out.sequences[:, ids.shape[1] :].tolist()):
            outcome = tuple(row)
            counts[b // COPIES][outcome] = counts[b // COPIES].get(outcome, 0) + 1
    return counts


@pytest.mark.parametrize("settings", [SamplingSettings(1.0), SamplingSettings(0.7, top_k=2)], ids=["T1.0", "T0.7-k2"])
def test_each_row_samples_the_targets_distribution(sampling_model, settings):
    samples = NUM_CALLS * COPIES
    for prompt, counts in zip(SAMPLE_PROMPTS, batched_counts(sampling_model, settings, seed=1)):
        exact = exact_distribution(sampling_model.base_model, prompt[None], SAMPLE_TOKENS, settings)
        p_value = chi_square_p_value(counts, exact, samples)
        assert p_value > ALPHA, f"prompt {prompt.tolist()}: batched samples differ from the target (p={p_value:.2e})"


def test_rows_cut_to_the_width_by_expected_tokens_sample_the_targets_distribution(sampling_model, monkeypatch):
    """A dynamic tree priced for the batch: each step's width by the rows' expected tokens per cost
    (medusa_lite.decoding.batch_width), some steps plain, some cut, some whole; every row still samples exactly."""
    costs = tuple(1.0 + 0.3 * rows for rows in range(16))
    monkeypatch.setattr(
        medusa_lite.decoding.generate,
        "batch_costs_for",
        lambda model, batch_size: lambda max_rows: BatchCosts(batch_size, costs[:max_rows], 1.0),
    )
    widths: list[int] = []
    choose = medusa_lite.decoding.batch.best_width
    monkeypatch.setattr(
        medusa_lite.decoding.batch, "best_width", lambda *args: widths.append(choose(*args)) or widths[-1]
    )
    settings = SamplingSettings(1.0)
    counts = batched_counts(sampling_model, settings, seed=3, tree=DynamicTree(6, costs, tokens_per_cost=0.5))
    assert 1 in widths and max(widths) > 1, f"the steps should be plain and wide by turns (widths {set(widths)})"
    for prompt, row_counts in zip(SAMPLE_PROMPTS, counts):
        exact = exact_distribution(sampling_model.base_model, prompt[None], SAMPLE_TOKENS, settings)
        p_value = chi_square_p_value(row_counts, exact, NUM_CALLS * COPIES)
        assert p_value > ALPHA, f"prompt {prompt.tolist()}: batched samples differ from the target (p={p_value:.2e})"


def test_the_per_row_test_has_power(sampling_model):
    """Negative control at the same sample count: batched rows drawn at temperature 0.8, tested against the target at
    1.0 (a distribution only slightly wrong), must be rejected; so the test above is able to fail."""
    model = sampling_model
    prompt = SAMPLE_PROMPTS[0][None]
    exact = exact_distribution(model.base_model, prompt, SAMPLE_TOKENS, SamplingSettings(1.0))
    biased = exact_distribution(model.base_model, prompt, SAMPLE_TOKENS, SamplingSettings(0.8))
    assert 0.5 * sum(abs(exact[k] - biased[k]) for k in exact) < 0.1, "the alternative should be close"
    counts = batched_counts(model, SamplingSettings(0.8), seed=2)
    assert chi_square_p_value(counts[0], exact, NUM_CALLS * COPIES) < ALPHA


# -- bad batches ---------------------------------------------------------------------------------------
BAD_BATCHES = {
    "right padding": (dict(input_ids=[[1, 2, 0]], attention_mask=[[1, 1, 0]]), "padding after their first token"),
    "a hole": (dict(input_ids=[[1, 2, 3]], attention_mask=[[1, 0, 1]]), "padding after their first token"),
    "all padding": (dict(input_ids=[[1, 2], [0, 0]], attention_mask=[[1, 1], [0, 0]]), r"row\(s\) \[1\] are all"),
    "mask shape": (dict(input_ids=[[1, 2], [3, 4]], attention_mask=[[1, 1]]), "attention_mask has shape"),
    "ragged lists": (dict(input_ids=[[1, 2, 3], [4]]), r"different lengths \[1, 3\]"),
    "too many rows": (dict(input_ids=[[1]] * (MAX_BATCH_SIZE + 1)), f"over the limit of {MAX_BATCH_SIZE}"),
    "a streamer": (dict(input_ids=[[1], [2]], streamer=type("S", (), {"put": print, "end": print})()), "streamer"),
    "scores": (dict(input_ids=[[1], [2]], output_scores=True), "output_scores work with one prompt only"),
    "a pad list": (dict(input_ids=[[1], [2]], pad_token_id=[0, 1]), "pad_token_id must be one token id"),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_bad_batches_are_named(case):
    arguments, message = BAD_BATCHES[case]
    model = MedusaModel(tiny_base_model("llama", vocab_size=VOCAB), None)
    with pytest.raises(GenerationInputError, match=message):
        generate(model, max_new_tokens=4, **arguments)


# -- the real model ------------------------------------------------------------------------------------
REAL_QUESTIONS = ("Why is the sky blue?", "Name three prime numbers.", "Write a haiku about rain.", "What is 2+2?")


@pytest.mark.integration
def test_the_default_model_decodes_a_batch_as_each_prompt_alone():
    """SmolLM2-135M-Instruct with its shipped heads (fp32): a tokenizer's left-padded chat batch, every row identical
    to plain greedy of its prompt alone."""
    model, tokenizer = load()
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in REAL_QUESTIONS
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    out = generate(model, **batch, max_new_tokens=48)
    width = batch["input_ids"].shape[1]
    for b, text in enumerate(texts):
        ids = tokenizer(text, return_tensors="pt").input_ids
        expected = model.base_model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False
        )[0, ids.shape[1] :]
        row = out.sequences[b, width:]
        assert torch.equal(row[: expected.numel()], expected), f"question {b} differs from decoding it alone"
    assert out.stats.mean_tokens_per_step > 1.3


# -- one width per step: a row far wider than the rest does not make every row pay for its guesses ----------
def draft_of(size: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (size,), generator=generator)
    draft = draft_tree(Tree.from_paths([(0,) * depth for depth in range(1, size)]), tokens)
    return graft(draft, drawn_branch(tokens[0], size, generator))


def drawn_branch(root, size: int, generator):
    """A second branch of drawn nodes under the root (sampling drafts carry their draws)."""
    tokens = torch.cat([root.reshape(1), torch.randint(0, VOCAB, (2,), generator=generator)])
    q = torch.full((VOCAB,), 1.0 / VOCAB)
    chain = chain_draft(root, tokens[1:], "heads")
    return DraftTree(
        chain.tokens,
        chain.parents,
        chain.node_depths,
        chain.ancestor_mask,
        chain.sources,
        (Draw(0, 1, q), Draw(1, 2, q)),
    )


def test_a_draft_prefix_is_a_tree_with_its_first_draws():
    draft = draft_of(5, seed=1)  # a chain of 5, then 2 drawn nodes at 5 and 6
    assert draft.num_nodes == 7 and [draw.node for draw in draft.draws] == [5, 6]
    cut = draft_prefix(draft, 6)
    assert torch.equal(cut.tokens, draft.tokens[:6]) and torch.equal(cut.ancestor_mask, draft.ancestor_mask[:6, :6])
    assert [draw.node for draw in cut.draws] == [5] and bool((cut.parents < 6).all())
    assert draft_prefix(draft, 7) is draft and draft_prefix(draft, 0).num_nodes == 1


def test_the_rows_steps_are_cut_to_the_upper_median_width():
    steps = [medusa_lite.decoding.batch.row_step(draft_of(size, seed=size), []) for size in (2, 4, 9, 12)]
    cut = medusa_lite.decoding.batch.within_shared_width(steps)
    assert [step.tokens.numel() for step in cut] == [4, 6, 11, 11]  # each draft has 2 drawn nodes more
    assert cut[:3] == steps[:3] and torch.equal(cut[3].tokens, steps[3].tokens[:11])
    pair = medusa_lite.decoding.batch.within_shared_width(steps[:1] + steps[3:])
    assert pair == steps[:1] + steps[3:], "two rows: the wider one sets the width"
    side = SideRows(torch.tensor([1, 2]), torch.tensor([1, 2]), torch.ones(2, 2, dtype=torch.bool).tril())
    with_side = medusa_lite.decoding.batch.row_step(draft_of(12, seed=12), [side])
    kept = medusa_lite.decoding.batch.within_shared_width(steps[:3] + [with_side])
    assert kept[3] is with_side, "a row with side rows keeps its step (its proposers read their logits by position)"
