"""Trained drafters, one folder per kind: Medusa heads, Hydra-style heads, the sequential drafter."""
