"""Medusa heads exported for vLLM: the files its Medusa loader reads, guessing what medusa-lite's heads guess.

The loader's expectations are those of vLLM's ``vllm/model_executor/models/medusa.py`` and
``vllm/transformers_utils/configs/medusa.py`` (the tensor names it builds, the config keys it reads,
its renaming of keys holding "num" + "heads"/"layers", its residual block and token map), restated
here as :func:`vllm_medusa_guesses` so that the exported files are checked by meaning, not only by
name. The real engine runs them in the marked serving test (``make test-serving``).
"""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tiny_checkpoint import save_tiny_checkpoint
from tiny_models import plain_greedy, random_heads, tiny_base_model

from medusa_lite import MedusaConfig, MedusaHeads, MedusaModel, generate
from medusa_lite.cli import main as cli_main
from medusa_lite.drafters.hydra.heads import HydraConfig, HydraHeads
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.errors import ExportError, MedusaError
from medusa_lite.export import export_drafter
from medusa_lite.export.vllm_medusa import import_heads

VOCAB = 96
DRAFT_VOCAB = 40
# The keys vLLM's MedusaConfig takes (its __init__ and the getattr reads of medusa.py).
VLLM_CONFIG_KEYS = {
    "model_type",
    "architectures",
    "hidden_size",
    "vocab_size",
    "num_heads",
    "num_hidden_layers",
    "truncated_vocab_size",
    "medusa_fc_bias",
    "original_lm_head",
}


def draft_vocab_heads(base, seed: int = 3) -> MedusaHeads:
    config = MedusaConfig(
        num_heads=3, hidden_size=base.config.hidden_size, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB
    )
    heads = MedusaHeads(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    heads.set_draft_vocab(torch.randperm(VOCAB, generator=generator)[:DRAFT_VOCAB].sort().values)
    return heads


def vllm_medusa_guesses(folder, hidden: torch.Tensor, num_speculative_tokens: int) -> torch.Tensor:
    """vLLM's Medusa proposal from the files alone: each head's argmax over the full vocabulary [N, k]."""
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(folder / "model.safetensors")
    token_map = tensors.get("token_map")
    guesses = []
    for i in range(num_speculative_tokens):
        x = hidden
        for j in range(config["num_hidden_layers"]):
            bias = tensors[f"blocks.{i}.layers.{j}.bias"] if config["medusa_fc_bias"] else None
            x = x + F.silu(F.linear(x, tensors[f"blocks.{i}.layers.{j}.weight"], bias))
        weight = tensors["lm_head.weight"] if config["original_lm_head"] else tensors[f"lm_heads.{i}.weight"]
        if token_map is not None:  # vLLM takes the token map's rows, then scatters back: -inf elsewhere
            logits = torch.full((x.shape[0], config["vocab_size"]), float("-inf"))
            logits[:, token_map] = F.linear(x, weight[token_map])
        else:
            logits = F.linear(x, weight)
        guesses.append(logits.argmax(-1))
    return torch.stack(guesses, dim=-1)


def medusa_lite_guesses(heads: MedusaHeads, base, hidden: torch.Tensor, whole_vocabulary: bool) -> torch.Tensor:
    """Each head's top guess as a full-vocabulary token id [N, k]: as medusa-lite decodes it (among its draft
    vocabulary), or among the whole vocabulary through the shared lm_head."""
    if whole_vocabulary:
        return F.linear(heads(hidden), base.get_output_embeddings().weight).argmax(-1)
    return heads.guess_ids(heads.project(heads(hidden), base.get_output_embeddings()).argmax(-1))


def target_hidden(base, tokens: int = 12) -> torch.Tensor:
    prompt = torch.arange(tokens)[None] % VOCAB
    with torch.no_grad():
        return base(prompt, output_hidden_states=True).hidden_states[-1][0]


LAYOUTS = ["shared lm_head", "draft vocab, token_map", "draft vocab, whole vocabulary", "own lm_heads"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_exported_files_are_what_vllms_loader_reads_and_guess_what_the_heads_guess(layout, tmp_path):
    base = tiny_base_model(vocab_size=VOCAB, seed=5)
    heads = {
        "shared lm_head": lambda: random_heads(base, num_heads=3, num_layers=2),
        "draft vocab, token_map": lambda: draft_vocab_heads(base),
        "draft vocab, whole vocabulary": lambda: draft_vocab_heads(base),
        "own lm_heads": lambda: random_heads(base, num_heads=3, use_base_lm_head=False),
    }[layout]()
    token_map = layout == "draft vocab, token_map"
    record = export_drafter(heads, base.get_output_embeddings(), tmp_path, target="tiny-llama", token_map=token_map)
    config = json.loads((tmp_path / "config.json").read_text())
    assert set(config) - {"base_model_name_or_path"} == VLLM_CONFIG_KEYS
    renamed = [key for key in config if "num" in key and ("heads" in key or "layers" in key)]
    assert sorted(renamed) == ["num_heads", "num_hidden_layers"], "vLLM renames every other such key"
    assert config["vocab_size"] == VOCAB and config["hidden_size"] == base.config.hidden_size
    tensors = load_file(tmp_path / "model.safetensors")
    hidden_size = base.config.hidden_size
    for i in range(heads.config.num_heads):
        for j in range(heads.config.num_layers):
            assert tensors[f"blocks.{i}.layers.{j}.weight"].shape == (hidden_size, hidden_size)
            assert tensors[f"blocks.{i}.layers.{j}.bias"].shape == (hidden_size,)
    if config["original_lm_head"]:
        assert tensors["lm_head.weight"].shape == (VOCAB, hidden_size)
    else:
        assert all(tensors[f"lm_heads.{i}.weight"].shape == (VOCAB, hidden_size) for i in range(3))
    if token_map:
        assert config["truncated_vocab_size"] == DRAFT_VOCAB
        assert tensors["token_map"].dtype == torch.int64 and tensors["token_map"].shape == (DRAFT_VOCAB,)
    else:
        assert config["truncated_vocab_size"] == VOCAB and "token_map" not in tensors
    assert all(tensor.dtype in (torch.float32, torch.int64) for tensor in tensors.values())
    assert record["speculative_config"] == {
        "method": "medusa",
        "model": str(tmp_path.resolve()),
        "num_speculative_tokens": 3,
    }
    assert json.loads((tmp_path / "export.json").read_text()) == record

    hidden = target_hidden(base)
    with torch.no_grad():
        expected = medusa_lite_guesses(heads, base, hidden, whole_vocabulary=layout == "draft vocab, whole vocabulary")
        assert torch.equal(vllm_medusa_guesses(tmp_path, hidden, 3), expected)
        assert torch.equal(vllm_medusa_guesses(tmp_path, hidden, 2), expected[:, :2]), "fewer tokens: the first heads"


def test_export_then_import_decodes_identically(tmp_path):
    base = tiny_base_model(vocab_size=VOCAB, seed=5)
    heads = draft_vocab_heads(base)
    export_drafter(heads, base.get_output_embeddings(), tmp_path, token_map=True)
    back = import_heads(tmp_path)
    original, restored = heads.state_dict(), back.state_dict()
    assert original.keys() == restored.keys()
    assert all(torch.equal(original[name], restored[name]) for name in original)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    tree = [(0,), (1,), (0, 0), (0, 0, 0)]
    out = generate(MedusaModel(base, back), prompt, 20, tree=tree).sequences
    assert torch.equal(out, generate(MedusaModel(base, heads), prompt, 20, tree=tree).sequences)
    assert torch.equal(out, plain_greedy(base, prompt, 20))


def test_what_vllm_cannot_hold_is_refused_by_name(tmp_path):
    base = tiny_base_model(vocab_size=VOCAB, seed=5)
    lm_head = base.get_output_embeddings()
    with pytest.raises(ExportError, match="next_token_input"):
        export_drafter(random_heads(base, next_token_input=True), lm_head, tmp_path)
    adapted = random_heads(base)
    adapted.config.backbone_adapter = True
    with pytest.raises(ExportError, match="LoRA adapter"):
        export_drafter(adapted, lm_head, tmp_path)
    hydra = HydraHeads(HydraConfig(num_heads=2, hidden_size=base.config.hidden_size, vocab_size=VOCAB))
    drafter = SequentialDrafter(DrafterConfig.for_model(base, depth=2))
    for other in (hydra, drafter):
        with pytest.raises(ExportError, match="EAGLE-3"):
            export_drafter(other, lm_head, tmp_path)
    with pytest.raises(ExportError, match="no Medusa format"):
        export_drafter(random_heads(base), lm_head, tmp_path, format="sglang")
    with pytest.raises(ExportError, match="unknown export format"):
        export_drafter(random_heads(base), lm_head, tmp_path, format="onnx")
    biased = torch.nn.Linear(base.config.hidden_size, VOCAB, bias=True)
    with pytest.raises(ExportError, match="bias"):
        export_drafter(random_heads(base), biased, tmp_path)
    assert not (tmp_path / "config.json").exists(), "a refused export writes nothing"


def test_import_names_a_missing_tensor(tmp_path):
    base = tiny_base_model(vocab_size=VOCAB, seed=5)
    export_drafter(random_heads(base), base.get_output_embeddings(), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["blocks.1.layers.0.bias"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ExportError, match="lacks blocks.1.layers.0.bias"):
        import_heads(tmp_path)


def test_the_command_exports_a_heads_folder_for_its_target(tmp_path, capsys):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    out = tmp_path / "vllm"
    assert cli_main(["export", str(heads_dir), "--model", str(model_dir), "--out", str(out)]) == 0
    record = json.loads((out / "export.json").read_text())
    assert record["target"] == str(model_dir) and record["speculative_config"]["method"] == "medusa"
    assert f"speculative_config={json.dumps(record['speculative_config'])}" in capsys.readouterr().out
    assert (
        cli_main(["export", str(heads_dir), "--model", str(model_dir), "--out", str(out), "--format", "sglang"]) == 2
    )
    assert "no Medusa format" in capsys.readouterr().err


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda d: (d / "config.json").write_text("{not json"), "config.json cannot be read as JSON"),
        (lambda d: (d / "config.json").write_text("[1, 2]"), "not a vLLM Medusa config"),
        (lambda d: (d / "config.json").unlink(), "config.json does not exist"),
        (lambda d: edit_config(d, model_type="llama"), "model_type 'llama'"),
        (lambda d: edit_config(d, num_heads="3"), "lacks an integer num_heads"),
        (lambda d: edit_config(d, medusa_fc_bias=False), "medusa_fc_bias false"),
        (lambda d: truncate(d / "model.safetensors"), "model.safetensors is not a readable safetensors file"),
        (lambda d: (d / "model.safetensors").unlink(), "model.safetensors does not exist"),
        (
            lambda d: edit_tensor(d, "blocks.0.layers.0.weight", torch.zeros(3, 3)),
            "model.safetensors: .*wrong shapes heads.0.blocks.0.linear.weight",
        ),
    ],
)
def test_a_damaged_vllm_folder_is_refused_naming_the_file(damage, named, tmp_path):
    base = tiny_base_model(vocab_size=VOCAB, seed=5)
    export_drafter(random_heads(base), base.get_output_embeddings(), tmp_path)
    damage(tmp_path)
    with pytest.raises(MedusaError, match=named):
        import_heads(tmp_path)


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


def truncate(path):
    path.write_bytes(path.read_bytes()[:100])


def edit_tensor(folder, name, value):
    tensors = load_file(folder / "model.safetensors")
    save_file(tensors | {name: value}, folder / "model.safetensors")
