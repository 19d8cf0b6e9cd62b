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
