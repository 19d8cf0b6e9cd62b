"""Proposers: the interface every source of guesses implements, and the sources that need no training."""
