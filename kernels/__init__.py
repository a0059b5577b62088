"""Pallas attention kernels: flash attention (training, prefill) and ragged decode attention.

`kernels.ops` is the entry point (custom_vjp, backend dispatch, interpret mode); the kernels
for GPU (Triton) live here, those for TPU (Mosaic) in `kernels/tpu/`; `kernels.reference` holds
the pure-jnp references the kernels are tested against; `kernels.export` exports them for either
platform from any machine (a lowering check without the accelerator).
"""
