"""``load(model, heads=<drafter folder>)``: the kind recorded in config.json picks the drafter."""

from __future__ import annotations

import pytest
import torch
from tiny_models import plain_greedy, tiny_base_model

from medusa_lite import DynamicTree, Tree, TreeError, generate, load
from medusa_lite.cpu import prepack
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.drafters.sequential.proposer import SequentialDrafterProposer
from medusa_lite.proposers.base import StepLimits

POLICY = DynamicTree(7, tuple(1.0 + 0.1 * rows for rows in range(12)), tokens_per_cost=1.0)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafter-artifact")
    base = tiny_base_model("qwen2", logit_scale=4.0)
    base.save_pretrained(root / "target")
    drafter = SequentialDrafter(DrafterConfig.for_model(base, depth=3))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            if "norm" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    drafter.save_pretrained(root / "drafter")
    return root / "target", root / "drafter", base


def test_load_picks_the_drafter_by_its_kind_and_decodes_exactly(folders):
    target, drafter_folder, base = folders
    model, _ = load(target, heads=drafter_folder, tree=POLICY, datastore=False)
    assert model.heads is None
    drafters = [p for p in model.proposers if isinstance(p, SequentialDrafterProposer)]
    assert len(drafters) == 1 and drafters[0].costs is POLICY and drafters[0].max_new_nodes == 6
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    out = generate(model, prompt, 30, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 30, eos_token_id=None))
    assert out.stats.verified_rows > len(out.stats.tokens_per_step), "the drafter proposed nodes"


def test_load_takes_a_drafter_object_and_refuses_a_static_tree(folders):
    target, drafter_folder, _ = folders
    drafter = SequentialDrafter.from_pretrained(drafter_folder)
    model, _ = load(target, heads=drafter, tree=POLICY, datastore=False)
    assert any(isinstance(p, SequentialDrafterProposer) and p.drafter is drafter for p in model.proposers)
    with pytest.raises(TreeError, match="grows its own tree"):
        load(target, heads=drafter_folder, tree=Tree.from_paths([[0], [0, 0]]))


def test_without_a_policy_the_drafters_rows_and_drafting_are_priced_on_this_machine(folders, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_LITE_CACHE", str(tmp_path / "cache"))
    target, drafter_folder, base = folders
    model, _ = load(target, heads=drafter_folder, datastore=False)
    (drafter,) = [p for p in model.proposers if isinstance(p, SequentialDrafterProposer)]
    assert drafter.costs is not None and drafter.costs.row_costs != (1.0,), "measured, not the unmeasured placeholder"
    assert drafter.costs.proposal_cost > 0, "the drafter's own work is timed and priced"
    cached = list((tmp_path / "cache" / "costs").glob("*.json"))
    assert len(cached) == 1 and '"sequential-drafter"' in cached[0].read_text()
    running = drafter.begin(model, torch.zeros(4, dtype=torch.long), StepLimits(model, None))
    assert running.pricing is drafter.costs, "generate's speculation gate prices the drafter's steps"
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    out = generate(model, prompt, 24, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 24, eos_token_id=None))


def test_a_drafter_reading_several_target_layers_loads_is_priced_and_decodes_exactly(folders, tmp_path, monkeypatch):
    """load() + calibration + generate hand the drafter the layers its config names (the embeddings and layer 1 of
    this 2-layer target), not only the final hidden state."""
    monkeypatch.setenv("MEDUSA_LITE_CACHE", str(tmp_path / "cache"))
    target, _, base = folders
    drafter = SequentialDrafter(DrafterConfig.for_model(base, depth=3, feature_layers=[0, 1]))
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            if "norm" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(6)) * 0.3)
    drafter.save_pretrained(tmp_path / "layers-drafter")
    model, _ = load(target, heads=tmp_path / "layers-drafter", datastore=False)
    (proposer,) = [p for p in model.proposers if isinstance(p, SequentialDrafterProposer)]
    assert proposer.drafter.config.feature_layers == [0, 1] and proposer.costs.proposal_cost > 0
    (cached,) = (tmp_path / "cache" / "costs").glob("*.json")
    assert '"feature_layers": [' in cached.read_text(), "costs are cached per drafter shape, its layers included"
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(8))
    out = generate(model, prompt, 30, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 30, eos_token_id=None))
    assert out.stats.verified_rows > len(out.stats.tokens_per_step), "the drafter proposed nodes"


@pytest.mark.skipif(not prepack.onednn_available(), reason="this PyTorch build has no oneDNN linear (x86-64)")
def test_the_drafter_multiplies_through_the_targets_onednn_path_and_stays_exact(folders, monkeypatch):
    """Without the row_gemm kernel the target's few-row products go through oneDNN, and the drafter's too."""
    monkeypatch.setattr(prepack, "default_backend", lambda: prepack.ONEDNN)
    target, drafter_folder, base = folders
    model, _ = load(target, heads=drafter_folder, tree=POLICY, datastore=False)
    (proposer,) = [p for p in model.proposers if isinstance(p, SequentialDrafterProposer)]
    assert prepack.prepack_backend(model.base_model) == prepack.ONEDNN
    assert prepack.prepack_backend(proposer.drafter) == prepack.ONEDNN
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(6))
    out = generate(model, prompt, 30, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 30, eos_token_id=None))


def test_the_drafters_one_row_products_take_the_packed_path_and_the_targets_do_not(folders):
    """One-token steps of the target stay PyTorch's own (plain decoding bit for bit); the drafter's guesses
    need not, so its one-row products (a step that commits one pair, a frontier of one node) are packed too."""
    target, drafter_folder, _ = folders
    model, _ = load(target, heads=drafter_folder, tree=POLICY, datastore=False, prepack=True)
    (proposer,) = [p for p in model.proposers if isinstance(p, SequentialDrafterProposer)]
    drafter_layers = [m for m in proposer.drafter.modules() if isinstance(m, prepack.PrepackedLinear)]
    target_layers = [m for m in model.base_model.modules() if isinstance(m, prepack.PrepackedLinear)]
    assert drafter_layers and target_layers
    with torch.inference_mode():  # as decoding runs
        assert all(layer.packed_path_applies(torch.zeros(1, layer.in_features)) for layer in drafter_layers)
        assert not any(layer.packed_path_applies(torch.zeros(1, layer.in_features)) for layer in target_layers)
        assert all(layer.packed_path_applies(torch.zeros(2, layer.in_features)) for layer in target_layers)
    # on row_gemm the drafter reads half the bytes (bfloat16 copies); the target's products stay float32's
    packed_dtypes = {layer.packed_weight.dtype for layer in drafter_layers if layer.packed_weight is not None}
    if prepack.prepack_backend(model.base_model) == prepack.ROW_GEMM:
        assert packed_dtypes == {torch.bfloat16}
        assert proposer.draft_lm_head is None or proposer.draft_lm_head.packed_weight.dtype == torch.bfloat16
        assert {layer.packed_weight.dtype for layer in target_layers} == {torch.float32}
