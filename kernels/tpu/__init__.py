"""Pallas kernels written for TPU (Mosaic): flash attention and ragged decode attention.

They take and return the same arrays as their GPU (Triton) counterparts in `kernels/`, so
`kernels.ops` picks one module or the other by `Settings.backend`. Inside, they follow Mosaic's
rules: the last two dims of every block are multiples of (8, 128) or whole; per-query values
(visibility bounds, log-sum-exp, the softmax-backward row term) travel as lane rows `[.., 1, T]`
and the scores are computed transposed (keys on sublanes, queries on lanes) so that those rows
broadcast without a relayout; loop bounds come in as scalar prefetch (SMEM).
"""
