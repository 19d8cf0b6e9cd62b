"""Property-based: random valid trees, prompts, sampling settings and EOS placements.

Every time: greedy output equals the plain target's greedy output, sampled tokens lie in the
support of the target's warped distribution, and before each verification the KV cache holds
exactly the committed tokens but the newest (the tree root).
"""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import plain_greedy, random_heads, tiny_base_model

from medusa_lite import MedusaModel, SamplingSettings, generate, logits_to_probs

VOCAB = 48
NUM_HEADS = 3
MAX_RANK = 4
BASE = tiny_base_model("llama", vocab_size=VOCAB, seed=17, logit_scale=4.0)
MODEL = MedusaModel(BASE, random_heads(BASE, num_heads=NUM_HEADS, seed=18))


@st.composite
def trees(draw):
    """A valid tree: each new node picks an existing parent (depth < heads) and an unused rank."""
    paths: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(0, 12))):
        parents = [()] + [p for p in paths if len(p) < NUM_HEADS]
        parent = draw(st.sampled_from(parents))
        used = {p[-1] for p in paths if p[:-1] == parent and len(p) == len(parent) + 1}
        free = [r for r in range(MAX_RANK) if r not in used]
        if free:
            paths.append(parent + (draw(st.sampled_from(free)),))
    return paths


sampling_settings = st.one_of(
    st.just(SamplingSettings(0.0)),
    st.builds(
        SamplingSettings,
        st.floats(0.3, 1.5),
        st.one_of(st.none(), st.integers(1, 10)),
        st.one_of(st.none(), st.floats(0.2, 1.0)),
    ),
)


def run_with_cache_check(prompt, max_new_tokens, **kwargs):
    cache_lengths, committed = [], []

    class Recorder:
        def put(self, value):
            committed.append(value.numel())

        def end(self):
            pass

    handle = BASE.register_forward_pre_hook(
        lambda m, a, kw: cache_lengths.append(kw["cache"].get_seq_length()), with_kwargs=True
    )
    try:
        out = generate(MODEL, prompt, max_new_tokens, streamer=Recorder(), **kwargs)
    finally:
        handle.remove()
    totals = torch.tensor(committed).cumsum(0).tolist()
    assert cache_lengths[0] == 0
    assert cache_lengths[1:] == [t - 1 for t in totals[1:-1]], "cache must hold the committed tokens but the root"
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree=trees(),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    max_new_tokens=st.integers(1, 24),
    sampling=sampling_settings,
    eos=st.one_of(st.just([]), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3)),
    seed=st.integers(0, 2**16),
)
def test_generate_is_exact_for_random_inputs(tree, prompt, max_new_tokens, sampling, eos, seed):
    prompt = torch.tensor([prompt])
    out = run_with_cache_check(
        prompt,
        max_new_tokens,
        tree=tree,
        eos_token_id=eos,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        generator=torch.Generator().manual_seed(seed),
    )
    new = out.sequences[0, prompt.shape[1] :]
    assert 1 <= new.numel() <= max_new_tokens
    if eos:
        hits = [i for i, t in enumerate(new.tolist()) if t in eos]
        assert hits == [] or hits == [new.numel() - 1], "generation must stop at the first EOS"
    if sampling.greedy:
        assert torch.equal(out.sequences, plain_greedy(BASE, prompt, max_new_tokens, eos_token_id=eos))
    else:
        with torch.no_grad():
            probs = logits_to_probs(BASE(out.sequences).logits[0, prompt.shape[1] - 1 : -1], sampling)
        assert (probs.gather(-1, new[:, None]) > 0).all(), "a sampled token lies outside the target's support"
