"""ac2_jax.critic"""
