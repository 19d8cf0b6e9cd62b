"""The drafter registry: every kind is found by its name, its recorded kind and its artifact, and a new kind is one
entry: a toy kind registered here is read by ``load()`` from its folder, decodes exactly and round-trips."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch
from tiny_models import FAMILIES, plain_greedy, tiny_base_model
from torch import nn

from medusa_lite import DynamicTree, MedusaModel, generate, load
from medusa_lite.artifacts.base import HubArtifact
from medusa_lite.artifacts.hub import push_heads_to_hub
from medusa_lite.artifacts.loading import read_artifact
from medusa_lite.artifacts.resolve import resolve_source
from medusa_lite.drafters.contract import DrafterKind, Drafting
from medusa_lite.drafters.hydra.heads import HydraHeads
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.registry import (
    artifact_classes,
    builtin_kinds,
    kind_named,
    kind_names,
    kind_of,
    kind_recorded,
    register,
    registered,
    unregister,
)
from medusa_lite.drafters.sequential.drafter import SequentialDrafter
from medusa_lite.errors import HeadsFileError, IncompatibleHeadsError
from medusa_lite.proposers.base import Candidates, Proposer
from medusa_lite.training.config import TrainConfig, validate
from medusa_lite.training.errors import TrainingConfigError
from medusa_lite.trees.costs import Proposal

TOY_KIND = "toy-bigram"
VOCAB = 96
LOADABLE_FAMILY = "qwen2"  # a tiny target whose folder AutoTokenizer reads without tokenizer files
POLICY = DynamicTree(5, tuple(1.0 + 0.01 * rows for rows in range(12)), tokens_per_cost=1.0)
PROMPT = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(3))


@dataclass
class BigramConfig:
    vocab_size: int
    draft_vocab_size: int | None = None
    kind: str = TOY_KIND
    training_summary: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict) -> BigramConfig:
        return cls(**values)


class BigramDrafter(HubArtifact, tags=["toy"]):
    """Guesses the next token from the previous one alone: a [V, V] table of logits."""

    artifact_what: ClassVar[str] = "bigram drafter"
    config_class: ClassVar[type] = BigramConfig
    draft_token_ids = None

    def __init__(self, config: BigramConfig):
        super().__init__()
        self.config = config
        self.table = nn.Parameter(torch.zeros(config.vocab_size, config.vocab_size))


@dataclass(frozen=True)
class BigramProposer(Proposer):
    """A chain: each guess the table's likeliest successor of the token before it."""

    drafter: BigramDrafter
    topk: int = 1
    max_new_nodes: int = 4
    costs: DynamicTree | None = None
    draft_lm_head: object = None
    name: ClassVar[str] = "bigram"

    def packed_rows(self) -> int:
        return 1

    def max_nodes(self, limits) -> int:
        return self.max_new_nodes if limits.max_depth is None else max(min(self.max_new_nodes, limits.max_depth), 0)

    def propose(self, step):
        token, chain = int(step.root), []
        for _ in range(min(step.max_nodes, step.max_depth)):
            token = int(self.drafter.table[token].argmax())
            chain.append(token)
        return Candidates.chain(torch.tensor(chain, device=step.root.device)) if chain else None


def check_bigram_fits(model, drafter: BigramDrafter) -> None:
    if drafter.config.vocab_size != model.vocab_size:
        raise IncompatibleHeadsError(
            f"the bigram drafter has {drafter.config.vocab_size} tokens, the model {model.vocab_size}"
        )


def bigram_proposal(proposer: BigramProposer, model) -> Proposal:
    return Proposal({"kind": TOY_KIND}, lambda prefix, tokens, root: lambda: proposer.drafter.table[root].argmax())


TOY = DrafterKind(
    name="toy_bigram",
    artifact=BigramDrafter,
    recorded_kind=TOY_KIND,
    drafting=Drafting(BigramProposer, check_bigram_fits, bigram_proposal),
)


@pytest.fixture
def toy_kind():
    register(TOY)
    yield TOY
    unregister(TOY.name)


def token_by_token_target(family: str):
    """A target whose greedy next token depends on the current token alone (attention and MLP outputs zeroed)."""
    target = tiny_base_model(family, vocab_size=VOCAB)
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return target


def successor_drafter(target, right_every: int) -> BigramDrafter:
    """A table of the target's greedy successor of each token alone, wrong for every ``right_every``-th token."""
    drafter = BigramDrafter(BigramConfig(vocab_size=VOCAB))
    with torch.no_grad():
        successors = target(torch.arange(VOCAB).view(-1, 1)).logits[:, -1].argmax(-1)
        wrong = (successors + 1) % VOCAB
        guesses = torch.where(torch.arange(VOCAB) % right_every == 0, wrong, successors)
        drafter.table[torch.arange(VOCAB), guesses] = 10.0
    return drafter


def test_every_builtin_kind_is_found_by_name_recorded_kind_and_artifact():
    assert kind_names()[:3] == ("medusa_heads", "sequential", "hydra")
    for kind in builtin_kinds():
        assert kind_named(kind.name) is kind and kind_recorded(kind.recorded_kind) is kind
        assert kind.artifact in artifact_classes()
    assert kind_named("medusa_heads").artifact is MedusaHeads and kind_named("medusa_heads").drafting is None
    assert kind_named("sequential").artifact is SequentialDrafter and kind_named("sequential").training.unrolled
    assert kind_recorded("hydra-heads").artifact is HydraHeads
    assert kind_named("eagle-9") is None and kind_recorded("eagle-9") is None and kind_of(object()) is None


def test_a_kind_that_clashes_with_a_known_one_is_refused(toy_kind):
    with pytest.raises(ValueError, match="its name is 'toy_bigram'"):
        register(toy_kind)
    with pytest.raises(ValueError, match="its recorded kind is 'hydra'"):
        register(dataclasses.replace(toy_kind, name="other", recorded_kind="hydra-heads"))
    with pytest.raises(ValueError, match="built-in"):
        unregister("hydra")
    assert registered()[-1] is toy_kind


@pytest.mark.parametrize("token_by_token", [True, False], ids=["guesses-mostly-right", "guesses-mostly-wrong"])
def test_a_registered_toy_kind_loads_from_its_folder_and_decodes_exactly(toy_kind, token_by_token, tmp_path):
    family = LOADABLE_FAMILY
    target = token_by_token_target(family) if token_by_token else tiny_base_model(family, vocab_size=VOCAB)
    target.save_pretrained(tmp_path / "target")
    drafter = successor_drafter(target, right_every=5)
    drafter.save_pretrained(tmp_path / "toy")
    assert json.loads((tmp_path / "toy" / "config.json").read_text())["kind"] == TOY_KIND

    again = read_artifact(resolve_source(tmp_path / "toy", "bigram drafter"))
    assert isinstance(again, BigramDrafter) and kind_of(again) is toy_kind
    assert torch.equal(again.table, drafter.table)

    model, _ = load(tmp_path / "target", heads=tmp_path / "toy", tree=POLICY, datastore=False)
    (proposer,) = [p for p in model.proposers if isinstance(p, BigramProposer)]
    assert model.heads is None and proposer.costs is not None and torch.equal(proposer.drafter.table, drafter.table)
    out = generate(model, PROMPT, 40, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(target, PROMPT, 40, eos_token_id=None))
    if token_by_token:
        assert max(out.stats.tokens_per_step) >= 3, "the toy's right guesses were accepted"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_toy_kinds_proposer_decodes_exactly_on_every_family(family):
    for target in (token_by_token_target(family), tiny_base_model(family, vocab_size=VOCAB)):
        proposer = BigramProposer(successor_drafter(target, right_every=5))
        out = generate(MedusaModel(target, None, proposers=(proposer,)), PROMPT, 40, eos_token_id=[])
        assert torch.equal(out.sequences, plain_greedy(target, PROMPT, 40, eos_token_id=None))


def test_a_toy_kind_for_another_vocabulary_is_refused_by_its_own_check(toy_kind, tmp_path):
    target = tiny_base_model(LOADABLE_FAMILY, vocab_size=VOCAB)
    target.save_pretrained(tmp_path / "target")
    BigramDrafter(BigramConfig(vocab_size=VOCAB + 1)).save_pretrained(tmp_path / "toy")
    with pytest.raises(IncompatibleHeadsError, match="97 tokens, the model 96"):
        load(tmp_path / "target", heads=tmp_path / "toy", datastore=False)


def test_an_unregistered_kind_is_named_with_the_known_ones(tmp_path):
    BigramDrafter(BigramConfig(vocab_size=VOCAB)).save_pretrained(tmp_path / "toy")
    with pytest.raises(HeadsFileError, match="records kind 'toy-bigram'.*'sequential-drafter', 'hydra-heads'"):
        read_artifact(resolve_source(tmp_path / "toy", "drafter"))


def test_a_kind_without_training_hooks_is_refused_by_a_training_config(toy_kind):
    with pytest.raises(TrainingConfigError, match="drafter must be one of .*'hydra'.*decodes but does not train"):
        validate(TrainConfig(data=["x.jsonl"], drafter="toy_bigram"))


def test_push_accepts_a_registered_kind_in_hand(toy_kind, monkeypatch, tmp_path):
    """push_heads_to_hub takes any registered kind's module (here up to the upload, which is stubbed out)."""
    saved = []

    class Refused(Exception):
        pass

    def stop_at_upload(self, *args, **kwargs):
        saved.append(True)
        raise Refused

    monkeypatch.setattr("huggingface_hub.HfApi.create_repo", stop_at_upload)
    with pytest.raises(Refused):
        push_heads_to_hub(BigramDrafter(BigramConfig(vocab_size=VOCAB)), "me/toy")
    assert saved
