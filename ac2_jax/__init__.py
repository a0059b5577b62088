"""ac2_jax: reinforcement learning of language models on long reasoning tasks (AC2 and baselines)."""

__version__ = '0.1.0'
