"""Medusa heads: K residual blocks on the target's last hidden state."""
