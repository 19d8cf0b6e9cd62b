"""Measuring: prompts, plain baselines and timing shared by the benchmark commands and experiments."""
