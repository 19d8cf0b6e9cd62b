"""The sequential drafter: its file format, and that training computes what decoding computes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny_models import FAMILIES, tiny_base_model

from medusa_lite.artifacts.base import config_kind
from medusa_lite.drafters.growth import (
    DrafterCache,
    commit_pairs,
    expand_nodes,
    grow_candidates,
    ranked_nodes,
    tree_of_candidates,
)
from medusa_lite.drafters.sequential.drafter import DRAFTER_KIND, DrafterConfig, SequentialDrafter
from medusa_lite.errors import HeadsFileError
from medusa_lite.training.drafter_objective import DrafterObjective, unrolled_features
from medusa_lite.training.objective import LossSettings


def random_drafter(
    base,
    *,
    depth: int = 3,
    seed: int = 2,
    draft_vocab_size: int | None = None,
    scale: float = 0.3,
    feature_layers: list[int] | None = None,
) -> SequentialDrafter:
    """A drafter with random weights (fresh ones would also be random; a fixed seed makes tests repeatable)."""
    drafter = SequentialDrafter(
        DrafterConfig.for_model(base, depth=depth, draft_vocab_size=draft_vocab_size, feature_layers=feature_layers)
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            if "norm" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return drafter.eval()


def target_features(base, tokens: torch.Tensor, layers: list[int] | None = None) -> torch.Tensor:
    """The target's hidden states at ``layers`` side by side [T, H x k] (None: the final ones [T, H])."""
    with torch.no_grad():
        states = base(tokens[None], output_hidden_states=True).hidden_states
    return torch.cat([states[i][0] for i in layers or [-1]], dim=-1)


@pytest.mark.parametrize(
    "family, feature_layers", [(family, None) for family in FAMILIES] + [("llama", [2, 0, 1]), ("qwen2", [1])]
)
def test_training_unroll_equals_decoding_along_the_true_path(family, feature_layers):
    """Depth d of the training unroll at position t == decoding's expansion of the true path's depth-d node."""
    base = tiny_base_model(family)
    drafter = random_drafter(base, depth=3, feature_layers=feature_layers)
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    tokens = torch.randint(0, 128, (14,), generator=torch.Generator().manual_seed(0))
    hidden = target_features(base, tokens, feature_layers)
    with torch.no_grad():
        unrolled = unrolled_features(drafter, hidden[None], tokens[None], embed, depth=3)
        for t in (0, 4, 9):
            cache = DrafterCache.empty(drafter, tokens.device, torch.float32)
            cache, root = commit_pairs(drafter, cache, hidden[: t + 1], tokens[1 : t + 2], embed, lm_head)
            assert torch.allclose(root.feature, unrolled[0][0, t], rtol=1e-4, atol=1e-4)
            draft_k, draft_v = cache.keys[..., :0, :], cache.values[..., :0, :]
            feature, slots = root.feature, []
            for level in (1, 2):  # expand the depth-`level` node holding the true token x_{t+1+level}
                token = tokens[t + 1 + level].view(1)
                step = expand_nodes(
                    drafter, cache, draft_k, draft_v, feature[None], embed(token), cache.length - 1 + level, [slots]
                )
                assert torch.allclose(step.features[0], unrolled[level][0, t], rtol=1e-4, atol=1e-4), (t, level)
                slots = slots + [draft_k.shape[-2]]
                draft_k, draft_v = torch.cat([draft_k, step.keys], -2), torch.cat([draft_v, step.values], -2)
                feature = step.features[0]


def test_committing_in_pieces_equals_committing_at_once():
    """The cache after appending pairs step by step equals one forward over all of them (no prefix rerun needed)."""
    base = tiny_base_model("llama")
    drafter = random_drafter(base)
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    tokens = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(1))
    hidden = target_features(base, tokens)
    with torch.no_grad():
        whole, whole_root = commit_pairs(
            drafter,
            DrafterCache.empty(drafter, tokens.device, torch.float32),
            hidden[:11],
            tokens[1:12],
            embed,
            lm_head,
        )
        cache = DrafterCache.empty(drafter, tokens.device, torch.float32)
        for start, end in ((0, 5), (5, 6), (6, 11)):
            cache, root = commit_pairs(drafter, cache, hidden[start:end], tokens[start + 1 : end + 1], embed, lm_head)
    assert cache.length == whole.length == 11
    assert torch.allclose(cache.keys, whole.keys, atol=1e-5) and torch.allclose(
        root.logits, whole_root.logits, atol=1e-4
    )


def successor_drafter(base) -> SequentialDrafter:
    """A drafter that ignores the feature and attention and guesses successor(token) = token + 1 (mod V).

    The target's lm_head is rewritten so that row s(t) points along t's normalised embedding: the
    drafted token at depth d is then a function of the drafted token at depth d - 1 only.
    """
    drafter = SequentialDrafter(DrafterConfig.for_model(base, depth=4))
    hidden = drafter.config.hidden_size
    embed = base.get_input_embeddings().weight
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.zero_()
        for norm in (
            drafter.feature_norm,
            drafter.token_norm,
            drafter.attention_norm,
            drafter.mlp_norm,
            drafter.output_norm,
        ):
            norm.weight.fill_(1.0)
        drafter.fuse.weight[:, hidden:] = torch.eye(hidden)  # output = normalised token embedding
        directions = embed / embed.norm(dim=-1, keepdim=True)
        base.get_output_embeddings().weight.copy_(directions.roll(1, dims=0) * 10)  # row t+1 = direction of t
    return drafter.eval()


def test_depth_d_reads_the_token_drafted_at_depth_d_minus_1():
    base = tiny_base_model("llama")
    drafter = successor_drafter(base)
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    tokens = torch.tensor([5, 17, 40, 41, 90])
    with torch.no_grad():
        cache, root = commit_pairs(
            drafter,
            DrafterCache.empty(drafter, tokens.device, torch.float32),
            target_features(base, tokens)[:4],
            tokens[1:],
            embed,
            lm_head,
        )
        candidates = grow_candidates(drafter, cache, root, int(tokens[-1]), embed, lm_head, depth=4, topk=2)
    best_chain, node = [], ranked_nodes(candidates)[0]
    deepest = max(range(len(candidates.tokens)), key=lambda n: (candidates.depths[n], candidates.scores[n]))
    node = deepest
    while node != 0:
        best_chain.append(candidates.tokens[node])
        node = candidates.parents[node]
    assert candidates.depths[deepest] == 4
    assert best_chain[::-1] == [91, 92, 93, 94], (
        "each depth must draft the successor of the token drafted just above it"
    )


def test_candidate_tree_is_ancestor_closed_and_ranked():
    base = tiny_base_model("qwen2")
    drafter = random_drafter(base, depth=4)
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    tokens = torch.randint(0, 128, (9,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache, root = commit_pairs(
            drafter,
            DrafterCache.empty(drafter, tokens.device, torch.float32),
            target_features(base, tokens)[:8],
            tokens[1:],
            embed,
            lm_head,
        )
        candidates = grow_candidates(drafter, cache, root, int(tokens[-1]), embed, lm_head, depth=4, topk=3)
    assert len(candidates.tokens) == 1 + 3 + 3 * 9  # k at depth 1, then k x k children per further depth
    ranked = ranked_nodes(candidates)
    kept = ranked[:10]
    for node in kept:
        assert candidates.parents[node] == 0 or candidates.parents[node] in kept
    draft = tree_of_candidates(candidates, kept, tokens.device)
    assert draft.num_nodes == 11 and int(draft.node_depths.max()) >= 2
    for i in range(1, draft.num_nodes):
        assert draft.node_depths[i] == draft.node_depths[draft.parents[i]] + 1
        siblings = [j for j in range(1, draft.num_nodes) if draft.parents[j] == draft.parents[i]]
        assert len({int(draft.tokens[j]) for j in siblings}) == len(siblings)


def test_save_load_roundtrip_records_kind(tmp_path):
    base = tiny_base_model("mistral")
    drafter = random_drafter(base, draft_vocab_size=64)
    drafter.set_draft_vocab(torch.arange(64) * 2)
    drafter.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["kind"] == DRAFTER_KIND
    assert config_kind(tmp_path / "config.json") == DRAFTER_KIND
    loaded = SequentialDrafter.from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert (tmp_path / "model.safetensors").stat().st_size < 400_000


def test_feature_layers_round_trip_and_are_checked(tmp_path):
    base = tiny_base_model("llama")
    drafter = random_drafter(base, feature_layers=[0, 2])
    assert drafter.reduce.weight.shape == (drafter.config.hidden_size, 2 * drafter.config.hidden_size)
    drafter.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["feature_layers"] == [0, 2]
    loaded = SequentialDrafter.from_pretrained(tmp_path)
    assert loaded.config.feature_layers == [0, 2]
    assert torch.equal(loaded.reduce.weight, drafter.reduce.weight)
    with pytest.raises(ValueError, match="width 64 .*got 32"):
        drafter.target_feature(torch.zeros(3, 32))
    for bad in ([], [1, 1], [-1], [True], "2"):
        with pytest.raises(ValueError, match="feature_layers"):
            DrafterConfig.for_model(base, feature_layers=bad)
    assert random_drafter(base).reduce is None  # the final hidden state: no reduce layer, files as before


def test_loading_a_mismatched_file_names_the_tensors(tmp_path):
    base = tiny_base_model("llama")
    random_drafter(base).save_pretrained(tmp_path)
    values = json.loads((tmp_path / "config.json").read_text())
    values["intermediate_size"] = 32
    (tmp_path / "config.json").write_text(json.dumps(values))
    with pytest.raises(HeadsFileError, match="gate_proj"):
        SequentialDrafter.from_pretrained(tmp_path)
    values["kind"] = "something-else"
    (tmp_path / "config.json").write_text(json.dumps(values))
    with pytest.raises(HeadsFileError, match="kind"):
        SequentialDrafter.from_pretrained(tmp_path)


def test_objective_counts_chain_accuracy_of_a_successor_oracle():
    """On text that is a successor chain, the successor drafter is right at every depth: chain accuracy 1."""
    base = tiny_base_model("llama")
    drafter = successor_drafter(base)
    objective = DrafterObjective(
        drafter, base.get_output_embeddings(), base.get_input_embeddings(), LossSettings(weights=[1.0, 0.8, 0.6])
    )
    input_ids = (torch.arange(20) + 30)[None]
    loss_mask = torch.ones_like(input_ids, dtype=torch.bool)
    hidden = target_features(base, input_ids[0])[None]
    with torch.no_grad():
        _, vector = objective(hidden, input_ids, loss_mask, topk=1)
    hits, counts = vector[-6:-3], vector[-3:]
    assert counts.tolist() == [18.0, 17.0, 16.0]
    assert hits.tolist() == counts.tolist()


def test_drafting_stops_where_the_frontier_cannot_pay_for_another_forward():
    base = tiny_base_model("qwen2")
    drafter = random_drafter(base, depth=4)
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    tokens = torch.randint(0, 128, (9,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache, root = commit_pairs(
            drafter,
            DrafterCache.empty(drafter, tokens.device, torch.float32),
            target_features(base, tokens)[:8],
            tokens[1:],
            embed,
            lm_head,
        )

        def grown(price: float):
            return grow_candidates(
                drafter, cache, root, int(tokens[-1]), embed, lm_head, depth=4, topk=3, expansion_price=price
            )

        full = grown(0.0)
        first_mass = sum(math.exp(full.scores[node]) for node in range(1, 4))  # depth 1: the frontier before level 1
        assert len(grown(first_mass * 1.01).tokens) == 1 + 3, "depth 1 only: the next depth could not pay"
        assert len(grown(first_mass * 0.99).tokens) > 1 + 3, "just under the price it drafts deeper"
        assert grown(0.0).tokens == full.tokens, "no price: every depth, as before"
