"""Pallas attention kernels: flash attention (training, prefill) and ragged decode attention.

`kernels.ops` is the entry point (custom_vjp, backend dispatch, interpret mode);
`kernels.reference` holds the pure-jnp references the kernels are tested against.
"""
