"""ac2_jax.tasks"""
