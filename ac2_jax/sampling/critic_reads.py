"""Critic reads: the policy answers a critic prompt with a few greedy value tokens, or one forward
gives its next-token distribution over the value tokens.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
from jax.sharding import Mesh, PartitionSpec as P
import jax.numpy as jnp
import numpy as np

from ac2_jax.critic.values import MAX_VALUE_TOKENS
from ac2_jax.models import qwen3
from ac2_jax.models.config import ModelConfig
from ac2_jax.sampling import decode
from ac2_jax.sampling import distribution
from ac2_jax.sampling import sampler
from ac2_jax.sampling import requests
from ac2_jax.sampling.settings import SamplingSettings


def greedy_decode(config: ModelConfig, params, contexts: Sequence[np.ndarray], *,
                  stop_ids: Sequence[int], max_new_tokens: int = MAX_VALUE_TOKENS,
                  mesh: Mesh | None = None, max_total_len: int | None = None,
                  max_batch: int | None = None, valid_vocab_size: int = 0) -> list[np.ndarray]:
  """Greedy continuation of each context: at most `max_new_tokens` new tokens, cut at a stop token.

  Ids >= `valid_vocab_size` (a padded checkpoint's rows without a token; 0 = none) are never
  chosen, as in `SamplingSettings`. Returns one int32 array per context; a stop token that ended
  it is its last entry.
  """
  if not 1 <= max_new_tokens <= MAX_VALUE_TOKENS:
    raise ValueError(f'greedy_decode: max_new_tokens must be in [1, {MAX_VALUE_TOKENS}], '
                     f'got {max_new_tokens}')
  out = sampler.generate(config, params, contexts, max_new_tokens,
                         SamplingSettings(greedy=True, valid_vocab_size=valid_vocab_size),
                         jax.random.key(0), stop_ids,
                         mesh=mesh, max_total_len=max_total_len, max_batch=max_batch)
  return out.tokens_list()


# The token ids are static (a critic's value grid: one set per run), so they are constants of the
# program rather than an upload per call.
@functools.partial(jax.jit, static_argnames=('token_ids', 'config', 'mesh', 'settings'))
def _log_probs_at(params, contexts_BxP, lengths_B, at_BxW, *, token_ids: tuple[int, ...],
                  config: ModelConfig, mesh: Mesh | None, settings: SamplingSettings):
  if mesh is not None:
    contexts_BxP = decode.constrain(contexts_BxP, mesh, P(decode.BATCH_AXES, None))
  hidden_BxPxE, _ = qwen3.forward(config, params, contexts_BxP, lengths_B=lengths_B,
                                  output='hidden')
  hidden_BxWxE = jnp.take_along_axis(hidden_BxPxE, (at_BxW - 1)[..., None], axis=1)
  logits_BxWxV = qwen3.head_logits(config, params, hidden_BxWxE)
  return distribution.sampling_log_probs(logits_BxWxV, settings)[..., jnp.asarray(token_ids)]


def token_distributions_at(config: ModelConfig, params, contexts: Sequence[np.ndarray],
                           positions: Sequence[Sequence[int]], token_ids: Sequence[int], *,
                           mesh: Mesh | None = None, valid_vocab_size: int = 0,
                           max_batch: int = 128) -> list[np.ndarray]:
  """`token_distribution` at several places of each context in one forward: for context i, the
  probabilities of `token_ids` at each of `positions[i]` (given the tokens before it),
  renormalised over `token_ids`. Returns float32 [len(positions[i]), len(token_ids)] per context.

  A decode that fills several slots (a critic's verdict per line) can run this to a fixed point
  instead of a forward per slot: slots filled with the argmax at every position they read are
  what greedy decoding, slot after slot, would have written."""
  token_ids = tuple(int(t) for t in token_ids)
  if len(contexts) > max_batch:
    return sum((token_distributions_at(config, params, contexts[i:i + max_batch],
                                       positions[i:i + max_batch], token_ids, mesh=mesh,
                                       valid_vocab_size=valid_vocab_size, max_batch=max_batch)
                for i in range(0, len(contexts), max_batch)), [])
  for c, at in zip(contexts, positions):
    if any(not 1 <= int(p) <= len(c) - 1 for p in at):
      raise ValueError(f'token_distributions_at: positions {list(at)} outside [1, {len(c) - 1}]')
  packed = requests.pack(contexts, 1, None, vocab_size=config.vocab_size,
                         max_total_len=config.max_position_embeddings + 1,
                         batch_multiple=sampler.check_mesh(mesh))
  B = packed.contexts_BxP.shape[0]
  W = requests.bucket(max((len(at) for at in positions), default=1), 8)
  at_BxW = np.ones((B, W), np.int32)
  for b, at in enumerate(positions):
    at_BxW[b, :len(at)] = at
  log_probs_BxWxM = sampler.to_host(_log_probs_at(
      params, sampler.to_device(packed.contexts_BxP, mesh),
      sampler.to_device(packed.context_lengths_B, mesh), sampler.to_device(at_BxW, mesh),
      token_ids=token_ids, config=config, mesh=mesh,
      settings=SamplingSettings(valid_vocab_size=valid_vocab_size)), 'token_distributions_at')
  out = []
  for b, at in enumerate(positions):
    p_WxM = np.exp(log_probs_BxWxM[b, :len(at)].astype(np.float64))
    out.append((p_WxM / p_WxM.sum(-1, keepdims=True)).astype(np.float32))
  return out


# Rows per forward of `token_distribution` on a CPU. Reads sorted by length and cut into calls of
# few rows pad little (the critic prompts of one step vary by a third in length), and on a CPU a
# small call is also faster per token: 140 bench-setting prompts took 0.59x / 0.51x / 0.43x /
# 0.38x the time of the layout before (given order, 128 rows) at 64 / 32 / 16 / 8 rows a call
# (launch/bench.py critic_reads, 2 cores). 16 keeps two row shapes (8 and 16). An accelerator
# wants its rows wide: there a call takes up to ACCELERATOR_READ_ROWS.
READ_ROWS = 16
ACCELERATOR_READ_ROWS = 128


def read_rows() -> int:
  """`token_distribution`'s rows per call on this backend."""
  return READ_ROWS if jax.default_backend() == 'cpu' else ACCELERATOR_READ_ROWS


def read_calls(contexts: Sequence[np.ndarray], max_batch: int, length_sorted: bool
               ) -> list[np.ndarray]:
  """The context indices of each device call of `token_distribution`: up to `max_batch` a call,
  longest first (`length_sorted`) or in the given order."""
  lengths_N = np.array([len(c) for c in contexts])
  order_N = (np.argsort(-lengths_N, kind='stable') if length_sorted
             else np.arange(len(contexts)))
  return [order_N[i:i + max_batch] for i in range(0, len(contexts), max_batch)]


def token_distribution(config: ModelConfig, params, contexts: Sequence[np.ndarray],
                       token_ids: Sequence[int], *, renormalize: bool = False,
                       mesh: Mesh | None = None, valid_vocab_size: int = 0,
                       max_batch: int | None = None, length_sorted: bool = True) -> np.ndarray:
  """Next-token probabilities after each context, restricted to `token_ids`, from one forward.

  Probabilities are those of the model's softmax at temperature 1 over the ids below
  `valid_vocab_size` (0 = all rows), the greedy read's support (so a row sums to the mass the
  model puts on these tokens, at most 1); with `renormalize=True` each row is divided by that
  mass and sums to 1. Contexts go through the model `max_batch` (default `read_rows()`) at a
  time: one forward of all of them holds every row's attention scores at once (1,650 walk
  critic prompts of about 380 tokens took 13 GB). With `length_sorted` (the default) the calls
  take the contexts longest first, each padded to its own longest (`requests.pack(fine=True)`);
  without, in the given order on the sampler's coarser ladder (the layout before; for the
  benchmark).

  Returns:
    float32 [N, len(token_ids)].
  """
  token_ids = [int(t) for t in token_ids]
  if not token_ids:
    raise ValueError('token_distribution: token_ids is empty')
  support = valid_vocab_size or config.vocab_size
  bad = [t for t in token_ids if not 0 <= t < support]
  if bad:
    raise ValueError(f'token_distribution: token_ids {bad} lie outside [0, {support})')
  max_batch = read_rows() if max_batch is None else max_batch
  if max_batch < 1:
    raise ValueError(f'token_distribution: max_batch must be >= 1, got {max_batch}')
  if len(contexts) == 0:
    return np.zeros((0, len(token_ids)), np.float32)
  calls = read_calls(contexts, max_batch, length_sorted)
  # Every call is dispatched before the one read of all their outputs.
  outputs = [_distribution_call(config, params, [contexts[i] for i in rows], token_ids,
                                mesh=mesh, valid_vocab_size=valid_vocab_size, fine=length_sorted)
             for rows in calls]
  probs_NxM = np.empty((len(contexts), len(token_ids)), np.float64)
  for rows, log_probs_Bx1xM in zip(calls, sampler.to_host(outputs, 'token_distribution')):
    probs_NxM[rows] = np.exp(log_probs_Bx1xM[:len(rows), 0].astype(np.float64))
  if renormalize:
    probs_NxM = probs_NxM / probs_NxM.sum(axis=-1, keepdims=True)
  return probs_NxM.astype(np.float32)


def _distribution_call(config: ModelConfig, params, contexts: Sequence[np.ndarray],
                       token_ids: Sequence[int], *, mesh: Mesh | None, valid_vocab_size: int,
                       fine: bool) -> jax.Array:
  """The log-probabilities of `token_ids` after each context of one device call, on the device:
  [B, 1, len(token_ids)] for B >= len(contexts) padded rows (the first len(contexts) are theirs)."""
  packed = requests.pack(contexts, 1, None, vocab_size=config.vocab_size,
                         max_total_len=config.max_position_embeddings + 1,
                         batch_multiple=sampler.check_mesh(mesh), fine=fine)
  # The next token is read at each context's end: position length, predicted from length - 1.
  lengths_B = packed.context_lengths_B
  return _log_probs_at(
      params, sampler.to_device(packed.contexts_BxP, mesh), sampler.to_device(lengths_B, mesh),
      sampler.to_device(lengths_B[:, None], mesh),
      token_ids=tuple(token_ids), config=config, mesh=mesh,
      settings=SamplingSettings(valid_vocab_size=valid_vocab_size))
