"""The jitted decoder: prefill of right-padded contexts, then one `lax.while_loop` over a KV cache.

Everything here works on padded, bucketed device arrays; `requests.py` builds them from ragged host
requests and `sampler.py` is the host API. Row r of the batch draws its t-th new token with the key
`fold_in(fold_in(key, row_id[r]), t)`, so its tokens depend on neither its neighbours nor the
padding of the batch.

The cache is allocated inside the jitted function and only ever updated in place by the loop, so
XLA owns one buffer for it from prefill to the last decode step (no donated copy is needed). It is
carried as one keys and one values array per layer (`qwen3.layer_cache_shapes`), a form
`qwen3.forward` takes and returns. Carrying the stacked [L, ...] array instead costs a copy of the
whole cache on every decode step (measured: the tiny preset decodes 2x faster, the small one
10-20%).

Attention reads every slot of the cache it is given, so a long generation grows its cache in
segments (`segment_ends`): for C = 51,200 new tokens the loop runs while they fit in P + 6,400
slots, then the cache is padded to P + 12,800 and the loop goes on, doubling up to P + C. Over the
generation attention reads 0.67 of the slots it would read in the whole cache; each doubling
copies the cache once, and each segment is one more loop body to trace and compile (C < 512 keeps
one segment, as before). Only the
XLA attention path grows its cache: the Pallas decode kernel already stops at each row's last slot.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax.numpy as jnp

from ac2_jax import sharding
from ac2_jax.models import qwen3
from ac2_jax.models.config import ModelConfig
from ac2_jax.sampling import distribution
from ac2_jax.sampling.settings import SamplingSettings

BATCH_AXES = sharding.BATCH_AXES

# The decode loop's cache segments (module docstring): the first holds at least this many new
# tokens; there are at most MAX_SEGMENTS (each is a loop body to trace and compile; past 4 the
# slots read shrink little: 4 segments read 0.67 of the whole cache's slots over a generation,
# an unlimited number 0.5 + 1 / (2 C)).
FIRST_SEGMENT_TOKENS = 256
MAX_SEGMENTS = 4

# Number of times `decode_batch` has been traced (each trace is one compilation).
_TRACES = {'decode_batch': 0}


def trace_count() -> int:
  """How many distinct shapes/settings `decode_batch` has been compiled for in this process."""
  return _TRACES['decode_batch']


class DecodeCarry(NamedTuple):
  """The state of the decode loop between steps."""
  step: jax.Array            # decode steps taken (the prefill drew token 0)
  cache: dict                # {'k', 'v'}: one [B, S, K, D] array per layer
  token_B: jax.Array         # each row's last drawn token
  tokens_BxC: jax.Array
  logprobs_BxC: jax.Array
  entropies_BxC: jax.Array
  num_new_B: jax.Array
  done_B: jax.Array


def last_hidden(hidden_BxTxE: jax.Array, lengths_B: jax.Array) -> jax.Array:
  """The hidden state of each row's last valid position."""
  return jnp.take_along_axis(hidden_BxTxE, (lengths_B - 1)[:, None, None], axis=1)[:, 0]


def constrain(x, mesh: Mesh | None, spec: P):
  if mesh is None:
    return x
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def layer_cache_spec(config: ModelConfig, mesh: Mesh, batch: int) -> P:
  """A layer's keys or values: rows over the batch axes, KV heads over 'tensor' (where they divide
  evenly), in either cache layout (`qwen3.layer_cache_shapes`)."""
  if qwen3.heads_major_cache(config):
    return sharding.fit_spec((BATCH_AXES, 'tensor', None, None),
                             (batch, config.num_kv_heads, 0, 0), mesh)
  return sharding.fit_spec((BATCH_AXES, None, 'tensor', None),
                           (batch, 0, config.num_kv_heads, 0), mesh)


def segment_ends(max_new: int, first: int = FIRST_SEGMENT_TOKENS) -> list[int]:
  """New-token slots of the cache in each segment of the decode loop: max_new, halved while the
  half is at least `first`, at most MAX_SEGMENTS of them (`first` = 0: one segment)."""
  ends = [max_new]
  while first > 0 and len(ends) < MAX_SEGMENTS and -(-ends[0] // 2) >= first:
    ends.insert(0, -(-ends[0] // 2))
  return ends


def cache_of(config: ModelConfig, mesh: Mesh | None, batch: int, slots: int,
             cache: dict | None = None) -> dict:
  """The KV cache with `slots` slots per row: zeros, or `cache` padded with zero slots."""
  shapes = dict(zip(('k', 'v'), qwen3.layer_cache_shapes(config, batch, slots)))
  if cache is None:
    cache = {name: tuple(jnp.zeros(shape, config.jnp_dtype) for _ in range(config.num_layers))
             for name, shape in shapes.items()}
  else:
    cache = {name: tuple(jnp.pad(x, [(0, n - m) for m, n in zip(x.shape, shapes[name])])
                         for x in arrays) for name, arrays in cache.items()}
  if mesh is not None:
    cache = jax.tree.map(lambda x: constrain(x, mesh, layer_cache_spec(config, mesh, batch)),
                         cache)
  return cache


@functools.partial(jax.jit, static_argnames=('config', 'settings', 'stop_ids', 'max_new', 'mesh',
                                             'first_segment'))
def decode_batch(params, key, contexts_BxP, context_lengths_B, caps_B, row_ids_B, *,
                 config: ModelConfig, settings: SamplingSettings, stop_ids: tuple[int, ...],
                 max_new: int, mesh: Mesh | None = None, first_segment: int | None = None):
  """Generates up to `max_new` tokens per row.

  Args:
    params: decoder parameters (placed as the caller wants them; sharded under `mesh`).
    key: PRNG key of the whole call.
    contexts_BxP: right-padded int32 contexts (prompt + replayed prefix).
    context_lengths_B: valid tokens per row, >= 1.
    caps_B: new-token cap per row, 1 <= cap <= max_new; a row stops at its cap or a stop token.
    row_ids_B: per-row key index (the row's position in the caller's request list).
    max_new: length of the output buffers (a bucket >= max(caps_B)).
    first_segment: new-token slots of the cache's first segment (module docstring; 0: the whole
      cache from the start). It changes no result, only which slots attention reads. Default:
      FIRST_SEGMENT_TOKENS on the XLA attention path; 0 for the Pallas kernels, which stop at
      each row's last filled slot themselves (a grown cache would only cost its copies).

  Returns:
    tokens_BxC (int32), logprobs_BxC and entropies_BxC (float32, of the sampling distribution),
    num_new_B (int32). Entries past a row's num_new are 0.
  """
  _TRACES['decode_batch'] += 1
  B, P_ = contexts_BxP.shape
  C = max_new
  batch = P(BATCH_AXES)
  if first_segment is None:
    first_segment = FIRST_SEGMENT_TOKENS if config.attention_impl == 'xla' else 0
  ends = segment_ends(C, first_segment)
  cache = cache_of(config, mesh, B, P_ + ends[0])
  contexts_BxP = constrain(contexts_BxP, mesh, P(BATCH_AXES, None))
  row_keys_B = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_ids_B)
  stop_ids_S = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)

  def choose(logits_BxV, index_B):
    log_probs_BxV = distribution.sampling_log_probs(logits_BxV, settings)
    keys_B = jax.vmap(jax.random.fold_in)(row_keys_B, index_B)
    tokens_B = distribution.draw(keys_B, log_probs_BxV, settings.greedy)
    return (constrain(tokens_B, mesh, batch),
            distribution.token_log_probs(log_probs_BxV, tokens_B),
            distribution.entropy(log_probs_BxV))

  def is_stop(tokens_B):
    return jnp.any(tokens_B[:, None] == stop_ids_S[None, :], axis=-1)

  hidden_BxPxE, cache = qwen3.forward(config, params, contexts_BxP, cache=cache,
                                      lengths_B=context_lengths_B, output='hidden')
  logits_BxV = qwen3.head_logits(config, params, last_hidden(hidden_BxPxE, context_lengths_B))
  token_B, logprob_B, entropy_B = choose(logits_BxV, jnp.zeros((B,), jnp.int32))
  first_C = jnp.arange(C) == 0
  tokens_BxC = jnp.where(first_C, token_B[:, None], 0)
  logprobs_BxC = jnp.where(first_C, logprob_B[:, None], 0.0)
  entropies_BxC = jnp.where(first_C, entropy_B[:, None], 0.0)
  num_new_B = jnp.ones((B,), jnp.int32)
  done_B = is_stop(token_B) | (caps_B <= 1)

  def body(c: DecodeCarry) -> DecodeCarry:
    # The last drawn token enters the cache at the slot after the row's previous tokens.
    positions_B = context_lengths_B + c.num_new_B - 1
    logits_Bx1xV, cache = qwen3.forward(config, params, c.token_B[:, None], cache=c.cache,
                                        cache_lengths_B=positions_B)
    new_B, logprob_B, entropy_B = choose(logits_Bx1xV[:, 0], c.num_new_B)
    active_B = ~c.done_B
    write_BxC = active_B[:, None] & (jnp.arange(C)[None, :] == c.num_new_B[:, None])
    num_new_B = c.num_new_B + active_B.astype(jnp.int32)
    return DecodeCarry(
        step=c.step + 1, cache=cache, token_B=jnp.where(active_B, new_B, c.token_B),
        tokens_BxC=jnp.where(write_BxC, new_B[:, None], c.tokens_BxC),
        logprobs_BxC=jnp.where(write_BxC, logprob_B[:, None], c.logprobs_BxC),
        entropies_BxC=jnp.where(write_BxC, entropy_B[:, None], c.entropies_BxC),
        num_new_B=num_new_B,
        done_B=c.done_B | (active_B & (is_stop(new_B) | (num_new_B >= caps_B))))

  carry = DecodeCarry(
      step=jnp.int32(1), cache=cache, token_B=token_B, tokens_BxC=tokens_BxC,
      logprobs_BxC=logprobs_BxC, entropies_BxC=entropies_BxC, num_new_B=num_new_B,
      done_B=done_B)
  for j, end in enumerate(ends):
    if j:  # the next segment: room for `end` new tokens (a step writes slot < P + step)
      carry = carry._replace(cache=cache_of(config, mesh, B, P_ + end, carry.cache))
    carry = jax.lax.while_loop(
        lambda c, end=end: (c.step < end) & ~jnp.all(c.done_B), body, carry)
  return carry.tokens_BxC, carry.logprobs_BxC, carry.entropies_BxC, carry.num_new_B
