"""Jitted update steps: `(state, batch, scalars) -> (state, metrics)` for the actor and the critic.

Both move the same parameters with their own optimizer state. Each accumulates gradients over
micro-batches with `lax.scan` (losses come as (sum, count), so the accumulated mean is exact), and
skips the update when the loss or a gradient is not finite (reported as `skipped` = 1).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from ac2_jax import models
from ac2_jax.rl import critic_loss, entropy, policy_loss
from ac2_jax.learner import critic_adapter
from ac2_jax.learner import state as state_lib


POLICY_LOSSES = ('ppo', 'dis')


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
  model: models.ModelConfig
  optim: state_lib.OptimSettings
  temperature: float = 0.8
  eps_low: float = 0.2
  dual_clip: float | None = 3.0
  # 'ppo' (clipped surrogate, above) or 'dis' (SAO/PACT's direct double-sided IS: tokens whose
  # ratio to the sampling policy leaves (dis_low, dis_high) drop out of the loss).
  policy_loss: str = 'ppo'
  dis_low: float = 0.7
  dis_high: float = 6.0
  # Rows per gradient micro-batch; 0 = the whole minibatch at once.
  micro_batch: int = 0
  # Positions projected onto the vocabulary at a time in the losses; 0 = all at once.
  logits_chunk: int = 0
  # Ids >= this are outside every log-prob's support (a checkpoint padded past its tokenizer):
  # the same value as the samplers' `SamplingSettings.valid_vocab_size`, so the learner normalises
  # over the ids the sampler draws from. 0 = every vocabulary row is a token.
  valid_vocab_size: int = 0

  def __post_init__(self):
    if self.policy_loss not in POLICY_LOSSES:
      raise ValueError(f'policy_loss must be one of {POLICY_LOSSES}, got {self.policy_loss!r}')
    if (int(self.valid_vocab_size) != self.valid_vocab_size
        or not 0 <= self.valid_vocab_size <= self.model.vocab_size):
      raise ValueError(f'UpdateSettings.valid_vocab_size must be an int in [0, '
                       f'{self.model.vocab_size}] (0 = the whole vocabulary), got '
                       f'{self.valid_vocab_size!r}')


@flax.struct.dataclass
class ActorBatch:
  """Right-padded sequences (context + new tokens). Position t of the per-token arrays describes
  token t, predicted from position t - 1; `loss_mask_BxT` is 1 on generated tokens only."""
  tokens_BxT: jax.Array
  loss_mask_BxT: jax.Array
  old_logprobs_BxT: jax.Array
  advantages_BxT: jax.Array


@flax.struct.dataclass
class CriticBatch:
  """Critic records: critic prompt + value target tokens; `target_mask_BxT` marks the targets.

  With two-hot targets (`critic.values.two_hot`) the first target token is the lower grid value
  and `upper_token_B` the upper one, which takes `upper_weight_B` of that position's likelihood;
  None: every target is its tokens alone (the paper's rounded targets).

  A critic that writes a rationale before its value (`critic.with_rationale`: a verdict per line
  of the attempt) has it inside the prompt; `rationale_mask_BxT` marks the tokens the critic writes
  (all within `rationale_width` positions of a row's first), trained beside the value.
  """
  tokens_BxT: jax.Array
  target_mask_BxT: jax.Array
  weights_B: jax.Array
  upper_token_B: jax.Array | None = None
  upper_weight_B: jax.Array | None = None
  rationale_mask_BxT: jax.Array | None = None
  rationale_width: int = flax.struct.field(pytree_node=False, default=0)


def sequence_logprobs(model_config, params, tokens_BxT, temperature, logits_chunk: int = 0,
                      valid_vocab_size: int = 0):
  """log pi(token t | tokens < t) at `temperature`, aligned to tokens (position 0 gets 0),
  normalised over ids < `valid_vocab_size` (0 = all rows; see `UpdateSettings`).

  With `logits_chunk` > 0 the head runs on that many positions at a time, each chunk under
  `jax.checkpoint`: neither pass holds float32 logits [B, T, V] (at a 150k vocabulary and 64k
  tokens that is 37 GiB per row), only [B, logits_chunk, V], at the price of a second head
  projection in the backward pass.
  """
  B, T = tokens_BxT.shape
  if not logits_chunk or logits_chunk >= T - 1:
    logits_BxTxV = models.forward(model_config, params, tokens_BxT)[0]
    logp_BxTm1 = entropy.token_logprobs(logits_BxTxV[:, :-1], tokens_BxT[:, 1:], temperature,
                                        valid_vocab_size)
    return jnp.pad(logp_BxTm1, ((0, 0), (1, 0)))
  hidden_BxTxE = models.forward(model_config, params, tokens_BxT, output='hidden')[0]
  n = -(-(T - 1) // logits_chunk)
  pad = n * logits_chunk - (T - 1)
  hidden_BxSxE = jnp.pad(hidden_BxTxE[:, :-1], ((0, 0), (0, pad), (0, 0)))
  targets_BxS = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, pad)))
  hidden_NxBxCxE = hidden_BxSxE.reshape(B, n, logits_chunk, -1).swapaxes(0, 1)
  targets_NxBxC = targets_BxS.reshape(B, n, logits_chunk).swapaxes(0, 1)

  @jax.checkpoint
  def chunk_logprobs(args):
    hidden_BxCxE, targets_BxC = args
    logits_BxCxV = models.head_logits(model_config, params, hidden_BxCxE)
    return entropy.token_logprobs(logits_BxCxV, targets_BxC, temperature, valid_vocab_size)

  logp_NxBxC = jax.lax.map(chunk_logprobs, (hidden_NxBxCxE, targets_NxBxC))
  logp_BxTm1 = logp_NxBxC.swapaxes(0, 1).reshape(B, n * logits_chunk)[:, :T - 1]
  return jnp.pad(logp_BxTm1, ((0, 0), (1, 0)))


def window_logprobs(model_config, params, tokens_BxT, start_B, width: int, temperature,
                    valid_vocab_size: int = 0, first_mix=None):
  """log pi(token t | tokens < t) for t in [start_B[b], start_B[b] + width) of each row: [B, width].

  Only those positions are projected onto the vocabulary, so a reply of a few tokens after a long
  context costs the head `width` positions instead of T (at a 150k vocabulary and a 50k-token
  critic prompt, the head over every position is about a tenth of the whole forward). Positions
  past the row's end repeat its last token; the caller's mask drops them.

  `first_mix` = (tokens_B, weights_B): the first position's entry becomes
  (1 - w) log pi(its token) + w log pi(tokens_B[b]), a two-token soft target's log-likelihood.
  """
  hidden_BxTxE = models.forward(model_config, params, tokens_BxT, output='hidden')[0]
  return hidden_window_logprobs(model_config, params, hidden_BxTxE, tokens_BxT, start_B, width,
                                temperature, valid_vocab_size, first_mix)


def hidden_window_logprobs(model_config, params, hidden_BxTxE, tokens_BxT, start_B, width: int,
                           temperature, valid_vocab_size: int = 0, first_mix=None):
  """`window_logprobs` from the model's final hidden states (one forward serves several windows)."""
  T = tokens_BxT.shape[1]
  targets_BxW = jnp.clip(start_B[:, None] + jnp.arange(width)[None, :], 1, T - 1)
  hidden_BxWxE = jnp.take_along_axis(hidden_BxTxE, (targets_BxW - 1)[..., None], axis=1)
  logits_BxWxV = models.head_logits(model_config, params, hidden_BxWxE)
  logp_BxW = entropy.token_logprobs(logits_BxWxV,
                                    jnp.take_along_axis(tokens_BxT, targets_BxW, axis=1),
                                    temperature, valid_vocab_size)
  if first_mix is None:
    return logp_BxW
  tokens_B, weights_B = first_mix
  other_B = entropy.token_logprobs(logits_BxWxV[:, :1], tokens_B[:, None], temperature,
                                   valid_vocab_size)[:, 0]
  w_B = weights_B.astype(logp_BxW.dtype)
  return logp_BxW.at[:, 0].set((1.0 - w_B) * logp_BxW[:, 0] + w_B * other_B)


def target_window(target_mask_BxT, width: int):
  """(start_B, mask_BxW): where each row's targets begin (its first masked position; 0 for a row
  with none) and its mask over the `width` positions from there. The targets must be contiguous
  and at most `width` long (`rows.critic_records_batch` checks this on the host)."""
  T = target_mask_BxT.shape[1]
  start_B = jnp.argmax(target_mask_BxT > 0, axis=1).astype(jnp.int32)
  index_BxW = start_B[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
  mask_BxW = jnp.take_along_axis(target_mask_BxT, jnp.minimum(index_BxW, T - 1), axis=1)
  return start_B, jnp.where(index_BxW < T, mask_BxW, 0.0)


def accumulate(loss_fn: Callable, params, batch, micro_batch: int):
  """Sums (loss_sum, count, metric sums) and gradients of loss_sum over micro-batches."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  B = jax.tree.leaves(batch)[0].shape[0]
  if not micro_batch or micro_batch >= B:
    (loss_sum, (count, sums)), grads = grad_fn(params, batch)
    return loss_sum, count, sums, grads
  if B % micro_batch:
    raise ValueError(f'batch of {B} rows is not a multiple of micro_batch={micro_batch}')
  micro = jax.tree.map(lambda x: x.reshape(B // micro_batch, micro_batch, *x.shape[1:]), batch)
  shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro))
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def body(carry, mb):
    return jax.tree.map(jnp.add, carry, grad_fn(params, mb)), None

  ((loss_sum, (count, sums)), grads), _ = jax.lax.scan(body, zeros, micro)
  return loss_sum, count, sums, grads


def token_mean(loss_sum, count, grads):
  """Divides by the count; gradients keep their parameters' dtype (bf16 Adam moments stay bf16,
  so the update never recompiles and a resumed run restores exactly what it saved)."""
  denom = jnp.maximum(count, 1.0)
  return loss_sum / denom, jax.tree.map(lambda g: (g / denom).astype(g.dtype), grads)


def apply_update(optimizer, params, opt_state, grads, loss, scale=None):
  """One optimiser step, or none when anything is non-finite. Returns (params, opt_state, metrics)."""
  updates, new_opt_state = optimizer.update(grads, opt_state, params)
  if scale is not None:
    updates = jax.tree.map(lambda u: -scale * u, updates)
  new_params = optax.apply_updates(params, updates)
  finite = jnp.isfinite(loss) & jnp.all(jnp.array(
      [jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  new_params = keep(new_params, params)
  new_opt_state = keep(new_opt_state, opt_state)
  delta_norm = optax.global_norm(jax.tree.map(jnp.subtract, new_params, params))
  metrics = {'grad_norm': optax.global_norm(grads), 'update_norm': delta_norm,
             'skipped': 1.0 - finite.astype(jnp.float32)}
  return new_params, new_opt_state, metrics


def actor_update(settings: UpdateSettings, state: state_lib.TrainState, batch: ActorBatch,
                 eps_high: jax.Array):
  """One PPO minibatch update (token-mean loss over the minibatch's generated tokens)."""

  def loss_fn(params, mb: ActorBatch):
    logp = sequence_logprobs(settings.model, params, mb.tokens_BxT, settings.temperature,
                             settings.logits_chunk, settings.valid_vocab_size)
    if settings.policy_loss == 'dis':
      loss_sum, count, sums = policy_loss.dis_loss(
          logp, mb.old_logprobs_BxT, mb.advantages_BxT, mb.loss_mask_BxT,
          ratio_low=settings.dis_low, ratio_high=settings.dis_high)
    else:
      loss_sum, count, sums = policy_loss.ppo_loss(
          logp, mb.old_logprobs_BxT, mb.advantages_BxT, mb.loss_mask_BxT,
          eps_low=settings.eps_low, eps_high=eps_high, dual_clip=settings.dual_clip)
    return loss_sum, (count, sums)

  loss_sum, count, sums, grads = accumulate(loss_fn, state.params, batch, settings.micro_batch)
  loss, grads = token_mean(loss_sum, count, grads)
  optimizer = state_lib.actor_optimizer(settings.optim)
  params, opt_state, metrics = apply_update(optimizer, state.params, state.actor_opt_state, grads,
                                            loss)
  metrics = {'loss': loss, 'tokens': count, **policy_loss.finalize_metrics(sums, count), **metrics}
  applied = (1.0 - metrics['skipped']).astype(state.step.dtype)
  new_state = state.replace(params=params, actor_opt_state=opt_state, step=state.step + applied)
  return new_state, metrics


def critic_grads(settings: UpdateSettings, state: state_lib.TrainState, batch: CriticBatch):
  """(loss_sum, records, gradients of loss_sum) of the value-token NLL (w/4 per record) on `batch`,
  with respect to what the critic trains (`critic_adapter.trained_field`: the shared weights, or
  the adapter): summed over several batches, then `critic_apply`ed once, they make one update."""
  field = critic_adapter.trained_field(state)

  def loss_fn(trained, mb: CriticBatch):
    params = (trained if field == 'params' else critic_adapter.merge(state.params, trained))
    # The critic reads its value greedily from the sampler's support (`rows.critic_reads`), so
    # it learns the value tokens' likelihood over that support too.
    hidden_BxTxE = models.forward(settings.model, params, mb.tokens_BxT, output='hidden')[0]
    window = functools.partial(hidden_window_logprobs, settings.model, params, hidden_BxTxE,
                               mb.tokens_BxT, temperature=1.0,
                               valid_vocab_size=settings.valid_vocab_size)
    start_B, mask_BxW = target_window(mb.target_mask_BxT, critic_loss.MAX_VALUE_TOKENS)
    mix = None if mb.upper_token_B is None else (mb.upper_token_B, mb.upper_weight_B)
    logp_BxW = window(start_B, critic_loss.MAX_VALUE_TOKENS, first_mix=mix)
    loss_sum, count = critic_loss.value_nll_loss(logp_BxW, mask_BxW, mb.weights_B)
    if mb.rationale_mask_BxT is None:
      return loss_sum, (count, {})
    start_B, mask_BxR = target_window(mb.rationale_mask_BxT, mb.rationale_width)
    rationale_sum = critic_loss.rationale_nll_loss(window(start_B, mb.rationale_width), mask_BxR,
                                                   mb.weights_B)
    return loss_sum + rationale_sum, (count, {})

  loss_sum, count, _, grads = accumulate(loss_fn, getattr(state, field), batch,
                                         settings.micro_batch)
  return loss_sum, count, grads


def critic_apply(settings: UpdateSettings, state: state_lib.TrainState, loss_sum, count, grads,
                 lr: jax.Array):
  """The critic optimiser step on summed `critic_grads` (mean over records) at learning rate lr."""
  loss, grads = token_mean(loss_sum, count, grads)
  optimizer = state_lib.critic_optimizer(settings.optim)
  field = critic_adapter.trained_field(state)
  trained, opt_state, metrics = apply_update(optimizer, getattr(state, field),
                                             state.critic_opt_state, grads, loss, scale=lr)
  metrics = {'loss': loss, 'records': count, **metrics}
  return state.replace(**{field: trained, 'critic_opt_state': opt_state}), metrics


def critic_update(settings: UpdateSettings, state: state_lib.TrainState, batch: CriticBatch,
                  lr: jax.Array):
  """One critic update on one batch: `critic_grads`, then `critic_apply`."""
  return critic_apply(settings, state, *critic_grads(settings, state, batch), lr)
