"""GPU/TPU check of the Pallas attention kernels: correctness against the references, then speed.

  python launch/bench.py kernels                        # on a GPU (or TPU): Qwen3-4B heads, bf16
  python launch/bench.py kernels --interpret --seqs=64 --check_seq=48 --heads=4 --kv_heads=2 \
      --head_dim=32 --dtype=float32 --decode_batch=2 --iters=1   # CPU smoke run of this script
  (add --backend=tpu to the smoke run for the TPU kernels in TPU interpret mode; on a TPU VM,
  --block_q=256 --block_k=512 tries larger blocks)

1. Checks flash forward + gradients and ragged decode against `kernels.reference` (float32
   reference on the same inputs) at `--check_seq`; exits non-zero on a mismatch.
2. Times causal attention forward and forward+backward at each of `--seqs` (default 4k, 16k):
   XLA attention (`ac2_jax.models.attention.xla_attention`) vs the Pallas flash kernels.
3. Times one decode step of `--decode_batch` rows against a cache of each length with ragged
   valid lengths: XLA vs the Pallas decode kernel.
Ratios are printed as XLA time / Pallas time (> 1: the kernel is faster).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ac2_jax.models.attention import xla_attention
from kernels import ops
from kernels import reference


def _parse(argv):
  parser = argparse.ArgumentParser(prog='bench.py kernels')
  parser.add_argument('--seqs', default='4096,16384', help='comma-separated sequence lengths')
  parser.add_argument('--check_seq', type=int, default=1024)
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--heads', type=int, default=32)
  parser.add_argument('--kv_heads', type=int, default=8)
  parser.add_argument('--head_dim', type=int, default=128)
  parser.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float32'))
  parser.add_argument('--decode_batch', type=int, default=32)
  parser.add_argument('--decode_splits', type=int, default=4)
  parser.add_argument('--iters', type=int, default=10)
  parser.add_argument('--interpret', action='store_true', help='run kernels interpreted (CPU)')
  parser.add_argument('--backend', default=None, choices=('gpu', 'tpu'),
                      help="kernels to run (default: the running backend's); with --interpret, "
                           "'tpu' runs the TPU kernels in TPU interpret mode")
  parser.add_argument('--block_q', type=int, default=None, help='flash query block (fwd and bwd)')
  parser.add_argument('--block_k', type=int, default=None, help='flash key block (fwd and bwd)')
  parser.add_argument('--decode_block_k', type=int, default=None,
                      help='decode block of cache slots (GPU: capped to fit shared memory)')
  parser.add_argument('--num_warps', type=int, default=None, help='Triton warps (GPU)')
  parser.add_argument('--num_stages', type=int, default=None, help='Triton pipeline stages (GPU)')
  parser.add_argument('--parts', default='flash,decode',
                      help='what to time after the checks: flash, decode or both')
  return parser.parse_args(argv)


def _inputs(seed, B, T, S, H, K, D, dtype):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (jax.random.normal(keys[0], (B, T, H, D), dtype),
          jax.random.normal(keys[1], (B, S, K, D), dtype),
          jax.random.normal(keys[2], (B, S, K, D), dtype))


def _time_ms(fn, *args, iters: int) -> float:
  jax.block_until_ready(fn(*args))  # Compile and warm up.
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * float(np.median(times))


def _relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-12))


def _check(args, settings, tol: float) -> bool:
  dtype = jnp.dtype(args.dtype)
  B, T, H, K, D = 2, args.check_seq, args.heads, args.kv_heads, args.head_dim
  q, k, v = _inputs(0, B, T, T, H, K, D, dtype)
  q_pos = jnp.tile(jnp.arange(T)[None], (B, 1))
  kv_len = jnp.asarray([T, T // 3 + 1])
  weights = jax.random.normal(jax.random.PRNGKey(9), q.shape, jnp.float32)

  def grads(attend, *xs):
    loss = lambda *xs: jnp.sum(attend(*xs).astype(jnp.float32) * weights)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(*xs)

  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  _, got = grads(lambda q, k, v: ops.flash_attention(q, k, v, q_pos, kv_len, settings=settings),
                 q, k, v)
  _, want = grads(lambda q, k, v: reference.attention(q, k, v, q_pos, kv_len), *f32)
  out = jax.jit(lambda q, k, v: ops.flash_attention(q, k, v, q_pos, kv_len,
                                                    settings=settings))(q, k, v)
  errors = {'flash out': _relative_error(out, reference.attention(*f32, q_pos, kv_len))}
  errors.update({f'flash {n}': _relative_error(g, w)
                 for n, g, w in zip(('dq', 'dk', 'dv'), got, want)})
  dec_len = jnp.asarray([1, T])
  dec = jax.jit(lambda q, k, v: ops.decode_attention(q, k, v, dec_len - 1, dec_len,
                                                     settings=settings))(q[:, 0], k, v)
  errors['decode out'] = _relative_error(
      dec, reference.decode_attention(f32[0][:, 0], f32[1], f32[2], dec_len - 1, dec_len))
  ok = True
  for name, err in errors.items():
    status = 'ok' if err <= tol else 'MISMATCH'
    ok &= err <= tol
    print(f'check {name:12s} max rel error {err:.2e} (tol {tol:.0e}) {status}')
  return ok


def _speed(args, settings, T: int) -> None:
  dtype = jnp.dtype(args.dtype)
  B, H, K, D = args.batch, args.heads, args.kv_heads, args.head_dim
  q, k, v = _inputs(1, B, T, T, H, K, D, dtype)
  q_pos = jnp.tile(jnp.arange(T, dtype=jnp.int32)[None], (B, 1))
  kv_len = jnp.full((B,), T, jnp.int32)
  impls = {'xla': lambda q, k, v: xla_attention(q, k, v, q_pos, kv_len),
           'pallas': lambda q, k, v: ops.flash_attention(q, k, v, q_pos, kv_len,
                                                         settings=settings)}
  for mode in ('fwd', 'fwd+bwd'):
    ms = {}
    for name, attend in impls.items():
      if mode == 'fwd':
        fn = jax.jit(attend)
      else:
        fn = jax.jit(jax.grad(lambda q, k, v, f=attend: jnp.sum(f(q, k, v).astype(jnp.float32)),
                              argnums=(0, 1, 2)))
      try:
        ms[name] = _time_ms(fn, q, k, v, iters=args.iters)
      except Exception as e:  # Out of memory for the T x T scores is an expected outcome.
        print(f'  {name} {mode} T={T}: failed ({type(e).__name__}: {str(e)[:120]})')
    line = ' '.join(f'{n} {t:9.3f} ms' for n, t in ms.items())
    ratio = f'  xla/pallas {ms["xla"] / ms["pallas"]:.2f}x' if len(ms) == 2 else ''
    print(f'flash {mode:8s} B={B} T={T:6d} H={H} K={K} D={D}: {line}{ratio}')


def _decode_speed(args, settings, S: int) -> None:
  dtype = jnp.dtype(args.dtype)
  B, H, K, D = args.decode_batch, args.heads, args.kv_heads, args.head_dim
  q, k, v = _inputs(2, B, 1, S, H, K, D, dtype)
  kv_len = jax.random.randint(jax.random.PRNGKey(3), (B,), S // 2, S + 1)
  q_pos = kv_len - 1
  xla = jax.jit(lambda q, k, v: xla_attention(q, k, v, q_pos[:, None], kv_len))
  pallas = jax.jit(lambda q, k, v: ops.attention(q, k, v, q_pos[:, None], kv_len,
                                                 settings=settings))
  ms_x = _time_ms(xla, q, k, v, iters=args.iters)
  ms_p = _time_ms(pallas, q, k, v, iters=args.iters)
  print(f'decode step B={B} S={S:6d} (ragged {S // 2}..{S}) H={H} K={K} D={D}: '
        f'xla {ms_x:9.3f} ms pallas {ms_p:9.3f} ms  xla/pallas {ms_x / ms_p:.2f}x')


def main(argv: list[str]) -> None:
  args = _parse(argv)
  blocks = {}
  if args.block_q:
    blocks.update(block_q=args.block_q, block_q_bwd=args.block_q)
  if args.block_k:
    blocks.update(block_k=args.block_k, block_k_bwd=args.block_k)
  if args.decode_block_k:
    blocks.update(decode_block_k=args.decode_block_k)
  settings = ops.Settings(decode_splits=args.decode_splits, interpret=args.interpret,
                          backend=args.backend, num_warps=args.num_warps,
                          num_stages=args.num_stages, **blocks)
  parts = set(args.parts.split(','))
  if not parts <= {'flash', 'decode'}:
    raise SystemExit(f'--parts={args.parts!r}: choose from flash, decode')
  print(f'backend {jax.default_backend()} devices {jax.devices()} dtype {args.dtype} '
        f'interpret {args.interpret} kernels {ops.backend(settings)}')
  tol = 2e-2 if args.dtype == 'bfloat16' else 1e-4
  if not _check(args, settings, tol):
    raise SystemExit('kernels disagree with the references')
  for T in (int(s) for s in args.seqs.split(',')):
    if 'flash' in parts:
      _speed(args, settings, T)
    if 'decode' in parts:
      _decode_speed(args, settings, T)
