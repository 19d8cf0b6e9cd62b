"""Unit tests of the training pieces: alignment, masking, chunked loss, cache, config parsing."""

from __future__ import annotations

import pytest
import torch
import training_fixtures
from tiny_models import random_heads, tiny_base_model
from tiny_tokenizer import make_tiny_tokenizer

from medusa_lite.decoding.model import MedusaModel
from medusa_lite.training import hidden_cache
from medusa_lite.training.config import TrainConfig, config_from_dict, load_config, parse_overrides
from medusa_lite.training.data import Sample, batch_indices, collate, tokenize_conversation
from medusa_lite.training.errors import TrainingConfigError
from medusa_lite.training.losses import IGNORE, gather_rows, head_loss, head_targets
from medusa_lite.training.objective import HeadsObjective, LossSettings, heads_logits, last_hidden

# pytest fixtures shared by the training tests (single_thread is autouse, for this module only)
single_thread = training_fixtures.single_thread


def test_head_k_targets_the_token_k_plus_1_ahead_of_the_base_target():
    ids = torch.arange(10)[None]
    mask = torch.ones(1, 10, dtype=torch.bool)
    targets = head_targets(ids, mask, num_heads=3)
    # position n: base predicts n+1, head k predicts n+1+k
    assert targets[0, 0].tolist() == [2, 3, 4]
    assert targets[0, 6].tolist() == [8, 9, IGNORE]
    assert targets[0, 8].tolist() == [IGNORE, IGNORE, IGNORE]


def test_targets_only_on_response_tokens():
    ids = torch.arange(8)[None]
    mask = torch.tensor([[0, 0, 0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    targets = head_targets(ids, mask, num_heads=2)
    valid = {(n, k) for n in range(8) for k in range(2) if targets[0, n, k] != IGNORE}
    assert valid == {(2, 0), (3, 0), (1, 1), (2, 1)}
    assert targets[0, 2, 0] == 4 and targets[0, 3, 0] == 5 and targets[0, 1, 1] == 4


def test_distillation_rows_read_the_base_at_n_plus_k():
    hidden = torch.arange(6, dtype=torch.float32)[None, :, None].expand(1, 6, 2)
    ids = torch.arange(6)[None]
    rows = gather_rows(hidden, ids, torch.ones(1, 6, dtype=torch.bool), num_heads=2, with_teacher=True)
    first = rows.hidden[0, 0].item()  # position 0
    assert first == 0 and rows.teacher_hidden[0, :, 0].tolist() == [1.0, 2.0]


def test_assistant_mask_covers_exactly_the_responses():
    tokenizer = make_tiny_tokenizer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the sun?"},
        {"role": "assistant", "content": "A star."},
        {"role": "user", "content": "And the sea?"},
        {"role": "assistant", "content": "Salt water."},
    ]
    ids, mask = tokenize_conversation(messages, tokenizer)
    response = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert response == "A star.<|im_end|>Salt water.<|im_end|>"
    assert ids == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]


def test_chunked_loss_equals_unchunked_loss_and_gradients():
    torch.manual_seed(0)
    head_hidden = torch.randn(37, 3, 8, requires_grad=True)
    targets = torch.randint(0, 20, (37, 3))
    targets[::5, 2] = IGNORE
    projection = torch.nn.Linear(8, 20, bias=False)
    weights = torch.tensor([0.8, 0.64, 0.512])
    results = []
    for chunk in (1024, 7):
        loss, stats = head_loss(head_hidden, targets, projection, weights=weights, chunk_size=chunk, topk=3)
        (grad,) = torch.autograd.grad(loss, head_hidden)
        results.append((loss.detach(), grad, stats.rank_hits.clone(), stats.ce_sum.clone()))
    (l1, g1, h1, c1), (l2, g2, h2, c2) = results
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(g1, g2)
    assert torch.equal(h1, h2)
    torch.testing.assert_close(c1, c2)


def test_loss_is_the_weighted_mean_cross_entropy():
    logits_hidden = torch.randn(5, 2, 4)
    targets = torch.tensor([[0, 1], [1, IGNORE], [2, 3], [3, 0], [0, IGNORE]])
    loss, stats = head_loss(logits_hidden, targets, lambda h: h, weights=torch.tensor([1.0, 0.5]), topk=2)
    ce = torch.nn.functional.cross_entropy
    expected = ce(logits_hidden[:, 0], targets[:, 0]) + 0.5 * ce(logits_hidden[[0, 2, 3], 1], targets[[0, 2, 3], 1])
    torch.testing.assert_close(loss, expected)
    assert stats.count.tolist() == [5, 3]


def test_last_hidden_is_what_the_inference_side_reads():
    base = tiny_base_model("llama")
    ids = torch.randint(0, 128, (2, 9))
    model = MedusaModel(base, random_heads(base, 2))
    expected = model.target_forward(ids).hidden
    torch.testing.assert_close(last_hidden(base, ids, torch.ones_like(ids)), expected)


def test_training_logits_match_medusa_model_head_logits():
    base = tiny_base_model("llama")
    heads = random_heads(base, 3)
    hidden = torch.randn(4, 32)
    objective = HeadsObjective(heads, base.get_output_embeddings(), LossSettings([1.0, 1.0, 1.0]))
    expected = MedusaModel(base, heads).head_logits(hidden)
    torch.testing.assert_close(heads_logits(heads, heads(hidden), objective.base_lm_head), expected)


def test_batches_cover_each_epoch_once_and_differ_between_ranks():
    seen = [
        i
        for step in range(3)
        for rank in range(2)
        for i in batch_indices(step, num_samples=12, batch_size=2, rank=rank, world_size=2, seed=0)
    ]
    assert sorted(seen) == list(range(12))
    assert batch_indices(3, num_samples=12, batch_size=2, rank=0, world_size=2, seed=0) != batch_indices(
        0, num_samples=12, batch_size=2, rank=0, world_size=2, seed=0
    )


def test_cache_span_keeps_every_row_a_head_or_distillation_reads():
    mask = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0], dtype=torch.bool)
    start, end = hidden_cache.cache_span(mask, num_heads=3)
    ids = torch.arange(11)[None]
    rows_needed = set()
    targets = head_targets(ids, mask[None], 3)
    for n in range(11):
        for k in range(3):
            if targets[0, n, k] != IGNORE:
                rows_needed |= {n, n + k + 1}
    assert rows_needed <= set(range(start, end)) and (start, end) == (2, 8)


def test_cache_round_trip_is_bfloat16_of_the_live_states(tmp_path):
    base = tiny_base_model("llama")
    samples = [
        Sample(torch.randint(0, 128, (n,)), torch.tensor([False] * (n // 2) + [True] * (n - n // 2)))
        for n in (9, 14, 11)
    ]

    def hidden_fn(batch):
        return last_hidden(base, batch["input_ids"], batch["attention_mask"])

    hidden_cache.build_cache(
        samples, hidden_fn, tmp_path, fingerprint_value="x", num_heads=2, hidden_size=32, batch_size=2
    )
    cache = hidden_cache.HiddenCache(tmp_path, samples, num_heads=2)
    batch = collate(samples)
    with torch.no_grad():
        live = hidden_fn(batch)
    cached = cache.batch_hidden([0, 1, 2], batch["input_ids"].shape[1])
    for i, (start, end) in enumerate(cache.spans):
        torch.testing.assert_close(cached[i, start:end].float(), live[i, start:end].to(torch.bfloat16).float())
    assert hidden_cache.estimate_cache_bytes(samples, 32, 2) == sum(e - s for s, e in cache.spans) * 32 * 2


def test_config_overrides_are_typed_and_dotted(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: x.jsonl\nlearning_rate: 1e-3\nlora:\n  r: 4\n")
    config = load_config(
        path,
        ["--epochs", "3", "--lora.r=16", "--use_base_lm_head", "false", "--head_loss_weights", "[1, 0.5, 0.25, 0.1]"],
    )
    assert (
        config.learning_rate == 1e-3
        and config.epochs == 3
        and config.lora.r == 16
        and config.use_base_lm_head is False
    )
    assert config.loss_weights() == [1.0, 0.5, 0.25, 0.1]
    assert parse_overrides(["--max-steps", "5"]) == {"max_steps": "5"}


def test_default_loss_weights_decay_geometrically():
    assert TrainConfig(data="x", num_heads=3).loss_weights() == pytest.approx([0.8, 0.64, 0.512])


@pytest.mark.parametrize(
    "values, message",
    [
        ({"data": "x", "epochs": "two"}, "epochs must be an integer"),
        (
            {"data": "x", "num_heads": 2, "head_loss_weights": [1.0]},
            "head_loss_weights has 1 entries but num_heads is 2",
        ),
        ({"data": "x", "lora": {"r": 4}, "precompute_hidden": True}, "precompute_hidden cannot be combined with lora"),
        ({"data": "x", "lora": {"rank": 4}}, "unknown config key(s) lora.rank"),
        ({"data": "x", "wandb": {}}, "wandb.project is required"),
        ({}, "data is required"),
        (
            {"data": "x", "mixed_precision": "bfloat16"},
            "mixed_precision must be one of ('no', 'bf16', 'fp16') or null",
        ),
    ],
)
def test_invalid_configs_name_the_problem(values, message):
    with pytest.raises(TrainingConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_dict(values)


class _SingleProcess:
    """Just what ``load_frozen_target`` asks of an Accelerator."""

    state = type("State", (), {"deepspeed_plugin": None})()
    device = torch.device("cpu")

    @staticmethod
    def main_process_first():
        import contextlib

        return contextlib.nullcontext()


@pytest.mark.parametrize(
    "dtype, bf16_units, expected",
    [("auto", False, torch.float32), ("auto", True, torch.bfloat16), ("bfloat16", False, torch.bfloat16)],
)
def test_bf16_targets_compute_in_float32_on_cpus_without_bf16_matrix_units_unless_asked(
    tmp_path, monkeypatch, dtype, bf16_units, expected
):
    from medusa_lite.training import setup
    from medusa_lite.training.setup import load_frozen_target

    monkeypatch.setattr(setup, "has_bf16_matrix_units", lambda: bf16_units)
    base = tiny_base_model("llama").to(torch.bfloat16)
    base.save_pretrained(tmp_path)
    make_tiny_tokenizer().save_pretrained(tmp_path)
    model, _ = load_frozen_target(TrainConfig(model=str(tmp_path), data="x", dtype=dtype), _SingleProcess())
    assert model.dtype == expected
    # the upcast keeps the stored weights exactly
    torch.testing.assert_close(
        model.get_output_embeddings().weight.to(torch.bfloat16), base.get_output_embeddings().weight, rtol=0, atol=0
    )
