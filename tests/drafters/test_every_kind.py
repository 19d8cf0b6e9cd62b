"""Every built-in drafter kind, through the registry alone: made fresh by its training hook, saved, read back as the
same kind, served by ``load()`` the way its entry says, and decoding token-identical to the target's own greedy."""

from __future__ import annotations

import pytest
import torch
from tiny_models import plain_greedy, tiny_base_model

from medusa_lite import generate, load
from medusa_lite.artifacts.loading import read_artifact
from medusa_lite.artifacts.resolve import resolve_source
from medusa_lite.drafters.registry import builtin_kinds, kind_named, kind_of
from medusa_lite.training.config import TrainConfig

FAMILY = "qwen2"  # a tiny target whose folder AutoTokenizer reads without tokenizer files
VOCAB = 128
NUM_HEADS = 3
NEW_TOKENS = 24
PROMPTS = [torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(length)) for length in (5, 11)]
KIND_NAMES = [kind.name for kind in builtin_kinds()]


def fresh_artifact(name: str, target):
    """A kind's untrained artifact, its weights jittered (seeded) so that its guesses are neither all right nor
    all alike."""
    kind = kind_named(name)
    artifact = kind.training.fresh(TrainConfig(data=["unused"], drafter=name, num_heads=NUM_HEADS), target, None)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in artifact.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return artifact


@pytest.mark.parametrize("name", KIND_NAMES)
def test_each_builtin_kind_round_trips_and_decodes_exactly(name, tmp_path):
    target = tiny_base_model(FAMILY, vocab_size=VOCAB)
    target.save_pretrained(tmp_path / "target")
    artifact = fresh_artifact(name, target)
    artifact.save_pretrained(tmp_path / name)

    again = read_artifact(resolve_source(tmp_path / name, name))
    assert type(again) is type(artifact) and kind_of(again) is kind_named(name)
    assert again.state_dict().keys() == artifact.state_dict().keys()
    assert all(torch.equal(again.state_dict()[key], value) for key, value in artifact.state_dict().items())

    model, _ = load(tmp_path / "target", heads=tmp_path / name, datastore=False)
    drafting = kind_named(name).drafting
    if drafting is None:
        assert isinstance(model.heads, type(artifact)), "a kind without its own drafting is the model's heads"
    else:
        served = [p for p in model.proposers if kind_of(getattr(p, "drafter", getattr(p, "heads", None)))]
        assert model.heads is None and len(served) == 1, "a drafting kind is served as one proposer"
    for prompt in PROMPTS:
        out = generate(model, prompt, NEW_TOKENS, eos_token_id=[])
        assert torch.equal(out.sequences, plain_greedy(target, prompt, NEW_TOKENS, eos_token_id=None)), name
