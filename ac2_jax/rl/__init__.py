"""ac2_jax.rl"""
