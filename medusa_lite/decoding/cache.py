"""The KV cache of one generation: transformers' dynamic cache, with room reserved up front.

transformers' ``DynamicLayer`` appends by concatenation, so every decoding step copies the
whole cache (a measurable share of a step: docs/results.md, "Measurements behind the code's choices").
A generation knows its length in advance (prompt + ``max_new_tokens`` + one step's tree), so
:class:`ReservedLayer` keeps its keys and values as views of buffers of that capacity and writes
new entries in place. Everything else (``get_seq_length``, mask sizes, slicing the cache back to
the accepted path) is ``DynamicLayer``'s, because ``keys``/``values`` are ordinary tensors: views
of the first ``length`` positions of the buffers.
"""

from __future__ import annotations

import torch
from transformers import Cache, DynamicLayer

from medusa_lite.decoding.model import MedusaModel, text_config


def empty_buffer(states: torch.Tensor, capacity: int) -> torch.Tensor:
    """An uninitialised [..., capacity, head_dim] tensor shaped, typed and placed like ``states`` [..., length,
    head_dim].
    """
    return states.new_empty(*states.shape[:-2], capacity, states.shape[-1])


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends into buffers with room for ``capacity`` positions (doubling if exceeded)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.key_buffer, self.value_buffer = (
            empty_buffer(key_states, self.capacity),
            empty_buffer(value_states, self.capacity),
        )
        self.keys, self.values = self.key_buffer[..., :0, :], self.value_buffer[..., :0, :]
        self.is_initialized = True

    def grow_to(self, needed: int) -> None:
        """Move the cached entries into buffers of at least ``needed`` positions (twice the old capacity)."""
        self.capacity = max(needed, 2 * self.capacity)
        length = self.keys.shape[-2]
        key_buffer, value_buffer = empty_buffer(self.keys, self.capacity), empty_buffer(self.values, self.capacity)
        key_buffer[..., :length, :] = self.keys
        value_buffer[..., :length, :] = self.values
        self.key_buffer, self.value_buffer = key_buffer, value_buffer

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:
            self.grow_to(end)
        self.key_buffer[..., start:end, :] = key_states
        self.value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]
        return self.keys, self.values


def reserved_cache(model: MedusaModel, capacity: int) -> Cache:
    """An empty KV cache for ``model``'s target with room for ``capacity`` positions in every layer."""
    return Cache(layers=[ReservedLayer(capacity) for _ in range(text_config(model.base_model).num_hidden_layers)])


# -- a batch: one cache row per sequence (medusa_lite.decoding.batch) ------------------------------
def keep_accepted_per_sequence(
    cache: Cache, prefix: int, committed: torch.Tensor, paths: list[torch.Tensor]
) -> torch.Tensor:
    """After a batched step written at slots ``[prefix, ...)``: move each sequence b's accepted nodes ``paths[b]``
    (root first) to the slots after its ``committed[b]`` entries, cut the cache after the longest sequence, and
    return the new ``committed``. Only accepted entries move."""
    lengths = torch.tensor([path.numel() for path in paths], device=committed.device)
    widest = int(lengths.max())
    # Pad each sequence's moves by repeating its last one (the same entry written twice).
    sources = torch.stack([torch.cat([path, path[-1:].repeat(widest - path.numel())]) for path in paths]) + prefix
    steps = torch.minimum(torch.arange(widest, device=committed.device)[None], lengths[:, None] - 1)
    targets = committed[:, None] + steps
    new_committed = committed + lengths
    new_length = int(new_committed.max())
    device = cache.layers[0].keys.device
    sequences, sources, targets = (
        torch.arange(len(paths), device=device)[:, None],
        sources.to(device),
        targets.to(device),
    )
    for layer in cache.layers:
        layer.keys[sequences, :, targets] = layer.keys[sequences, :, sources]
        layer.values[sequences, :, targets] = layer.values[sequences, :, sources]
        layer.keys, layer.values = layer.keys[..., :new_length, :], layer.values[..., :new_length, :]
    return new_committed


def keep_sequences(cache: Cache, sequences: torch.Tensor, length: int) -> None:
    """Keep only the cache rows ``sequences`` (the batch's unfinished sequences), cut to ``length`` slots."""
    for layer in cache.layers:
        layer.key_buffer = layer.key_buffer[sequences.to(layer.key_buffer.device)]
        layer.value_buffer = layer.value_buffer[sequences.to(layer.value_buffer.device)]
        layer.keys, layer.values = layer.key_buffer[..., :length, :], layer.value_buffer[..., :length, :]
