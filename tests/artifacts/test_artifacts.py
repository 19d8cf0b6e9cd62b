"""Heads on disk: round trip, strict loading, and clear errors for wrong or broken files."""

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from artifact_fixtures import adapted_reference, plain_target, save_adapter, save_medusa2_artifact
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from tiny_models import plain_greedy, random_heads, tiny_base_model

from medusa_lite import (
    HeadsFileError,
    IncompatibleHeadsError,
    MedusaConfig,
    MedusaError,
    MedusaHeads,
    MedusaModel,
    generate,
    load,
)
from medusa_lite.bench.measure import chat_input_ids
from medusa_lite.cli import main as cli_main
from medusa_lite.commands.options import EXIT_USAGE_ERROR
from medusa_lite.cpu.prepack import prepack_backend, prepack_supported
from medusa_lite.drafters.sequential.drafter import SequentialDrafter
from medusa_lite.errors import AdapterError, ArtifactNotFoundError
from medusa_lite.training import load_trained


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
    heads = MedusaHeads(
        MedusaConfig(num_heads=2, hidden_size=48, vocab_size=64, base_model_name_or_path="other/model")
    )
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


# -- a missing folder is not a Hub lookup; a missing repo says why -----------------------------


def assert_missing_folder(error: pytest.ExceptionInfo, folder, suggestion=None) -> None:
    assert isinstance(error.value, MedusaError) and isinstance(error.value, FileNotFoundError)
    assert not isinstance(error.value.__cause__, HFValidationError)
    message = str(error.value)
    assert f"{folder} does not exist" in message
    if suggestion is not None:
        assert f"did you mean {suggestion}?" in message


def test_absolute_typo_names_the_missing_folder_and_its_closest_sibling(saved):
    _, folder = saved
    typo = folder.with_name("heads_typo")
    with pytest.raises(ArtifactNotFoundError) as error:
        MedusaHeads.from_pretrained(str(typo))
    assert_missing_folder(error, typo, suggestion=folder)


def test_typo_in_a_parent_folder_names_the_deepest_existing_folder(tmp_path):
    missing = tmp_path / "run-typo" / "heads"
    with pytest.raises(
        ArtifactNotFoundError,
        match=re.escape(f"nor does {missing.parent}; the deepest existing folder is {tmp_path})"),
    ):
        MedusaHeads.from_pretrained(str(missing))


@pytest.mark.parametrize("typed", ["runs/heads_typo", "./runs/heads_typo", "runs/heads_typo/"])
def test_relative_typo_is_a_missing_folder_not_a_hub_repo(saved, tmp_path, monkeypatch, typed):
    heads, folder = saved
    runs = tmp_path / "runs"
    runs.mkdir()
    folder.rename(runs / "heads")
    monkeypatch.chdir(tmp_path)
    assert isinstance(MedusaHeads.from_pretrained("runs/heads"), MedusaHeads)  # the right path loads
    with pytest.raises(ArtifactNotFoundError) as error:
        MedusaHeads.from_pretrained(typed)
    assert_missing_folder(error, Path(typed), suggestion=Path(typed).parent / "heads")


def test_repo_missing_from_the_cache_offline_says_so(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "heads").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArtifactNotFoundError) as error:
        MedusaHeads.from_pretrained("heads_typo", cache_dir=tmp_path / "empty-cache")
    message = str(error.value)
    assert isinstance(error.value, FileNotFoundError) and not isinstance(error.value, LocalEntryNotFoundError)
    assert (
        "not a local folder" in message
        and "not in the local Hub cache" in message
        and "HF_HUB_OFFLINE is set" in message
    )
    assert "did you mean the local folder heads?" in message
    with pytest.raises(ArtifactNotFoundError, match=r"'org/medusa-heads'.*not in the local Hub cache.*HF_HUB_OFFLINE"):
        MedusaHeads.from_pretrained("org/medusa-heads", cache_dir=tmp_path / "empty-cache")


def test_a_file_where_a_folder_belongs_is_refused(saved):
    _, folder = saved
    with pytest.raises(ArtifactNotFoundError, match="config.json is a file; pass the folder"):
        MedusaHeads.from_pretrained(folder / "config.json")


def test_load_gives_the_same_clear_errors(tmp_path, monkeypatch):
    model_dir, heads_dir = save_medusa2_artifact(tmp_path)
    with pytest.raises(ArtifactNotFoundError) as error:
        load(model_dir, heads=str(heads_dir) + "_typo")
    assert_missing_folder(error, Path(str(heads_dir) + "_typo"), suggestion=heads_dir)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArtifactNotFoundError) as error:
        load("model", heads="./haeds")
    assert_missing_folder(error, Path("haeds"), suggestion=Path("heads"))
    with pytest.raises(ArtifactNotFoundError) as error:
        load("./modle", heads="heads")
    assert_missing_folder(error, Path("modle"), suggestion=Path("model"))


# -- a Medusa-2 artifact (heads + LoRA adapter) runs on the adapted model, or not at all ---------


@pytest.fixture()
def medusa2(tmp_path) -> tuple[Path, Path]:
    return save_medusa2_artifact(tmp_path)


def test_load_applies_the_artifacts_adapter(medusa2):
    model_dir, heads_dir = medusa2
    model, _ = load(model_dir, heads=heads_dir, prepack=False)
    prompt = torch.tensor([[5, 17, 40, 9, 33, 12]])
    plain_logits, adapted_logits = (
        plain_target(model_dir)(prompt).logits,
        adapted_reference(model_dir, heads_dir)(prompt).logits,
    )
    assert (plain_logits - adapted_logits).abs().max() > 0.1, "precondition: the adapter changes the target"
    logits = model.target_forward(prompt).logits
    torch.testing.assert_close(logits, adapted_logits, atol=1e-4, rtol=1e-4)
    assert (logits - plain_logits).abs().max() > 0.1


def test_greedy_decoding_of_an_adapted_artifact_equals_the_adapted_models_greedy(medusa2):
    model_dir, heads_dir = medusa2
    prompt = torch.tensor([[5, 17, 40, 9, 33, 12]])
    reference = adapted_reference(model_dir, heads_dir)
    expected = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    unadapted = plain_greedy(plain_target(model_dir), prompt, 24)
    assert not torch.equal(expected, unadapted), "precondition: the adapter changes the greedy output"
    model, _ = load(model_dir, heads=heads_dir, prepack=False, datastore=False)
    out = generate(model, prompt, 24, tree=[[0], [1], [0, 0], [0, 0, 0]], lookup_tokens=0)
    assert torch.equal(out.sequences, expected)
    assert sum(out.stats.accepted_at_depth) > 0, "the tree's guesses were verified and some accepted"


@pytest.mark.skipif(not prepack_supported(tiny_base_model()), reason="no packed path for float32 linears on this CPU")
def test_the_packed_fast_path_applies_to_the_adapted_target(medusa2):
    model_dir, heads_dir = medusa2
    model, _ = load(model_dir, heads=heads_dir, prepack=True, datastore=False)
    assert prepack_backend(model.base_model) is not None
    assert not any("lora" in name for name, _ in model.base_model.named_modules()), (
        "the adapter is merged, not wrapped"
    )
    prompt = torch.tensor([[5, 17, 40, 9, 33, 12]])
    expected = adapted_reference(model_dir, heads_dir).generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False
    )
    assert torch.equal(generate(model, prompt, 16).sequences, expected)


def test_load_trained_and_load_give_the_same_adapted_target(medusa2):
    model_dir, heads_dir = medusa2
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9]])
    from_trained = load_trained(heads_dir.parent, plain_target(model_dir))
    loaded, _ = load(model_dir, heads=heads_dir, prepack=False)
    torch.testing.assert_close(from_trained.target_forward(prompt).logits, loaded.target_forward(prompt).logits)


def test_heads_that_need_an_adapter_refuse_to_run_without_it(medusa2):
    model_dir, heads_dir = medusa2
    shutil.rmtree(heads_dir / "adapter")
    with pytest.raises(AdapterError, match=r"trained with a LoRA adapter.*has no adapter/adapter_config.json"):
        load(model_dir, heads=heads_dir)
    with pytest.raises(AdapterError, match="a heads module does not carry"):
        load(model_dir, heads=MedusaHeads.from_pretrained(heads_dir))


def test_an_adapter_beside_the_heads_folder_is_not_silently_ignored(medusa2):
    model_dir, heads_dir = medusa2
    edit_config(heads_dir, backbone_adapter=False)  # as a run saved before adapters moved into the heads folder
    (heads_dir / "adapter").rename(heads_dir.parent / "adapter")
    with pytest.raises(
        AdapterError,
        match="would decode with the unadapted model.*"
        + re.escape(f"mv {heads_dir.parent / 'adapter'} {heads_dir / 'adapter'}"),
    ):
        load(model_dir, heads=heads_dir)


def test_an_incomplete_adapter_is_refused(medusa2):
    model_dir, heads_dir = medusa2
    (heads_dir / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError, match="adapter_config.json but no adapter_model.safetensors"):
        load(model_dir, heads=heads_dir)


def test_an_adapter_for_another_model_is_refused(tmp_path):
    model_dir, heads_dir = save_medusa2_artifact(tmp_path)
    deeper = tiny_base_model(num_hidden_layers=3, vocab_size=plain_target(model_dir).config.vocab_size)
    shutil.rmtree(heads_dir / "adapter")
    save_adapter(deeper, heads_dir / "adapter")  # one layer more than the target
    with pytest.raises(AdapterError, match=r"does not fit the model .*unexpected tensors"):
        load(model_dir, heads=heads_dir)
    wider = tiny_base_model(hidden_size=48, vocab_size=plain_target(model_dir).config.vocab_size)
    shutil.rmtree(heads_dir / "adapter")
    save_adapter(wider, heads_dir / "adapter")
    with pytest.raises(AdapterError, match=r"does not fit the model .*size mismatch"):
        load(model_dir, heads=heads_dir)


def test_a_drafter_path_typo_is_the_same_clear_error(tmp_path):
    (tmp_path / "drafter").mkdir()
    with pytest.raises(ArtifactNotFoundError) as error:
        SequentialDrafter.from_pretrained(str(tmp_path / "drafterr"))
    assert_missing_folder(error, tmp_path / "drafterr", suggestion=tmp_path / "drafter")
    with pytest.raises(HeadsFileError, match="config.json is missing: a drafter folder holds"):
        SequentialDrafter.from_pretrained(tmp_path / "drafter")


def test_the_command_line_decodes_with_the_adapted_target(medusa2, capsys):
    model_dir, heads_dir = medusa2
    _, tokenizer = load(model_dir, heads=heads_dir, prepack=False)
    input_ids = chat_input_ids(tokenizer, "Why is the sky blue?")
    mask = torch.ones_like(input_ids)
    texts = {}
    for name, target in (("adapted", adapted_reference(model_dir, heads_dir)), ("plain", plain_target(model_dir))):
        sequence = target.generate(input_ids, attention_mask=mask, max_new_tokens=16, do_sample=False)[0]
        texts[name] = tokenizer.decode(sequence[input_ids.shape[1] :], skip_special_tokens=True).strip()
    assert texts["adapted"] and texts["adapted"] != texts["plain"], "precondition: the adapter changes the text"
    argv = ["--model", str(model_dir), "--heads", str(heads_dir), "--prompt", "Why is the sky blue?"]
    assert cli_main([*argv, "--max-new-tokens", "16", "--dtype", "fp32", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert texts["adapted"] in out and texts["plain"] not in out


def test_the_command_line_reports_a_heads_typo_as_a_usage_error(medusa2, capsys):
    model_dir, heads_dir = medusa2
    code = cli_main(["--model", str(model_dir), "--heads", str(heads_dir) + "s", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE_ERROR
    assert f"medusa-lite: error: Medusa heads folder {heads_dir}s does not exist; did you mean {heads_dir}?" in err
    assert "Traceback" not in err
