"""The Proposer interface: a toy proposer written through the public API is exact, and bad candidates are named.

``RepeatRoot`` below is the whole of a deterministic proposer (the interface as a user sees it);
``RandomTree`` draws a tree of guesses from random distributions q, several siblings per node,
so acceptance must use min(1, p/q) and the residual. The chi-square tests compare the sampled
first tokens with the target's exact distribution (tests/distribution_check.py); their power is
shown by a negative control, the same rule without the residual step, which the same test at
the same sample size rejects.
"""

from dataclasses import replace

import pytest
import torch
from distribution_check import ALPHA, chi_square_p_value, exact_distribution, sampled_counts
from tiny_models import FAMILIES, plain_greedy, random_heads, tiny_base_model

import medusa_lite.decoding.acceptance
from medusa_lite import (
    Candidates,
    DatastoreLookup,
    FirstOf,
    GenerationInputError,
    MedusaHeadsProposer,
    MedusaModel,
    PromptLookup,
    Proposer,
    ProposerError,
    SamplingSettings,
    StepContext,
    StepLimits,
    Tree,
    generate,
)
from medusa_lite.decoding.acceptance import accept_at_node, residual_distribution
from medusa_lite.proposers.datastore import Datastore
from medusa_lite.trees.draft import root_draft


# -- a toy deterministic proposer, through the public interface only ----------------------------
class RepeatRoot(Proposer):
    """Guesses that the root token repeats ``count`` times, and beside that a second guess: root + 1."""

    name = "repeat"

    def __init__(self, count: int = 2):
        self.count, self.accepted_guesses = count, 0

    def begin(self, model, prompt, limits):
        return RepeatRoot(self.count)  # fresh statistics per generation

    def max_nodes(self, limits):
        return self.count + 1

    def propose(self, step):
        depth = min(self.count, step.max_depth)
        if depth < 1:
            return None
        other = (step.root + 1) % step.model.vocab_size
        return Candidates(torch.cat([step.root.repeat(depth), other]), list(range(depth)) + [0])

    def accepted(self, outcome):
        self.accepted_guesses += sum(outcome.draft.sources[node] == self.name for node in outcome.path[1:].tolist())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("with_heads", [False, True], ids=["no-heads", "heads"])
def test_toy_proposer_greedy_is_identical_to_plain_greedy(family, with_heads):
    base = tiny_base_model(family, vocab_size=8, seed=3, logit_scale=3.0)
    model = MedusaModel(base, random_heads(base, 2, seed=4) if with_heads else None)
    proposers = [RepeatRoot(3)] + ([MedusaHeadsProposer([(0,), (1,), (0, 0)])] if with_heads else [])
    accepted = 0
    for seed in range(4):
        prompt = torch.randint(0, 8, (1, 5), generator=torch.Generator().manual_seed(seed))
        out = generate(model, prompt, 30, proposers=proposers)
        assert torch.equal(out.sequences, plain_greedy(base, prompt, 30))
        accepted += out.stats.accepted_by_source.get("repeat", 0)
        assert sum(out.stats.accepted_by_source.values()) == sum(out.stats.tokens_per_step) - out.stats.steps
    assert accepted > 0, "no toy guess was ever accepted: the test did not reach its case"


# -- a toy stochastic proposer: a tree of guesses drawn from random q ---------------------------
class RandomTree(Proposer):
    """``width`` root children drawn without replacement from a random q, each followed by a chain from fresh q's."""

    name = "random"

    def __init__(self, width: int = 2, depth: int = 2, sharpness: float = 2.0):
        self.width, self.depth, self.sharpness = width, depth, sharpness

    def max_nodes(self, limits):
        return self.width * self.depth

    def random_q(self, vocab_size, generator):
        return (torch.randn(vocab_size, generator=generator) * self.sharpness).softmax(-1)

    def propose(self, step):
        vocab_size, generator = step.model.vocab_size, step.generator
        if step.max_depth < 1:
            return None
        tokens, parents, qs = [], [], []
        root_q = self.random_q(vocab_size, generator)
        for _ in range(min(self.width, vocab_size)):
            token = int(torch.multinomial(root_q, 1, generator=generator))
            tokens, parents, qs = tokens + [token], parents + [0], qs + [root_q]
            root_q = root_q.clone().index_fill_(0, torch.tensor([token]), 0.0)  # without replacement
            root_q = root_q / root_q.sum()
            for _ in range(min(self.depth, step.max_depth) - 1):
                q = self.random_q(vocab_size, generator)
                tokens, parents, qs = (
                    tokens + [int(torch.multinomial(q, 1, generator=generator))],
                    parents + [len(tokens)],
                    qs + [q],
                )
        return Candidates(torch.tensor(tokens), parents, qs)


VOCAB = 3
NEW_TOKENS = 4
NUM_SAMPLES = 3000
PROMPT = torch.tensor([[0, 2, 1]])
PARTIAL_TREE = Tree.from_paths([(0,), (1,), (0, 0)])


@pytest.fixture(scope="module")
def model():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=42, logit_scale=5.0)
    return MedusaModel(base, random_heads(base, num_heads=3, seed=43))


STOCHASTIC_CASES = {
    "T1.0-random-chain": (SamplingSettings(1.0), lambda: [RandomTree(width=1, depth=3)]),
    "T1.0-random-tree": (SamplingSettings(1.0), lambda: [RandomTree()]),
    "T0.7-topk2-random+heads": (
        SamplingSettings(0.7, top_k=2),
        lambda: [RandomTree(), MedusaHeadsProposer(PARTIAL_TREE)],
    ),
    "T1.0-topp0.8-lookup+random": (
        SamplingSettings(1.0, top_p=0.8),
        lambda: [PromptLookup(3), RandomTree(width=3, depth=1)],
    ),
}


@pytest.mark.parametrize("case", list(STOCHASTIC_CASES))
def test_drawn_guesses_keep_the_target_distribution(model, case):
    settings, proposers = STOCHASTIC_CASES[case]
    exact = exact_distribution(model.base_model, PROMPT, NEW_TOKENS, settings)
    counts = sampled_counts(model, PROMPT, NEW_TOKENS, settings, NUM_SAMPLES, seed=1, proposers=proposers())
    p_value = chi_square_p_value(counts, exact, NUM_SAMPLES)
    assert p_value > ALPHA, f"samples differ from the target's distribution (p={p_value:.2e})"


def test_skipping_the_residual_is_rejected(model, monkeypatch):
    """Negative control (the test's power): after a rejection, draw from p instead of norm(max(p - q, 0)).

    Shown on the chain case (p-value 2e-5 at this N when written; a second sibling drawn without
    replacement hides much of the bias: the two-sibling tree gave 2e-4 even at twice the samples,
    so for trees the rule's power is shown at one node, below, where the bias is undiluted).
    """
    monkeypatch.setattr(medusa_lite.decoding.acceptance, "residual_distribution", lambda p, q: p)
    settings = SamplingSettings(1.0)
    exact = exact_distribution(model.base_model, PROMPT, NEW_TOKENS, settings)
    counts = sampled_counts(
        model, PROMPT, NEW_TOKENS, settings, NUM_SAMPLES, seed=2, proposers=[RandomTree(width=1, depth=3)]
    )
    assert chi_square_p_value(counts, exact, NUM_SAMPLES) < ALPHA


def test_greedy_with_drawn_guesses_is_identical_to_plain_greedy(model):
    prompt = torch.tensor([[1, 0, 2, 2]])
    out = generate(
        model,
        prompt,
        12,
        proposers=[RandomTree(), MedusaHeadsProposer(PARTIAL_TREE)],
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(out.sequences, plain_greedy(model.base_model, prompt, 12))


# -- the rule at one node, exactly --------------------------------------------------------------
def one_node_outputs(p, q, draws_per_node, n, seed, residual=residual_distribution):
    """How often each token leaves a node: siblings drawn from q without replacement, then the rule."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.numel())
    for _ in range(n):
        draws, current = [], q
        for child in range(1, draws_per_node + 1):
            token = int(torch.multinomial(current, 1, generator=generator))
            draws.append((child, token, current))
            current = current.clone().index_fill_(0, torch.tensor([token]), 0.0)
            current = current / current.sum()
        children = {token: child for child, token, _ in draws}
        _, token = accept_at_node(p, draws, children, generator)
        counts[token] += 1
    return counts


def test_recursive_rejection_at_one_node_gives_p_and_the_control_does_not(monkeypatch):
    p = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    q = torch.tensor([0.05, 0.1, 0.2, 0.3, 0.35])
    n = 20000
    expected = {(token,): float(p[token]) for token in range(5)}
    counts = one_node_outputs(p, q, 2, n, seed=5)
    assert chi_square_p_value({(t,): int(c) for t, c in enumerate(counts)}, expected, n) > ALPHA
    monkeypatch.setattr(medusa_lite.decoding.acceptance, "residual_distribution", lambda p, q: p)
    biased = one_node_outputs(p, q, 2, n, seed=5)
    assert chi_square_p_value({(t,): int(c) for t, c in enumerate(biased)}, expected, n) < ALPHA


def test_residual_distribution():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    assert torch.allclose(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(residual_distribution(p, p), p)  # nothing left to give: rejection has probability 0


# -- which lookup wins is data ------------------------------------------------------------------
def test_first_of_asks_its_members_in_order():
    base = tiny_base_model("llama", vocab_size=24, seed=3)
    model = MedusaModel(base, None, datastore=Datastore.from_documents([torch.tensor([5, 6, 7, 8])], 24))
    history = torch.tensor([5, 6, 9, 1, 5, 6])  # "5 6" occurs in the text (-> 9 1 5 6) and in the datastore (-> 7 8)
    step = StepContext(
        model, history, history[-1:], torch.zeros(32), root_draft(history[-1:]), 8, 4, SamplingSettings()
    )
    text_first = FirstOf([PromptLookup(4, min_ngram=2), DatastoreLookup()])
    store_first = FirstOf([DatastoreLookup(), PromptLookup(4, min_ngram=2)])
    for lookups, tokens, source in [(text_first, [9, 1, 5, 6], "prompt_lookup"), (store_first, [7, 8], "datastore")]:
        candidates = lookups.begin(model, history, StepLimits(model, 8)).propose(step)
        assert candidates.tokens.tolist() == tokens and candidates.source == source
    no_store = MedusaModel(base, None)
    candidates = store_first.begin(no_store, history, StepLimits(no_store, 8)).propose(replace(step, model=no_store))
    assert (
        candidates.tokens.tolist() == [9, 1, 5, 6] and candidates.source == "prompt_lookup"
    )  # no datastore: the next member


# -- malformed candidates are named --------------------------------------------------------------
class Returns(Proposer):
    name = "broken"

    def __init__(self, make, nodes=4):
        self.make, self.nodes = make, nodes

    def max_nodes(self, limits):
        return self.nodes

    def propose(self, step):
        return self.make(step)


MALFORMED = {
    "duplicate siblings": (
        lambda s: Candidates(torch.tensor([3, 3]), [0, 0]),
        "token 3 appears twice among the children of node 0",
    ),
    "id outside the vocabulary": (
        lambda s: Candidates.chain(torch.tensor([24])),
        r"token id 24 is outside the vocabulary \[0, 24\)",
    ),
    "negative id": (lambda s: Candidates.chain(torch.tensor([-1])), "token id -1"),
    "past the depth allowed": (
        lambda s: Candidates.chain(torch.arange(s.max_depth + 1) % 24),
        "a guess at depth 2, past the 1 this step allows",
    ),
    "more nodes than budgeted": (lambda s: Candidates.chain(torch.arange(5)), "more than the 4 it may add"),
    "float token ids": (lambda s: Candidates.chain(torch.tensor([1.0])), "1-D tensor of integer ids"),
    "parent after the node": (lambda s: Candidates(torch.tensor([1, 2]), [0, 2]), "parent must be an earlier node"),
    "parents of the wrong length": (lambda s: Candidates(torch.tensor([1, 2]), [0]), "1 parents for 2 tokens"),
    "q of the wrong shape": (lambda s: Candidates.chain(torch.tensor([1]), [torch.ones(5) / 5]), r"shape \[24\]"),
    "q of integers": (
        lambda s: Candidates.chain(torch.tensor([1]), [torch.ones(24, dtype=torch.long)]),
        "float tensor",
    ),
    "q not a distribution": (
        lambda s: Candidates.chain(torch.tensor([1]), [torch.ones(24)]),
        "not a probability distribution",
    ),
    "token q cannot draw": (
        lambda s: Candidates.chain(torch.tensor([1]), [torch.eye(24)[0]]),
        "probability 0 under its q",
    ),
    "q for some nodes only": (lambda s: Candidates(torch.tensor([1, 2]), [0, 0], [None]), "one entry per node"),
    "not Candidates": (lambda s: [1, 2], "expected medusa_lite.Candidates"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_candidates_are_a_clear_error_naming_the_proposer(case):
    make, message = MALFORMED[case]
    base = tiny_base_model("llama", vocab_size=24, seed=3)
    with pytest.raises(ProposerError, match=f"proposer 'broken' returned malformed candidates: .*{message}"):
        generate(MedusaModel(base), torch.tensor([[1, 2, 3]]), 3, proposers=[Returns(make)])


def test_proposers_and_shorthands_are_not_mixed_and_must_be_proposers():
    base = tiny_base_model("llama", vocab_size=24, seed=3)
    model = MedusaModel(base)
    with pytest.raises(GenerationInputError, match="either proposers= or the shorthands lookup_tokens="):
        generate(model, torch.tensor([[1, 2]]), 3, proposers=[PromptLookup()], lookup_tokens=2)
    with pytest.raises(GenerationInputError, match="must be medusa_lite.Proposer instances, got str"):
        generate(model, torch.tensor([[1, 2]]), 3, proposers=["heads"])
    with pytest.raises(ProposerError, match="max_nodes must return an integer >= 0"):
        generate(model, torch.tensor([[1, 2]]), 3, proposers=[Returns(lambda s: None, nodes=-1)])


# -- a target without heads, and resource limits (issue 22) -------------------------------------
def test_a_model_without_heads_decodes_with_the_lookups_alone():
    base = tiny_base_model("qwen2", vocab_size=24, seed=3)
    model = MedusaModel(base)
    prompt = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    out = generate(model, prompt, 20)
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 20))
    assert out.stats.tree_nodes == 1 and set(out.stats.accepted_by_source) <= {"prompt_lookup"}


def reserved_positions(model, prompt, max_new_tokens, **kwargs):
    """(the KV cache's reserved positions in a generation, its output)."""
    captured = {}

    def grab(module, args, forward_kwargs, output):
        captured.setdefault("cache", forward_kwargs["cache"])

    handle = model.base_model.register_forward_hook(grab, with_kwargs=True)
    try:
        out = generate(model, prompt, max_new_tokens, **kwargs)
    finally:
        handle.remove()
    return captured["cache"].layers[0].capacity, out


def test_cache_room_comes_from_the_sources_that_run():
    base = tiny_base_model("llama", vocab_size=24, seed=3)
    model = MedusaModel(base, random_heads(base, 2, seed=4), tree=[(0,), (0, 0)])
    prompt = torch.tensor([[1, 2, 3]])
    # A huge lookup budget reserves no more than a step can guess (max_new_tokens - 1); no datastore reserves nothing.
    room, out = reserved_positions(model, prompt, 6, lookup_tokens=10**12, datastore_tokens=10**12)
    assert out.stats.new_tokens == 6 and room == 3 + 6 + 2 + 5
    room, _ = reserved_positions(model, prompt, 30, lookup_tokens=0)  # heads only: the tree's 2 nodes
    assert room == 3 + 30 + 2
    room, _ = reserved_positions(model, prompt, 30)  # default: a prompt-lookup chain of at most 2 x 3 tokens
    assert room == 3 + 30 + 2 + 6


def test_an_absurd_dynamic_tree_is_capped_by_what_a_step_can_use():
    from medusa_lite import DynamicTree

    base = tiny_base_model("llama", vocab_size=64, seed=3)
    model = MedusaModel(base, random_heads(base, 3, seed=4))
    policy = DynamicTree(10**9, (1.0, 1.1, 1.2, 1.3))  # costs grow in proportion past 4 rows
    prompt = torch.tensor([[1, 2, 3]])
    room, out = reserved_positions(model, prompt, 20, tree=policy, lookup_tokens=0)
    # 3 heads accept at most 3 guesses: rows costing over 3 / tokens_per_cost (2.0) more than the root never pay.
    assert out.stats.tree_nodes == max(rows for rows in range(1, 100) if policy.cost(rows) < 1.0 + 3 / 2.0)
    assert room == 3 + 20 + out.stats.tree_nodes - 1
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 20))
