"""Draft vocabulary: heads that guess among D frequent tokens only (EAGLE-3's draft vocab).

Covers the heads artifact (round trip, strict loading, corrupt ids), the guesses (top-k over the
draft vocabulary mapped back to token ids, checked against brute force), exact greedy decoding,
the choice of the vocabulary, the loss and accuracy counting with targets outside it, and an end
to end tiny training run (live and cached hidden states).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import training_fixtures
from safetensors.torch import load_file, save_file
from tiny_models import OracleMedusaModel, plain_greedy, random_heads, tiny_base_model
from training_fixtures import REPO_ROOT, tiny_argv

from medusa_lite import DraftVocabError, HeadsFileError, MedusaConfig, MedusaHeads, MedusaModel, TreeError, generate
from medusa_lite.artifacts.base import DRAFT_IDS_NAME
from medusa_lite.commands import train as train_heads
from medusa_lite.drafters.draft_vocab import DraftLMHead
from medusa_lite.training.config import config_from_dict, load_config
from medusa_lite.training.data import Sample
from medusa_lite.training.draft_vocab import choose_draft_vocab, coverage, most_frequent_tokens, response_token_counts
from medusa_lite.training.errors import TrainingConfigError, TrainingDataError
from medusa_lite.training.losses import IGNORE, OUT_OF_DRAFT, HeadStats, head_loss, rank_hits, to_draft_targets
from medusa_lite.training.objective import HeadsObjective, LossSettings, Medusa2Objective, heads_logits

# pytest fixtures shared by the training tests (single_thread is autouse, for this module only)
tiny_target, pattern_data, single_thread = (
    training_fixtures.tiny_target,
    training_fixtures.pattern_data,
    training_fixtures.single_thread,
)

VOCAB = 64
DRAFT = 16
SHIPPED_HEADS = REPO_ROOT / "medusa_lite" / "assets" / "smollm2-135m-heads"


@pytest.fixture()
def base():
    return tiny_base_model("llama", vocab_size=VOCAB, seed=1, logit_scale=4.0)


def draft_ids(seed: int = 0, size: int = DRAFT, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:size]


def draft_heads(base, num_heads: int = 3, ids: torch.Tensor | None = None, seed: int = 1) -> MedusaHeads:
    """Random heads (as tiny_models.random_heads) that guess among ``ids`` only."""
    ids = draft_ids() if ids is None else ids
    config = MedusaConfig(
        num_heads=num_heads,
        hidden_size=base.config.hidden_size,
        vocab_size=base.config.vocab_size,
        draft_vocab_size=ids.numel(),
    )
    heads = MedusaHeads(config)
    heads.load_state_dict({**random_heads(base, num_heads, seed=seed).state_dict(), DRAFT_IDS_NAME: ids})
    return heads


# -- config and artifact --------------------------------------------------------------------------


def test_round_trip_keeps_the_draft_ids_strictly(base, tmp_path):
    heads = draft_heads(base)
    heads.save_pretrained(tmp_path / "heads")
    assert DRAFT_IDS_NAME in load_file(tmp_path / "heads" / "model.safetensors")
    assert json.loads((tmp_path / "heads" / "config.json").read_text())["draft_vocab_size"] == DRAFT
    assert "draft vocabulary" in (tmp_path / "heads" / "README.md").read_text()
    loaded = MedusaHeads.from_pretrained(tmp_path / "heads")
    assert loaded.config == heads.config and loaded.draft_token_ids.dtype == torch.long
    for name, tensor in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def corrupt_ids(folder, ids: torch.Tensor) -> None:
    weights = load_file(folder / "model.safetensors")
    weights[DRAFT_IDS_NAME] = ids
    save_file(weights, folder / "model.safetensors")


@pytest.mark.parametrize(
    "make_ids, message",
    [
        (
            lambda ids: torch.cat([ids[:-1], torch.tensor([VOCAB])]),
            rf"draft_token_ids holds token id {VOCAB}, outside the vocabulary \[0, {VOCAB}\)",
        ),
        (lambda ids: torch.cat([ids[:-1], torch.tensor([-3])]), r"draft_token_ids holds token id -3"),
        (lambda ids: torch.cat([ids[:-1], ids[:1]]), r"draft_token_ids repeats token ids \(1 duplicate"),
        (lambda ids: ids.float(), r"draft_token_ids must hold integer token ids, found dtype torch.float32"),
        (lambda ids: ids[:-1], r"wrong shapes draft_token_ids: expected \(16,\), found \(15,\)"),
    ],
    ids=["too-large", "negative", "duplicate", "float", "wrong-size"],
)
def test_corrupt_draft_ids_are_a_heads_file_error(base, tmp_path, make_ids, message):
    heads = draft_heads(base)
    heads.save_pretrained(tmp_path)
    corrupt_ids(tmp_path, make_ids(heads.draft_token_ids))
    with pytest.raises(HeadsFileError, match=message):
        MedusaHeads.from_pretrained(tmp_path)


def test_config_and_weights_must_agree_on_having_a_draft_vocab(base, tmp_path):
    random_heads(base).save_pretrained(tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    (tmp_path / "plain" / "config.json").write_text(json.dumps({**config, "draft_vocab_size": DRAFT}))
    with pytest.raises(HeadsFileError, match=r"missing tensors \['draft_token_ids'\]"):
        MedusaHeads.from_pretrained(tmp_path / "plain")
    draft_heads(base).save_pretrained(tmp_path / "draft")
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    (tmp_path / "draft" / "config.json").write_text(json.dumps({**config, "draft_vocab_size": None}))
    with pytest.raises(HeadsFileError, match=r"unexpected tensors \['draft_token_ids'\]"):
        MedusaHeads.from_pretrained(tmp_path / "draft")
    (tmp_path / "draft" / "config.json").write_text(json.dumps({**config, "draft_vocab_size": VOCAB + 1}))
    with pytest.raises(
        HeadsFileError,
        match=rf"draft_vocab_size must be None \(full vocabulary\) or an integer in \[1, vocab_size = {VOCAB}\]",
    ):
        MedusaHeads.from_pretrained(tmp_path / "draft")


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(draft_vocab_size=0), "draft_vocab_size must be None"),
        (dict(draft_vocab_size=VOCAB + 1), "draft_vocab_size must be None"),
        (dict(draft_vocab_size=True), "draft_vocab_size must be None"),
        (dict(draft_vocab_size=8, use_base_lm_head=False), "draft_vocab_size needs use_base_lm_head=True"),
    ],
)
def test_invalid_draft_vocab_configs_name_the_problem(values, message):
    with pytest.raises(ValueError, match=message):
        MedusaConfig(num_heads=2, hidden_size=8, vocab_size=VOCAB, **values)


def test_set_draft_vocab_checks_the_ids(base):
    heads = draft_heads(base)
    with pytest.raises(DraftVocabError, match="holds 15 ids but config.draft_vocab_size is 16"):
        heads.set_draft_vocab(draft_ids(size=15))
    with pytest.raises(DraftVocabError, match="repeats token ids"):
        heads.set_draft_vocab(torch.zeros(DRAFT, dtype=torch.long))
    with pytest.raises(DraftVocabError, match="no draft vocabulary"):
        random_heads(base).set_draft_vocab(draft_ids())


def test_shipped_heads_load_with_their_draft_vocab():
    heads = MedusaHeads.from_pretrained(SHIPPED_HEADS)
    assert heads.config.draft_vocab_size == heads.draft_token_ids.numel() == heads.config.guess_vocab_size
    assert heads.config.vocab_size == 49152 and heads.draft_token_ids.unique().numel() == heads.draft_token_ids.numel()


def test_heads_saved_without_a_draft_vocab_still_load(base, tmp_path):
    """Heads written before draft vocabularies existed (no draft_vocab_size key) load with the full vocabulary."""
    random_heads(base).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("draft_vocab_size", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    heads = MedusaHeads.from_pretrained(tmp_path)
    assert heads.config.draft_vocab_size is None and heads.draft_token_ids is None
    assert heads.config.guess_vocab_size == heads.config.vocab_size
    assert DRAFT_IDS_NAME not in heads.state_dict()


# -- guesses ------------------------------------------------------------------------------------


def test_head_topk_is_the_full_vocab_topk_restricted_to_the_draft_ids(base):
    heads = draft_heads(base)
    model = MedusaModel(base, heads)
    hidden = torch.randn(5, base.config.hidden_size)
    k = 4
    guesses = model.head_topk(hidden, k)
    assert guesses.shape == (5, 3, k) and torch.isin(guesses, heads.draft_token_ids).all()
    # brute force: full-vocabulary logits, every non-draft token masked out
    full = base.get_output_embeddings()(heads(hidden))  # [5, 3, V]
    outside = ~torch.isin(torch.arange(VOCAB), heads.draft_token_ids)
    expected = full.masked_fill(outside, float("-inf")).topk(k, dim=-1).indices
    assert torch.equal(guesses, expected)
    assert model.head_logits(hidden).shape == (5, 3, DRAFT) and model.guess_vocab_size == DRAFT
    torch.testing.assert_close(model.head_logits(hidden), full[..., heads.draft_token_ids])


def test_the_draft_rows_are_gathered_once_and_never_saved(base):
    model = MedusaModel(base, draft_heads(base))
    assert isinstance(model.draft_lm_head, DraftLMHead)
    assert torch.equal(model.draft_lm_head.weight, base.get_output_embeddings().weight[model.heads.draft_token_ids])
    assert not any("draft_lm_head" in name for name in model.state_dict())
    # without one, decoding projects with the base lm_head as before
    assert MedusaModel(base, random_heads(base)).draft_lm_head is None


def test_a_permuted_full_draft_vocab_guesses_like_no_draft_vocab(base):
    plain = MedusaModel(base, random_heads(base, seed=4))
    permuted = MedusaModel(base, draft_heads(base, ids=draft_ids(seed=2, size=VOCAB), seed=4))
    hidden = torch.randn(7, base.config.hidden_size)
    assert torch.equal(permuted.head_topk(hidden, 5), plain.head_topk(hidden, 5))


def test_asking_more_guesses_than_the_draft_vocab_holds_is_a_tree_error(base):
    model = MedusaModel(base, draft_heads(base))
    with pytest.raises(TreeError, match=f"top-{DRAFT + 1} guesses but the heads guess among only {DRAFT} tokens"):
        model.head_topk(torch.randn(base.config.hidden_size), DRAFT + 1)
    with pytest.raises(TreeError, match=f"only {DRAFT} tokens"):
        generate(model, torch.tensor([[1, 2, 3]]), 4, tree=[[0], [DRAFT]])


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_decoding_with_draft_vocab_heads_is_identical_to_plain_generate(base, seed):
    model = MedusaModel(base, draft_heads(base, ids=draft_ids(seed=seed), seed=seed + 5))
    prompt = torch.tensor([[3, 17, 5, 42, 8]])
    out = generate(model, prompt, 24)
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 24))


class DraftOracle(OracleMedusaModel):
    """Oracle heads (always right when they can be) that guess among the draft vocabulary only."""

    def head_logits(
        self, hidden: torch.Tensor, num_heads: int | None = None, next_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        return super().head_logits(hidden, num_heads)[..., self.heads.draft_token_ids]


def test_right_guesses_from_the_draft_vocab_are_accepted(base):
    """head_topk maps draft indices back to the right token ids: an oracle's guesses all get accepted."""
    reference = plain_greedy(base, torch.tensor([[3, 17, 5]]), 30)[0]
    used = torch.unique(reference)
    fillers = torch.tensor([i for i in range(VOCAB) if i not in set(used.tolist())])
    ids = torch.cat([fillers[:DRAFT], used])[
        torch.randperm(DRAFT + used.numel(), generator=torch.Generator().manual_seed(0))
    ]
    model = DraftOracle(base, draft_heads(base, ids=ids), reference)
    out = generate(model, reference[None, :3], 30)
    assert torch.equal(out.sequences[0], reference)
    assert out.stats.mean_accepted_tokens > 3.0  # 3 heads right every step: ~4 tokens per target forward


# -- choosing the vocabulary --------------------------------------------------------------------


def sample(ids: list[int], mask: list[int]) -> Sample:
    return Sample(torch.tensor(ids), torch.tensor(mask, dtype=torch.bool))


def test_draft_vocab_is_the_most_frequent_response_tokens_ties_by_id():
    train = [sample([9, 9, 9, 9, 5, 5, 7, 7, 1], [0, 0, 1, 1, 1, 1, 1, 1, 1]), sample([3, 3, 5], [1, 1, 0])]
    counts = response_token_counts(train, vocab_size=10)
    assert counts.tolist() == [0, 1, 0, 2, 0, 2, 0, 2, 0, 2]  # prompt tokens (mask 0) are not counted
    assert most_frequent_tokens(counts, 4).tolist() == [3, 5, 7, 9]  # 2 each: ties by id
    assert most_frequent_tokens(counts, 5).tolist() == [3, 5, 7, 9, 1]
    # fewer distinct tokens than asked: never-seen ids fill up in id order
    assert most_frequent_tokens(counts, 8).tolist() == [3, 5, 7, 9, 1, 0, 2, 4]
    assert coverage(counts, torch.tensor([3, 5])) == pytest.approx(4 / 9)
    held_out = [sample([3, 3, 1, 2], [1, 1, 1, 1])]
    draft = choose_draft_vocab(train, held_out, vocab_size=10, size=4)
    assert (
        draft.token_ids.tolist() == [3, 5, 7, 9]
        and draft.train_coverage == pytest.approx(8 / 9)
        and draft.eval_coverage == pytest.approx(0.5)
    )
    assert choose_draft_vocab(train, [], 10, 4).eval_coverage is None
    # deterministic: the same data give the same ids
    assert torch.equal(
        choose_draft_vocab(train, held_out, 10, 6).token_ids, choose_draft_vocab(train, held_out, 10, 6).token_ids
    )


def test_token_ids_beyond_the_vocabulary_are_a_data_error():
    with pytest.raises(TrainingDataError, match="token id 12, outside the model's vocabulary of 10 tokens"):
        response_token_counts([sample([1, 12], [1, 1])], vocab_size=10)


# -- losses and accuracy ------------------------------------------------------------------------


def test_targets_map_to_draft_indices_with_a_miss_sentinel():
    ids = torch.tensor([7, 2, 5])
    targets = torch.tensor([[2, 7, IGNORE], [5, 3, 0]])
    assert to_draft_targets(targets, ids, vocab_size=8).tolist() == [[1, 0, IGNORE], [2, OUT_OF_DRAFT, OUT_OF_DRAFT]]


def test_out_of_draft_targets_count_as_misses_but_not_in_the_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(6, 2, 5, requires_grad=True)
    targets = torch.tensor([[0, 1], [OUT_OF_DRAFT, 2], [3, IGNORE], [4, OUT_OF_DRAFT], [OUT_OF_DRAFT, 0], [2, 3]])
    loss, stats = head_loss(logits, targets, lambda h: h, weights=torch.tensor([1.0, 0.5]), topk=5)
    assert stats.count.tolist() == [6, 5] and stats.ce_count.tolist() == [4, 4]
    ce = F.cross_entropy
    first, second = (
        ce(logits[[0, 2, 3, 5], 0], targets[[0, 2, 3, 5], 0]),
        ce(logits[[0, 1, 4, 5], 1], targets[[0, 1, 4, 5], 1]),
    )
    torch.testing.assert_close(loss, first + 0.5 * second)
    assert stats.mean_ce() == pytest.approx([first.item(), second.item()], rel=1e-5)  # over predictable targets only
    # every predictable target sits at some rank of 5 logits: top-5 accuracy = share of predictable targets
    assert stats.topk_cumulative() == pytest.approx([4 / 6, 4 / 5])
    assert rank_hits(logits.detach(), torch.full((6, 2), OUT_OF_DRAFT), 3)[0].sum() == 0


def test_heads_objective_with_a_draft_vocab_matches_brute_force(base):
    heads = draft_heads(base, num_heads=2)
    lm_head = base.get_output_embeddings()
    hidden = torch.randn(9, base.config.hidden_size)
    targets = torch.randint(0, VOCAB, (9, 2))
    targets[0, 0] = heads.draft_token_ids[3]  # at least one in and one out of the draft vocabulary
    targets[1, 0] = int(torch.nonzero(~torch.isin(torch.arange(VOCAB), heads.draft_token_ids))[0])
    targets[2, 1] = IGNORE
    logits = lm_head(heads(hidden))[..., heads.draft_token_ids]  # [9, 2, D]
    top1 = heads.draft_token_ids[logits.argmax(dim=-1)]
    targets[3:7, 0] = top1[3:7, 0]  # rows 3-6 right at head 1, rows 3-4 and 7 at head 2: a chain of 2 in rows 3-4
    targets[3:5, 1], targets[7, 1] = top1[3:5, 1], top1[7, 1]
    objective = HeadsObjective(heads, lm_head, LossSettings(weights=[1.0, 0.5]))
    loss, vector = objective(hidden, targets, topk=3)
    stats = HeadStats.from_vector(vector, 2, 3)
    torch.testing.assert_close(heads_logits(heads, heads(hidden), lm_head), logits)
    inside = torch.isin(targets, heads.draft_token_ids)
    expected, hits, right_so_far, chain = 0.0, [], torch.ones(9, dtype=torch.bool), []
    for k, weight in enumerate([1.0, 0.5]):
        rows = inside[:, k]
        draft_index = (targets[rows, k, None] == heads.draft_token_ids).float().argmax(dim=-1)
        expected = expected + weight * F.cross_entropy(logits[rows, k], draft_index)
        guesses = heads.draft_token_ids[logits[:, k].topk(3).indices]  # full ids, as decoding sees them
        hits.append([int(((guesses[:, r] == targets[:, k]) & (targets[:, k] != IGNORE)).sum()) for r in range(3)])
        right_so_far &= guesses[:, 0] == targets[:, k]  # a greedy chain: top-1 right at every head so far
        chain.append(int(right_so_far.sum()))
    torch.testing.assert_close(loss, expected)
    assert stats.rank_hits.tolist() == hits
    assert stats.chain_hits.tolist() == chain and chain[1] >= 2 and stats.chain_count.tolist() == [9, 8]
    assert stats.count.tolist() == [9, 8] and stats.ce_count.tolist() == inside.sum(dim=0).tolist()


def test_distillation_teacher_is_the_base_distribution_renormalised_on_the_draft_vocab(base):
    heads = draft_heads(base, num_heads=1)
    lm_head = base.get_output_embeddings()
    hidden, teacher_hidden = torch.randn(6, base.config.hidden_size), torch.randn(6, 1, base.config.hidden_size)
    targets = heads.draft_token_ids[torch.arange(6)][:, None]
    settings = LossSettings(weights=[1.0], distill_weight=1.0)
    loss, vector = HeadsObjective(heads, lm_head, settings)(hidden, targets, teacher_hidden)
    ids = heads.draft_token_ids
    student = F.log_softmax(lm_head(heads(hidden))[..., ids], dim=-1)
    teacher_full = F.softmax(lm_head(teacher_hidden), dim=-1)[..., ids]
    teacher = teacher_full / teacher_full.sum(dim=-1, keepdim=True)  # restricted and renormalised
    kl = (teacher * (teacher.log() - student)).sum(dim=-1).mean()
    ce = F.cross_entropy(student[:, 0], torch.arange(6), reduction="mean")
    torch.testing.assert_close(loss, ce + kl, rtol=1e-4, atol=1e-5)
    assert HeadStats.from_vector(vector, 1, 1).kl_sum.item() == pytest.approx(kl.item() * 6, rel=1e-4)


def test_medusa2_objective_maps_targets_to_the_draft_vocab(base):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    heads = draft_heads(base, num_heads=2)
    objective = Medusa2Objective(
        peft_model, heads, LossSettings(weights=[1.0, 1.0], distill_weight=0.5), base_distill_weight=1.0
    )
    ids = torch.randint(0, VOCAB, (2, 10))
    loss, vector = objective(ids, torch.ones_like(ids), torch.ones(2, 10, dtype=torch.bool), topk=2)
    stats = HeadStats.from_vector(vector[:-1], 2, 2)
    assert torch.isfinite(loss) and stats.count.tolist() == [16, 14]
    assert (stats.ce_count <= stats.count).all() and stats.rank_hits.sum() <= stats.ce_count.sum()


# -- training config and end to end ---------------------------------------------------------------


def test_training_config_key_is_typed_and_checked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: x.jsonl\ndraft_vocab_size: 8192\n")
    assert load_config(path).draft_vocab_size == 8192
    assert load_config(path, ["--draft_vocab_size", "null"]).draft_vocab_size is None
    assert load_config(path, ["--draft_vocab_size", "512"]).draft_vocab_size == 512
    with pytest.raises(TrainingConfigError, match="draft_vocab_size must be an integer"):
        load_config(path, ["--draft_vocab_size", "lots"])
    with pytest.raises(TrainingConfigError, match="draft_vocab_size must be >= 1"):
        config_from_dict({"data": "x", "draft_vocab_size": 0})
    with pytest.raises(TrainingConfigError, match="draft_vocab_size needs use_base_lm_head: true"):
        config_from_dict({"data": "x", "draft_vocab_size": 8, "use_base_lm_head": False})


def test_draft_vocab_larger_than_the_model_vocabulary_is_a_config_error(tiny_target, pattern_data, tmp_path):
    with pytest.raises(
        TrainingConfigError, match="draft_vocab_size 5000 exceeds the model's vocabulary of 384 tokens"
    ):
        train_heads.main(tiny_argv(tiny_target, pattern_data, tmp_path / "out", max_steps=1, draft_vocab_size=5000))


TINY_DRAFT = 12  # the pattern data's responses use 24 distinct tokens; the 12 most frequent cover ~95%


def test_training_with_a_draft_vocab_end_to_end(tiny_target, pattern_data, tmp_path):
    from transformers import AutoModelForCausalLM

    result = train_heads.main(
        tiny_argv(tiny_target, pattern_data, tmp_path / "out", max_steps=40, draft_vocab_size=TINY_DRAFT)
    )
    summary = result.summary
    assert summary["draft_vocab_size"] == TINY_DRAFT and 0.9 < summary["draft_vocab_coverage"] < 1.0
    assert 0.9 < summary["draft_vocab_eval_coverage"] < 1.0
    # held-out accuracy counts out-of-draft targets as misses: never above coverage, still far above chance
    assert all(a <= summary["draft_vocab_eval_coverage"] + 1e-9 for a in summary["top5_accuracy"])
    assert summary["top1_accuracy"][0] > 0.5
    heads = MedusaHeads.from_pretrained(result.heads_dir)
    assert heads.config.draft_vocab_size == TINY_DRAFT and heads.draft_token_ids.dtype == torch.long
    base = AutoModelForCausalLM.from_pretrained(tiny_target)
    model = MedusaModel(base, heads)
    prompt = torch.tensor([[5, 40, 77, 120]])
    out = generate(model, prompt, 20)
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 20))


def test_cached_and_live_training_agree_with_a_draft_vocab_and_distillation(tiny_target, pattern_data, tmp_path):
    runs = {}
    for cached in (False, True):
        argv = tiny_argv(
            tiny_target,
            pattern_data,
            tmp_path / f"cached-{cached}",
            max_steps=3,
            log_every=1,
            precompute_hidden=cached,
            distill_weight=0.5,
            draft_vocab_size=TINY_DRAFT,
        )
        runs[cached] = train_heads.main(argv)
    live, cached = ([e["train/loss"] for e in runs[c].history if "train/loss" in e] for c in (False, True))
    assert len(live) == len(cached) == 3
    torch.testing.assert_close(torch.tensor(cached), torch.tensor(live), rtol=2e-2, atol=0)
    assert runs[True].summary["draft_vocab_coverage"] == runs[False].summary["draft_vocab_coverage"]


def test_resume_keeps_the_checkpoints_draft_vocab_and_says_so_when_the_data_changed(
    tiny_target, pattern_data, tmp_path, capsys
):
    out = tmp_path / "out"
    first = train_heads.main(
        tiny_argv(tiny_target, pattern_data, out, max_steps=2, checkpoint_every=2, draft_vocab_size=TINY_DRAFT)
    )
    saved_ids = MedusaHeads.from_pretrained(first.heads_dir).draft_token_ids
    capsys.readouterr()
    other_data = training_fixtures.write_pattern_data(tmp_path / "other.jsonl", 80, seed=5, answer_words=6)
    resumed = train_heads.main(
        tiny_argv(tiny_target, other_data, out, max_steps=4, checkpoint_every=2, draft_vocab_size=TINY_DRAFT)
        + ["--resume"]
    )
    assert "the checkpoint's draft vocabulary differs" in capsys.readouterr().out
    assert torch.equal(MedusaHeads.from_pretrained(resumed.heads_dir).draft_token_ids, saved_ids)
