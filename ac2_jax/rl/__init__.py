"""ac2_jax.rl: pure functions for RL of language models.

advantages (GRPO, RLOO, AC2), gae (GAE, skip-observation GAE, adaptive lambda), li2sao, pact,
policy_loss (PPO with dual clip, DIS), critic_loss (value-token NLL, clipped MSE, ranking hinge,
soft BCE), entropy (token log-probs and entropy at a temperature) and flops (decoding FLOPs).
"""

from ac2_jax.rl import advantages, critic_loss, entropy, flops, gae, li2sao, pact, policy_loss

__all__ = ['advantages', 'critic_loss', 'entropy', 'flops', 'gae', 'li2sao', 'pact', 'policy_loss']
