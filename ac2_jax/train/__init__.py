"""ac2_jax.train"""
