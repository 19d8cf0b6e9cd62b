"""What every batch test checks: each row of a batch's output is its prompt decoded alone by the target's own greedy
``generate``, in ``model.generate``'s layout (left-padded prompts, then each row's tokens, then padding)."""

from __future__ import annotations

import torch
from tiny_models import plain_greedy

from medusa_lite.bench.measure import left_padded

PAD = 0


def alone(base, prompt: torch.Tensor, new_tokens: int, eos: list[int], **options) -> torch.Tensor:
    """The row's new tokens from the target's own greedy generate of its prompt alone (up to and with an EOS)."""
    out = plain_greedy(base, prompt[None], new_tokens, eos_token_id=eos or None, pad_token_id=PAD, **options)
    return out[0, prompt.numel() :]


def an_eos_that_ends_rows_early(base, prompts, new_tokens: int) -> list[int]:
    """A token one row's greedy continuation emits at its 6th step: as EOS, rows end at different steps."""
    return [int(alone(base, prompts[0], new_tokens, [])[5])]


def assert_each_row_as_alone(out, base, prompts, new_tokens: int, eos: list[int], **options) -> list[int]:
    """Every row: its padded prompt, then its tokens decoded alone, then padding; the rows' new token counts."""
    ids, _ = left_padded(prompts, PAD)
    width = ids.shape[1]
    counts = []
    for b, prompt in enumerate(prompts):
        expected = alone(base, prompt, new_tokens, eos, **options)
        row = out.sequences[b]
        assert torch.equal(row[:width], ids[b]), f"row {b}: the padded prompt changed"
        assert torch.equal(row[width : width + expected.numel()], expected), f"row {b}: differs from decoding alone"
        assert bool((row[width + expected.numel() :] == PAD).all()), f"row {b}: not padded after its end"
        assert out.row_stats[b].new_tokens == expected.numel()
        counts.append(expected.numel())
    assert out.sequences.shape[1] == width + max(counts)
    assert out.stats.new_tokens == sum(counts)
    return counts
