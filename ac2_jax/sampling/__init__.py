"""ac2_jax.sampling"""
