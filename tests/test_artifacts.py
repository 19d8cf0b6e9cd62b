"""Heads on disk: round trip, strict loading, and clear errors for wrong or broken files."""

import json
import warnings

import pytest
import torch

from medusa_lite import HeadsFileError, IncompatibleHeadsError, MedusaConfig, MedusaHeads, MedusaModel, generate
from tiny_models import plain_greedy, random_heads, tiny_base_model


@pytest.fixture()
def base():
    return tiny_base_model("llama", vocab_size=64, seed=1)


@pytest.fixture()
def saved(base, tmp_path):
    heads = random_heads(base, num_heads=3, num_layers=2)
    heads.config.base_model_name_or_path = "org/tiny-llama"
    heads.save_pretrained(tmp_path / "heads")
    return heads, tmp_path / "heads"


def test_round_trip_is_identical(saved):
    heads, folder = saved
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in folder.iterdir()}
    assert "org/tiny-llama" in (folder / "README.md").read_text()
    loaded = MedusaHeads.from_pretrained(folder)
    assert loaded.config == heads.config
    for (name, a), (_, b) in zip(heads.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_heads_are_independent_modules():
    heads = MedusaHeads(MedusaConfig(num_heads=3, hidden_size=8, vocab_size=10))
    ids = {id(h) for h in heads.heads}
    weights = {h.blocks[0].linear.weight.data_ptr() for h in heads.heads}
    assert len(ids) == 3 and len(weights) == 3


def test_fresh_heads_are_identity_so_they_guess_like_the_base(base):
    model = MedusaModel.with_new_heads(base, num_heads=2)
    hidden = torch.randn(5, base.config.hidden_size)
    torch.testing.assert_close(model.head_logits(hidden)[:, 0], base.get_output_embeddings()(hidden))


def test_own_lm_heads_start_from_the_base_lm_head(base):
    model = MedusaModel.with_new_heads(base, num_heads=2, use_base_lm_head=False)
    for head in model.heads.heads:
        assert torch.equal(head.lm_head.weight, base.get_output_embeddings().weight)


def test_hidden_size_mismatch_names_both_sizes(base):
    heads = MedusaHeads(MedusaConfig(num_heads=2, hidden_size=48, vocab_size=64, base_model_name_or_path="other/model"))
    with pytest.raises(IncompatibleHeadsError, match=r"hidden size 48 but the model has hidden size 32.*other/model"):
        MedusaModel(base, heads)


def test_vocab_mismatch_names_both_sizes(base):
    heads = MedusaHeads(MedusaConfig(num_heads=2, hidden_size=32, vocab_size=100))
    with pytest.raises(IncompatibleHeadsError, match=r"vocab size 100 but the model's lm_head has 64 outputs"):
        MedusaModel(base, heads)


def test_other_base_model_name_warns_but_stays_exact(saved, base):
    _, folder = saved
    base.config._name_or_path = "org/another-llama"
    with pytest.warns(UserWarning, match="trained for 'org/tiny-llama' but are attached to 'org/another-llama'"):
        model = MedusaModel(base, MedusaHeads.from_pretrained(folder))
    prompt = torch.tensor([[1, 2, 3]])
    assert torch.equal(generate(model, prompt, 12).sequences, plain_greedy(base, prompt, 12))


def test_same_name_does_not_warn(saved, base):
    _, folder = saved
    base.config._name_or_path = "org/tiny-llama"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MedusaModel(base, MedusaHeads.from_pretrained(folder))


def test_missing_weights_file(saved):
    _, folder = saved
    (folder / "model.safetensors").unlink()
    with pytest.raises(HeadsFileError, match="model.safetensors is missing"):
        MedusaHeads.from_pretrained(folder)


def test_missing_config_file(saved):
    _, folder = saved
    (folder / "config.json").unlink()
    with pytest.raises(HeadsFileError, match="config.json is missing"):
        MedusaHeads.from_pretrained(folder)


def test_truncated_weights_file(saved):
    _, folder = saved
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(HeadsFileError, match="truncated or corrupt"):
        MedusaHeads.from_pretrained(folder)


def test_garbage_weights_file(saved):
    _, folder = saved
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(HeadsFileError, match="truncated or corrupt"):
        MedusaHeads.from_pretrained(folder)


def test_corrupt_config_json(saved):
    _, folder = saved
    (folder / "config.json").write_text('{"num_heads": 3, "hidden_')
    with pytest.raises(HeadsFileError, match="not valid JSON"):
        MedusaHeads.from_pretrained(folder)


def edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_haeds=3), r"unknown key\(s\) in Medusa heads config: \['num_haeds'\]"),
        (dict(num_heads=0), "num_heads must be a positive integer"),
        (dict(num_heads=4), r"missing tensors \['heads.3"),
        (dict(hidden_size=16), r"wrong shapes .*expected \(16, 16\), found \(32, 32\)"),
    ],
    ids=["unknown-key", "invalid-value", "more-heads-than-weights", "weights-of-another-shape"],
)
def test_config_that_disagrees_with_itself_or_the_weights(saved, changes, message):
    _, folder = saved
    edit_config(folder, **changes)
    with pytest.raises(HeadsFileError, match=message):
        MedusaHeads.from_pretrained(folder)


def test_folder_that_does_not_exist_is_not_a_silent_hub_lookup(tmp_path):
    with pytest.raises(Exception, match="does-not-exist"):
        MedusaHeads.from_pretrained(str(tmp_path / "does-not-exist"))
