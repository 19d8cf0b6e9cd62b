"""Hydra-style heads: Medusa heads that read the tokens drafted before their guess."""
