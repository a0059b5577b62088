"""ac2_jax.judges"""
