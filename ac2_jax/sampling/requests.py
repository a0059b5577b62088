"""Host side of sampling: ragged requests -> bucketed padded arrays, and device results -> rows.

Shapes are rounded up to a small set of buckets (16, 24, 32, 48, 64, 96, ...: powers of two and
their midpoints) so that the ragged requests of a whole training run hit only a handful of
compilations of the decoder, while padding wastes at most a third of a dimension.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

STOP_EOS = 'eos'
STOP_CHUNK_CAP = 'chunk_cap'
STOP_BUDGET = 'budget'

MIN_LENGTH_BUCKET = 16
MIN_BATCH_BUCKET = 8


def bucket(n: int, minimum: int = MIN_LENGTH_BUCKET) -> int:
  """The smallest value >= n of the form minimum * 2^k or 1.5 * minimum * 2^k."""
  if n < 1:
    raise ValueError(f'bucket: size must be >= 1, got {n}')
  size = minimum
  while True:
    if n <= size:
      return size
    if n <= size + size // 2:
      return size + size // 2
    size *= 2


def train_bucket(n: int, minimum: int = MIN_LENGTH_BUCKET) -> int:
  """The smallest multiple of max(minimum, 2^(ceil(log2 n) - 4)) that is >= n: eight steps an
  octave (..., 128, 144, 160, ..., 256, 288, ...), so padding wastes at most an eighth.

  For the sequence length of training batches. A training step's cost grows with its padded
  length (an actor update of 72 rows at T = 144 took 0.56x its time at `bucket`'s 192, where a
  chain response of 136 tokens lands), and its shapes repeat from step to step (full responses
  set the longest row), so the finer ladder costs few compilations; the sampler, whose shapes
  vary with every cut, keeps `bucket`.
  """
  if n < 1:
    raise ValueError(f'train_bucket: size must be >= 1, got {n}')
  step = max(minimum, 1 << max(0, (n - 1).bit_length() - 4))
  return -(-n // step) * step


@dataclasses.dataclass(frozen=True, eq=False)
class PackedRequests:
  """Requests as the decoder takes them: B >= N rows, the last B - N are padding.

  `caps_B` are the effective caps: a row's own cap, lowered where its context plus its new tokens
  would exceed the model's total length (the cache-full case).
  """

  contexts_BxP: np.ndarray
  context_lengths_B: np.ndarray
  caps_B: np.ndarray
  row_ids_B: np.ndarray
  max_new: int
  num_rows: int
  requested_caps_N: np.ndarray
  budgets_N: np.ndarray


def as_row_ints(values, n: int, name: str) -> np.ndarray:
  """One int per row from a sequence of n ints or a single int."""
  if np.ndim(values) == 0:
    return np.full((n,), int(values), np.int64)
  array = np.asarray(values)
  if array.shape != (n,) or not np.issubdtype(array.dtype, np.integer):
    raise ValueError(f'{name}: expected {n} integers (one per context), got shape {array.shape} '
                     f'dtype {array.dtype}')
  return array.astype(np.int64)


def pack(contexts: Sequence[np.ndarray], max_new_tokens, budget_new_tokens, *, vocab_size: int,
         max_total_len: int, batch_multiple: int = 1, row_ids=None,
         pad_id: int = 0, fine: bool = False) -> PackedRequests:
  """Validates ragged requests and pads them into bucketed arrays.

  Args:
    contexts: one 1-D integer array per request (prompt + replayed prefix), each non-empty.
    max_new_tokens: a cap per request (or one int for all), >= 1.
    budget_new_tokens: the remaining response budget per request (or None: equal to the cap);
      must be >= the cap. Only used to tell 'chunk_cap' from 'budget' stops.
    max_total_len: context plus new tokens never exceed this (the model's context limit).
    batch_multiple: the padded batch is a multiple of this (the number of batch shards).
    row_ids: per-request key index (default: the position in `contexts`).
    fine: rows padded to a multiple of MIN_BATCH_BUCKET and contexts to `train_bucket`, not to
      `bucket`'s half-octave ladder: for one forward without a cache (a critic read), whose
      cost follows the padded rows x length and whose shapes come from calls of fixed rows.
  """
  n = len(contexts)
  if n == 0:
    raise ValueError('generate: no contexts given')
  arrays = []
  for i, context in enumerate(contexts):
    array = np.asarray(context)
    if array.ndim != 1 or array.size == 0:
      raise ValueError(f'context {i}: expected a non-empty 1-D token array, got shape {array.shape}')
    if not np.issubdtype(array.dtype, np.integer):
      raise ValueError(f'context {i}: token ids must be integers, got dtype {array.dtype}')
    if array.min() < 0 or array.max() >= vocab_size:
      raise ValueError(f'context {i}: token ids must lie in [0, {vocab_size}), got '
                       f'[{array.min()}, {array.max()}]')
    if array.size >= max_total_len:
      raise ValueError(f'context {i}: {array.size} tokens leave no room for a new token within '
                       f'max_total_len={max_total_len}')
    arrays.append(array.astype(np.int32))
  caps_N = as_row_ints(max_new_tokens, n, 'max_new_tokens')
  if caps_N.min() < 1:
    raise ValueError(f'max_new_tokens: every cap must be >= 1, got {caps_N.min()} '
                     f'(row {int(caps_N.argmin())})')
  budgets_N = (caps_N.copy() if budget_new_tokens is None
               else as_row_ints(budget_new_tokens, n, 'budget_new_tokens'))
  short = np.nonzero(budgets_N < caps_N)[0]
  if short.size:
    i = int(short[0])
    raise ValueError(f'budget_new_tokens: row {i} has budget {budgets_N[i]} below its cap '
                     f'{caps_N[i]}; the cap of a request is at most its remaining budget')
  ids_N = (np.arange(n, dtype=np.int64) if row_ids is None
           else as_row_ints(row_ids, n, 'row_ids'))
  if ids_N.min() < 0 or ids_N.max() >= 2**31:
    raise ValueError(f'row_ids must lie in [0, 2^31), got [{ids_N.min()}, {ids_N.max()}]')

  lengths_N = np.array([a.size for a in arrays], np.int64)
  effective_N = np.minimum(caps_N, max_total_len - lengths_N)
  B = -(-n // MIN_BATCH_BUCKET) * MIN_BATCH_BUCKET if fine else bucket(n, MIN_BATCH_BUCKET)
  B = -(-B // batch_multiple) * batch_multiple
  P = (train_bucket if fine else bucket)(int(lengths_N.max()))
  C = bucket(int(effective_N.max()))
  contexts_BxP = np.full((B, P), pad_id, np.int32)
  for i, array in enumerate(arrays):
    contexts_BxP[i, :array.size] = array
  # Padding rows: one token, one new token, so they are done right after prefill.
  pad = B - n
  return PackedRequests(
      contexts_BxP=contexts_BxP,
      context_lengths_B=np.concatenate([lengths_N, np.ones(pad, np.int64)]).astype(np.int32),
      caps_B=np.concatenate([effective_N, np.ones(pad, np.int64)]).astype(np.int32),
      row_ids_B=np.concatenate([ids_N, np.arange(pad) + ids_N.max() + 1]).astype(np.uint32),
      max_new=C,
      num_rows=n,
      requested_caps_N=caps_N,
      budgets_N=budgets_N)


@dataclasses.dataclass(frozen=True, eq=False)
class SampleOutput:
  """Generated continuations, one row per request, in request order.

  Padded [N, T] arrays with T = max(num_new_N); entries past a row's `num_new_N` are 0.
  A stop token that ended a row is its last new token (included in tokens and counts).

  Attributes:
    tokens_NxT: int32 new tokens.
    logprobs_NxT: float32 log-probability of each token under the sampling distribution
      (temperature, top-k and top-p applied; see `distribution.sampling_log_probs`).
    entropies_NxT: float32 entropy (nats) of the sampling distribution at each token.
    num_new_N: int32 number of new tokens.
    stop_reason_N: 'eos' (ended on a stop token), 'chunk_cap' (reached its cap while the cap was
      below its remaining budget), 'budget' (reached its remaining budget, or the model's length
      limit).
    decode_forwards_N: max(num_new - 1, 0), the decoding forwards the FLOPs accounting counts
      (the first token comes from prefill).
  """

  tokens_NxT: np.ndarray
  logprobs_NxT: np.ndarray
  entropies_NxT: np.ndarray
  num_new_N: np.ndarray
  stop_reason_N: np.ndarray
  decode_forwards_N: np.ndarray

  def __len__(self) -> int:
    return len(self.num_new_N)

  def tokens(self, i: int) -> np.ndarray:
    return self.tokens_NxT[i, :self.num_new_N[i]]

  def logprobs(self, i: int) -> np.ndarray:
    return self.logprobs_NxT[i, :self.num_new_N[i]]

  def entropies(self, i: int) -> np.ndarray:
    return self.entropies_NxT[i, :self.num_new_N[i]]

  def tokens_list(self) -> list[np.ndarray]:
    return [self.tokens(i) for i in range(len(self))]


def unpack(packed: PackedRequests, tokens_BxC: np.ndarray, logprobs_BxC: np.ndarray,
           entropies_BxC: np.ndarray, num_new_B: np.ndarray,
           stop_ids: tuple[int, ...]) -> SampleOutput:
  """Drops padding rows and columns and assigns each row its stop reason."""
  n = packed.num_rows
  num_new_N = np.asarray(num_new_B[:n], np.int32)
  T = int(num_new_N.max())
  tokens_NxT = np.asarray(tokens_BxC[:n, :T], np.int32)
  last_N = tokens_NxT[np.arange(n), num_new_N - 1]
  ended_on_stop_N = np.isin(last_N, np.asarray(stop_ids, np.int64))
  cap_binding_N = ((packed.caps_B[:n] == packed.requested_caps_N)
                   & (packed.requested_caps_N < packed.budgets_N))
  reasons_N = np.where(ended_on_stop_N, STOP_EOS,
                       np.where(cap_binding_N, STOP_CHUNK_CAP, STOP_BUDGET))
  return SampleOutput(
      tokens_NxT=tokens_NxT,
      logprobs_NxT=np.asarray(logprobs_BxC[:n, :T], np.float32),
      entropies_NxT=np.asarray(entropies_BxC[:n, :T], np.float32),
      num_new_N=num_new_N,
      stop_reason_N=reasons_N,
      decode_forwards_N=np.maximum(num_new_N - 1, 0).astype(np.int32))


def concat(outputs: Sequence[SampleOutput], order_N: np.ndarray) -> SampleOutput:
  """Joins outputs of consecutive groups of rows; row j of the join is request order_N[j]."""
  T = max(o.tokens_NxT.shape[1] for o in outputs)

  def join(name):
    parts = [np.pad(getattr(o, name), ((0, 0), (0, T - getattr(o, name).shape[1])))
             for o in outputs]
    return np.concatenate(parts)[np.argsort(order_N)]

  def join_rows(name):
    return np.concatenate([getattr(o, name) for o in outputs])[np.argsort(order_N)]

  return SampleOutput(tokens_NxT=join('tokens_NxT'), logprobs_NxT=join('logprobs_NxT'),
                      entropies_NxT=join('entropies_NxT'), num_new_N=join_rows('num_new_N'),
                      stop_reason_N=join_rows('stop_reason_N'),
                      decode_forwards_N=join_rows('decode_forwards_N'))
