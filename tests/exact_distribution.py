"""The exact distribution of a tiny target's first tokens and a chi-square test against it (sampling tests share it).

On a 3-token vocabulary the exact distribution of the first 4 generated tokens (81 outcomes) is
enumerated from the target with full forwards; samples are compared to it with Pearson's
chi-square goodness-of-fit test, bins with expected count < 5 merged.
"""

from collections import Counter
from collections.abc import Iterator

import torch

from medusa_lite import GenerationOutput, SamplingSettings, Tree, generate, logits_to_probs

VOCAB = 3
NEW_TOKENS = 4
NUM_SAMPLES = 3000
ALPHA = 1e-3
MIN_EXPECTED = 5.0
# Sharp enough to make outcomes unequal, flat enough that most of the 81 bins are populated.
LOGIT_SCALE = 5.0
PROMPT = torch.tensor([[0, 2, 1]])
PARTIAL_TREE = Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])


def enumerated_distribution(
    base, prompt: torch.Tensor, new_tokens: int, settings: SamplingSettings
) -> dict[tuple[int, ...], float]:
    """P(first ``new_tokens`` tokens after ``prompt`` [1, L]) by enumerating every continuation with full forwards."""
    vocab = base.config.vocab_size
    probs = {(): 1.0}
    for _ in range(new_tokens):
        prefixes = list(probs)
        continuations = torch.tensor(prefixes, dtype=torch.long).view(len(prefixes), -1)
        batch = torch.cat([prompt.repeat(len(prefixes), 1), continuations], dim=1)
        with torch.no_grad():
            next_probs = logits_to_probs(base(batch).logits[:, -1], settings)
        probs = {
            prefix + (t,): probs[prefix] * float(next_probs[i, t])
            for i, prefix in enumerate(prefixes)
            for t in range(vocab)
        }
    return probs


def exact_distribution(base, settings: SamplingSettings) -> dict[tuple[int, ...], float]:
    """P(first NEW_TOKENS tokens after PROMPT)."""
    return enumerated_distribution(base, PROMPT, NEW_TOKENS, settings)


def sampled_outputs(
    model, prompt: torch.Tensor, new_tokens: int, settings: SamplingSettings, n: int, seed: int, **generate_kwargs
) -> Iterator[GenerationOutput]:
    """``n`` calls of ``generate`` sampling ``new_tokens`` tokens with ``settings`` (one seeded generator, no EOS)."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(n):
        yield generate(
            model,
            prompt,
            new_tokens,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            generator=generator,
            eos_token_id=[],
            **generate_kwargs,
        )


def continuation(out: GenerationOutput, prompt: torch.Tensor) -> tuple[int, ...]:
    return tuple(out.sequences[0, prompt.shape[1] :].tolist())


def chi_square_p_value(counts: dict, expected_probs: dict, n: int) -> float:
    """Pearson chi-square p-value, merging bins whose expected count is below MIN_EXPECTED."""
    observed, expected, pooled_observed, pooled_expected = [], [], 0.0, 0.0
    for outcome, p in expected_probs.items():
        if n * p < MIN_EXPECTED:
            pooled_observed += counts.get(outcome, 0)
            pooled_expected += n * p
        else:
            observed.append(counts.get(outcome, 0))
            expected.append(n * p)
    if pooled_expected > 0:
        observed.append(pooled_observed)
        expected.append(pooled_expected)
    assert sum(observed) == n, "a sample fell outside the enumerated outcomes"
    o, e = torch.tensor(observed, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    statistic = ((o - e) ** 2 / e).sum()
    degrees = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64), statistic / 2))


def sample_counts(model, settings, tree, n, seed, lookup_tokens=0, datastore=None):
    runs = sampled_outputs(
        model, PROMPT, NEW_TOKENS, settings, n, seed, tree=tree, lookup_tokens=lookup_tokens, datastore=datastore
    )
    return Counter(continuation(out, PROMPT) for out in runs)
