"""ac2_jax.algorithms"""
