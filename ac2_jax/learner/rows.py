"""Rollout rows shared by every algorithm: generation, actor batches, critic reads and records.

A `Row` is one sampled continuation: its context (prompt + replayed prefix), its new tokens with
their sampling log-probs and entropies, and, once scored, its advantage and loss weight. Every
algorithm builds rows, scores them its own way, and hands them to `train_actor`.

Update metrics stay on the device: `train_actor` and `train_critic` return them as arrays, and an
algorithm reads a step's metrics once, at its end (`device_reads.read('update_metrics', ...)`).
Scalars go to the device explicitly (`rt.put_batch`), as the batches do.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from ac2_jax import critic, sampling
from ac2_jax.critic import self_check
from ac2_jax.learner import updates
from ac2_jax.learner.runtime import Runtime
from ac2_jax.rl import critic_loss, flops


@dataclasses.dataclass
class Row:
  problem_index: int          # index into the split's records
  context_P: np.ndarray       # prompt + replayed prefix (int32)
  prefix_len: int             # replayed prefix tokens inside the context
  new_N: np.ndarray           # generated tokens (int32), the stop token included
  logprobs_N: np.ndarray      # log-probs under the sampling distribution
  entropies_N: np.ndarray
  stop_reason: str
  advantage: float = 0.0
  weight: float = 0.0         # 0: the row does not enter the actor loss
  # Per-token advantages (PPO's GAE, PACT); None: `advantage` on every generated token.
  advantages_N: np.ndarray | None = None
  # The policy version that sampled each token (in-flight rollouts); None: the current one.
  versions_N: np.ndarray | None = None

  @property
  def prompt_len(self) -> int:
    return len(self.context_P) - self.prefix_len


def generate_rows(rt: Runtime, params, contexts: Sequence[np.ndarray], prefix_lens: Sequence[int],
                  problem_indices: Sequence[int], caps: Sequence[int], budgets: Sequence[int],
                  key: jax.Array, settings: sampling.SamplingSettings, short_cap: int = 0
                  ) -> tuple[list[Row], np.ndarray]:
  """Samples one continuation per context; returns the rows and each row's decoding FLOPs
  (float64, `flops.decoding_flops`). Rows whose cap is at most `short_cap` decode in calls of
  their own (`sampling.generate`)."""
  out = sampling.generate(rt.model_config, params, list(contexts), np.asarray(caps),
                          settings, key, (rt.tokenizer.eos_id,),
                          budget_new_tokens=np.asarray(budgets), mesh=rt.mesh,
                          max_total_len=rt.max_total_len, max_batch=rt.max_sample_batch,
                          short_cap=short_cap)
  rows = [Row(int(problem_indices[i]), np.asarray(contexts[i], np.int32), int(prefix_lens[i]),
              out.tokens(i), out.logprobs(i), out.entropies(i), str(out.stop_reason_N[i]))
          for i in range(len(out))]
  flops_N = flops.decoding_flops(rt.model_config, np.array([len(c) for c in contexts]),
                                 out.num_new_N.astype(np.int64))
  return rows, flops_N


# A critic update's records are split by length only when each part keeps at least this many rows.
MIN_LENGTH_GROUP_ROWS = 8


def bucket_rows(n: int, multiple: int) -> int:
  b = max(8, 1 << max(0, (n - 1).bit_length()))
  return -(-b // multiple) * multiple


def actor_batch(rt: Runtime, rows: Sequence[Row]) -> updates.ActorBatch:
  """Right-padded (context + new tokens) with the loss on generated tokens, rows and length bucketed."""
  T = sampling.train_bucket(max(len(r.context_P) + len(r.new_N) for r in rows))
  B = bucket_rows(len(rows), rt.batch_multiple)
  tokens = np.zeros((B, T), np.int32)
  mask = np.zeros((B, T), np.float32)
  old = np.zeros((B, T), np.float32)
  adv = np.zeros((B, T), np.float32)
  for b, r in enumerate(rows):
    c, n = len(r.context_P), len(r.new_N)
    tokens[b, :c] = r.context_P
    tokens[b, c:c + n] = r.new_N
    mask[b, c:c + n] = r.weight
    old[b, c:c + n] = r.logprobs_N
    adv[b, c:c + n] = r.advantage if r.advantages_N is None else r.advantages_N
  return rt.put_batch(updates.ActorBatch(tokens, mask, old, adv))


def minibatch_rows(rt: Runtime, rows: Sequence, minibatch: int) -> list:
  """The rows of minibatch `minibatch` of rt.actor_minibatches equal, in-order splits of the rows
  in the loss (refills and dropped singles, weight 0, take no place in a minibatch)."""
  trained = [r for r in rows if r.weight > 0]
  parts = np.array_split(np.arange(len(trained)), rt.actor_minibatches)
  return [trained[i] for i in parts[minibatch]]


def train_actor(rt: Runtime, state, rows: Sequence[Row], eps_high: float, minibatch: int):
  """Actor update on one minibatch (`minibatch` of rt.actor_minibatches equal, in-order splits).

  Returns (state, metrics on the device). Advantages were computed on the whole batch before the
  split.
  """
  chosen = minibatch_rows(rt, rows, minibatch)
  if not chosen:
    return state, {'skipped_empty': 1.0}
  return rt.actor_step(state, actor_batch(rt, chosen), rt.put_batch(np.float32(eps_high)))


def response_texts(rt: Runtime, rows: Sequence[Row]) -> list[str]:
  """The whole response so far (replayed prefix + new tokens) of each row, as text."""
  return [rt.tokenizer.decode(np.concatenate([r.context_P[r.prompt_len:], r.new_N]).tolist())
          for r in rows]


def self_check_verdicts(rt: Runtime, params, contexts: Sequence[np.ndarray]
                       ) -> list[tuple[list[tuple[int, int]], list[bool]]]:
  """Per critic prompt, its lines' result spans and the policy's own check of each
  (`critic.self_check`): one forward reads the greedy digit at every written result."""
  tok = rt.tokenizer
  digits = self_check.digit_ids(tok)
  spans = [self_check.result_spans(tok, c) for c in contexts]
  todo = [i for i, s in enumerate(spans) if s]
  probs = (sampling.token_distributions_at(
      rt.model_config, params, [contexts[i] for i in todo],
      [[p for first, end in spans[i] for p in range(first, end)] for i in todo], digits,
      mesh=rt.mesh, valid_vocab_size=rt.valid_vocab_size) if todo else [])
  out = [(s, []) for s in spans]
  for i, p_WxD in zip(todo, probs):
    out[i] = (spans[i], self_check.verdicts_from(contexts[i], spans[i],
                                                 np.take(digits, p_WxD.argmax(-1))))
  return out


def reference_verdicts(rt: Runtime, contexts: Sequence[np.ndarray]
                       ) -> list[tuple[list[tuple[int, int]], list[bool] | None]]:
  """Per critic prompt, its lines' result spans and whether each line is the reference's
  (`critic.reference_check`; None where the prompt shows no reference)."""
  tok = rt.tokenizer
  out = []
  for context in contexts:
    spans = self_check.result_spans(tok, context)
    out.append((spans, rt.task.reference_verdicts(self_check.attempt_lines(tok, context, spans),
                                                  self_check.after_attempt(tok, context))))
  return out


def self_checked(rt: Runtime, policy_params, contexts: Sequence[np.ndarray | None]
                 ) -> list[np.ndarray | None]:
  """The critic prompts as the critic reads and trains on them: each worked line marked as
  `rt.critic_marks` says (critic/self_check.py; None where the marked prompt no longer fits, as
  for `rt.critic_context`), else as they are. 'self': the policy's own check, read with
  `policy_params`; 'reference': whether the line is the reference's (a prompt without the
  reference stays unmarked).

  The self-check reads the actor's weights, never an adapter's: trained on values alone, an
  adapter leaves the results' positions unanchored, and there the merged weights' greedy digit
  fell from 99.4% right to 63% within 21,000 pairs (BENCHMARKS.md, "Session 21")."""
  if not rt.critic_marks:
    return list(contexts)
  fits = [i for i, c in enumerate(contexts) if c is not None]
  fitting = [contexts[i] for i in fits]
  marks = (self_check_verdicts(rt, policy_params, fitting) if rt.critic_marks == 'self'
           else reference_verdicts(rt, fitting))
  out = list(contexts)
  for i, (spans, verdicts) in zip(fits, marks):
    if verdicts is None:
      continue
    ids, _ = self_check.with_verdicts(rt.tokenizer, contexts[i], spans, verdicts)
    out[i] = ids if len(ids) + sampling.MAX_VALUE_TOKENS <= rt.max_total_len else None
  return out


def critic_contexts(rt: Runtime, policy_params, prompts: Sequence[np.ndarray],
                    responses: Sequence[np.ndarray], references: Sequence[str | None]
                    ) -> list[np.ndarray | None]:
  """The critic prompt of each (prompt, response, reference), its lines marked when the run's
  critic marks them (`self_checked`, the self-check read with `policy_params`); None where it
  does not fit."""
  return self_checked(rt, policy_params, [rt.critic_context(p, r, ref)
                                          for p, r, ref in zip(prompts, responses, references)])


def critic_reads(rt: Runtime, params, prompts: Sequence[np.ndarray],
                 responses: Sequence[np.ndarray], references: Sequence[str | None],
                 policy_params=None) -> list[float | None]:
  """The critic's V(prompt . response): greedy reply after 'Q value: ', parsed (None = invalid,
  also when the critic prompt does not fit). `policy_params`: the actor's weights, which a
  self-checking critic's check reads (default `params`: the paper's critic is the policy)."""
  if not prompts:
    return []
  contexts = critic_contexts(rt, params if policy_params is None else policy_params, prompts,
                             responses, references)
  fits = [c for c in contexts if c is not None]
  replies = iter(sampling.greedy_decode(rt.model_config, params, fits,
                                        stop_ids=(rt.tokenizer.eos_id,), mesh=rt.mesh,
                                        max_total_len=rt.max_total_len,
                                        max_batch=rt.max_sample_batch,
                                        valid_vocab_size=rt.valid_vocab_size) if fits else [])
  values = []
  for context in contexts:
    values.append(None if context is None else critic.parse_value(rt.tokenizer.decode(
        [t for t in next(replies).tolist() if t != rt.tokenizer.eos_id])))
  return values


def expected_critic_reads(rt: Runtime, params, prompts: Sequence[np.ndarray],
                          responses: Sequence[np.ndarray], references: Sequence[str | None],
                          policy_params=None) -> list[float | None]:
  """The critic's V(prompt . response) as the mean of its value distribution after 'Q value: '.

  One forward per context reads the probabilities of the grid values' tokens (each value must be
  one token, as in the built-in tokenizer) and returns sum_z p(z) z / sum_z p(z). A read whose
  grid values take less than half of the next-token mass is invalid (None), as an unparseable
  greedy reply is, and so is one whose critic prompt does not fit. Unlike the greedy reply, which
  is the mode of the critic's distribution, this is its mean: a critic that knows little answers
  near the mean label instead of at the most common one.
  """
  if not prompts:
    return []
  grid_ids = []
  for value in critic.GRID:
    ids = critic.value_target_ids(rt.tokenizer, value)[:-1]
    if len(ids) != 1:
      raise ValueError(f'critic readout "expectation" needs every grid value to be one token; '
                       f'{critic.format_value(value)!r} is {len(ids)} tokens in this tokenizer')
    grid_ids.append(ids[0])
  contexts = critic_contexts(rt, params if policy_params is None else policy_params, prompts,
                             responses, references)
  fits = [c for c in contexts if c is not None]
  probs_NxM = (sampling.token_distribution(rt.model_config, params, fits, grid_ids, mesh=rt.mesh,
                                           valid_vocab_size=rt.valid_vocab_size)
               if fits else np.zeros((0, len(grid_ids))))
  grid_M = np.asarray(critic.GRID, np.float64)
  values, rows = [], iter(probs_NxM.astype(np.float64))
  for context in contexts:
    if context is None:
      values.append(None)
      continue
    p_M = next(rows)
    mass = p_M.sum()
    values.append(float(p_M @ grid_M / mass) if mass >= 0.5 else None)
  return values


READOUTS = ('greedy', 'expectation')


def critic_reader(readout: str):
  """The critic-read function for a readout name ('greedy': the paper's; 'expectation')."""
  if readout == 'greedy':
    return critic_reads
  if readout == 'expectation':
    return expected_critic_reads
  raise ValueError(f'critic readout must be one of {READOUTS}, got {readout!r}')


def critic_records_batch(rt: Runtime, contexts: Sequence[np.ndarray], records: Sequence,
                         length_groups: int = 2,
                         rationales: Sequence[Sequence[int]] | None = None
                         ) -> tuple[updates.CriticBatch, ...] | None:
  """Critic prompt (`contexts[i]`, from `rt.critic_context`) + value target tokens per record, the
  targets masked: the records sorted by length and cut into up to `length_groups` batches of equal
  rows, each padded to its own length bucket (`rt.critic_step` sums their gradients into one
  update). A record's prompt with the reference is about a reference longer than without it, so
  one bucket for all of them pads half the records by that much.

  `rationales[i]`: the positions in context i of a rationale's tokens that the critic writes before
  its value (`critic.with_rationale`), trained beside the value."""
  if not records:
    return None
  if rt.critic_target == 'two_hot':
    return _two_hot_batches(rt, contexts, records, length_groups, rationales)
  targets = [critic.value_target_ids(rt.tokenizer, rec.target) for rec in records]
  longest = max(len(t) for t in targets)
  if longest > critic_loss.MAX_VALUE_TOKENS:
    # The loss reads a window of MAX_VALUE_TOKENS positions (`updates.target_window`): a longer
    # reply would lose its last tokens silently.
    raise ValueError(f'a critic target is {longest} tokens (value and end of turn); the critic '
                     f'loss takes at most {critic_loss.MAX_VALUE_TOKENS}')
  return tuple(_critic_batch(rt, [contexts[i] for i in group], [targets[i] for i in group],
                             [records[i].weight for i in group],
                             rationales=_pick(rationales, group))
               for group in _length_groups(contexts, targets, length_groups))


def _pick(items: Sequence | None, group: Sequence[int]) -> list | None:
  return None if items is None else [items[i] for i in group]


def _length_groups(contexts, targets, length_groups: int) -> list[list[int]]:
  """Record indices sorted by length, cut into up to `length_groups` groups of equal rows."""
  order = sorted(range(len(contexts)), key=lambda i: len(contexts[i]) + len(targets[i]))
  rows = -(-len(order) // max(1, length_groups))
  if rows < MIN_LENGTH_GROUP_ROWS:
    rows = len(order)  # too few to be worth a second compiled shape
  return [order[k:k + rows] for k in range(0, len(order), rows)]


def _two_hot_batches(rt: Runtime, contexts, records, length_groups: int, rationales=None):
  """`critic_records_batch` with two-hot targets (`critic.two_hot` of each record's unrounded
  `value`, else its `target`): the lower grid value's tokens, the upper one's token beside them."""
  lower_ids, uppers = [], []
  for rec in records:
    value = getattr(rec, 'value', None)
    ids, upper, weight = critic.two_hot_target_ids(rt.tokenizer,
                                                   rec.target if value is None else value)
    lower_ids.append(ids)
    uppers.append((upper, weight))
  return tuple(_critic_batch(rt, [contexts[i] for i in group], [lower_ids[i] for i in group],
                             [records[i].weight for i in group], [uppers[i] for i in group],
                             _pick(rationales, group))
               for group in _length_groups(contexts, lower_ids, length_groups))


def _critic_batch(rt: Runtime, contexts, targets, weights, uppers=None, rationales=None
                  ) -> updates.CriticBatch:
  T = sampling.train_bucket(max(len(s) + len(t) for s, t in zip(contexts, targets)))
  B = bucket_rows(len(contexts), rt.batch_multiple)
  tokens = np.zeros((B, T), np.int32)
  mask = np.zeros((B, T), np.float32)
  weights_B = np.zeros((B,), np.float32)
  for b, (s, t, w) in enumerate(zip(contexts, targets, weights)):
    tokens[b, :len(s)] = s
    tokens[b, len(s):len(s) + len(t)] = t
    mask[b, len(s):len(s) + len(t)] = 1.0
    weights_B[b] = w
  fields = {}
  if uppers is not None:
    fields['upper_token_B'] = np.zeros((B,), np.int32)
    fields['upper_weight_B'] = np.zeros((B,), np.float32)
    for b, (token, weight) in enumerate(uppers):
      fields['upper_token_B'][b], fields['upper_weight_B'][b] = token, weight
  if rationales is not None:
    fields['rationale_mask_BxT'] = np.zeros((B, T), np.float32)
    for b, positions in enumerate(rationales):
      fields['rationale_mask_BxT'][b, list(positions)] = 1.0
    # A bucketed window: one compiled shape per bucket, not per widest rationale.
    fields['rationale_width'] = sampling.bucket(
        max((max(p) - min(p) + 1 for p in rationales if len(p)), default=1), 8)
  return rt.put_batch(updates.CriticBatch(tokens, mask, weights_B, **fields))
