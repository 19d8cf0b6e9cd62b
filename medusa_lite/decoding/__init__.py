"""Decoding: the target wrapper, the propose -> verify -> accept -> commit loop, sampling and the KV cache."""
