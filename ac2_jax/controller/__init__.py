"""ac2_jax.controller"""
