"""A separate value-head critic beside the policy: its settings, train state, reads and update.

PPO with GAE, PACT, LiSAO and Li2SAO value states with a second parameter tree, the
policy's architecture with a scalar head (`models/value.py`), trained by its own optimizer. The
state of such a run is an `ActorCriticState`: the policy's `TrainState` plus the critic's
parameters and optimizer state, so the actor update (which only `.replace`s the policy's fields),
the checkpoint, the partition rules and the dry run all take it as they take the policy's state.
AC2 and GRPO keep the plain `TrainState`, so their checkpoints do not change.

Values are aligned to tokens as `rl/gae.py` wants them: `values_BxT[b, t]` = V(s_t), the value of
the state before token t, read from the head at position t - 1 (position 0 gets 0).

Li2SAO adds a terminal ranking term to the clipped loss (`rank_coef` > 0): within each group of
the batch, every pair (i+, i-) with R_i+ > R_i- adds [margin - V(s_i+,T) + V(s_i-,T)]_+ at the
responses' last action tokens, and the loss is L_res + rank_coef x (mean over pairs). The pair
mean is made exact under the token mean and micro-batches by a per-row scale the host computes
(`ValueBatch.pair_scale_B`); a group must not straddle micro-batches.
"""

from __future__ import annotations

import dataclasses
import re

import flax.struct
import jax
import jax.numpy as jnp
import optax

from ac2_jax import sharding
from ac2_jax.models import value as value_model
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.rl import critic_loss

LOSSES = ('clipped_mse', 'soft_bce')
# With `freeze_attention` these stay fixed: the embedding and every attention sublayer with its
# input norm. The MLP blocks (with their input norms), the final norm and the head train (SAO).
FROZEN = re.compile(r'(^|/)(embed_tokens|self_attn|input_layernorm)(/|$)')


@dataclasses.dataclass(frozen=True)
class ValueSettings:
  """Static hyperparameters of the value critic (hashable: part of the jitted update)."""

  learning_rate: float = 5e-6
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  b1: float = 0.9
  b2: float = 0.999
  freeze_attention: bool = False
  # 'clipped_mse': a linear head, max((V - G)^2, (V_clipped - G)^2) (PPO);
  # 'soft_bce': a sigmoid head, BCE against soft targets (PACT).
  loss: str = 'clipped_mse'
  value_clip: float = 0.2
  head_std: float = 0.02
  # Li2SAO's terminal ranking loss: its coefficient alpha (0: no ranking term) and margin m.
  rank_coef: float = 0.0
  rank_margin: float = 0.1

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ValueError(f'loss must be one of {LOSSES}, got {self.loss!r}')
    if self.rank_coef < 0:
      raise ValueError(f'rank_coef must be >= 0, got {self.rank_coef!r}')
    if self.rank_coef > 0 and self.loss != 'clipped_mse':
      raise ValueError('the ranking term goes with the linear head (clipped_mse), got '
                       f'{self.loss!r}')
    for name in ('learning_rate', 'grad_clip', 'value_clip'):
      if not getattr(self, name) > 0:
        raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')


@flax.struct.dataclass
class ActorCriticState(state_lib.TrainState):
  value_params: dict
  value_opt_state: optax.OptState


@flax.struct.dataclass
class ValueBatch:
  """Right-padded sequences as in `updates.ActorBatch`; per-token arrays are aligned to tokens
  (entry t belongs to V(s_t)); `mask_BxT` marks the tokens in the loss.

  The ranking term's rows (None without it): `group_B` the row's group (-1: padding),
  `rewards_B` its outcome, `last_B` the position of its last action token, and `pair_scale_B`
  the weight of each pair the row wins: (masked tokens / pairs) of the whole minibatch, so that
  the token mean of the summed loss holds the pair mean of the hinges.
  """
  tokens_BxT: jax.Array
  mask_BxT: jax.Array
  targets_BxT: jax.Array
  old_values_BxT: jax.Array
  group_B: jax.Array | None = None
  rewards_B: jax.Array | None = None
  last_B: jax.Array | None = None
  pair_scale_B: jax.Array | None = None


def is_frozen(path) -> bool:
  return bool(FROZEN.search(sharding.path_str(path)))


def _labels(params):
  return jax.tree_util.tree_map_with_path(
      lambda path, _: 'frozen' if is_frozen(path) else 'train', params)


def value_optimizer(s: ValueSettings) -> optax.GradientTransformation:
  """Clip + AdamW on the trained parameters; frozen ones get a zero update and no Adam moments
  (their gradients are not part of the clipped norm)."""
  train = optax.chain(optax.clip_by_global_norm(s.grad_clip),
                      optax.adamw(s.learning_rate, b1=s.b1, b2=s.b2,
                                  weight_decay=s.weight_decay))
  if not s.freeze_attention:
    return train
  return optax.multi_transform({'train': train, 'frozen': optax.set_to_zero()}, _labels)


def init_state(params, value_params, optim: state_lib.OptimSettings,
               value: ValueSettings) -> ActorCriticState:
  """The policy's state with the value critic beside it. AC2's prompt critic (`critic_opt_state`)
  has no optimizer state here: its Adam moments would be two policy-sized trees never used."""
  return ActorCriticState(params=params,
                          actor_opt_state=state_lib.actor_optimizer(optim).init(params),
                          critic_opt_state=optax.EmptyState(),
                          step=jnp.zeros((), jnp.int32), value_params=value_params,
                          value_opt_state=value_optimizer(value).init(value_params))


def state_logits(model_config, value_params, tokens_BxT):
  """Head outputs aligned to tokens: entry t reads position t - 1 (the state before token t);
  `link` turns them into V(s_t)."""
  z_BxT = value_model.value_logits(model_config, value_params, tokens_BxT)
  return jnp.pad(z_BxT[:, :-1], ((0, 0), (1, 0)))


def link(value: ValueSettings, z_BxT):
  """The value a head output stands for: z itself (linear head) or sigmoid(z) (soft BCE)."""
  return jax.nn.sigmoid(z_BxT) if value.loss == 'soft_bce' else z_BxT


def ranking_terms(value: ValueSettings, values_BxT, mb: ValueBatch):
  """(scaled hinge sum, metric sums) of the ranking term over the pairs inside `mb`."""
  v_B = jnp.take_along_axis(values_BxT, mb.last_B[:, None], axis=1)[:, 0]
  same_BxB = (mb.group_B[:, None] == mb.group_B[None, :]) & (mb.group_B[:, None] >= 0)
  pairs_BxB = same_BxB & (mb.rewards_B[:, None] > mb.rewards_B[None, :])
  weights_BxB = jnp.where(pairs_BxB, mb.pair_scale_B[:, None], 0.0)
  rank_sum, _ = critic_loss.ranking_hinge_loss(v_B[None], weights_BxB[None],
                                               margin=value.rank_margin)
  hinge_sum, pairs = critic_loss.ranking_hinge_loss(jax.lax.stop_gradient(v_B)[None],
                                                    pairs_BxB[None], margin=value.rank_margin)
  return rank_sum, {'rank_hinge': hinge_sum, 'pairs': pairs}


def value_update(settings: updates.UpdateSettings, value: ValueSettings,
                 state: ActorCriticState, batch: ValueBatch):
  """One critic update (token mean over the masked tokens); the policy's fields are untouched."""

  def loss_fn(value_params, mb: ValueBatch):
    if value.freeze_attention:
      # No gradient is computed for the frozen parameters at all (their update is zero anyway).
      value_params = jax.tree_util.tree_map_with_path(
          lambda path, x: jax.lax.stop_gradient(x) if is_frozen(path) else x, value_params)
    z_BxT = state_logits(settings.model, value_params, mb.tokens_BxT)
    if value.loss == 'soft_bce':
      loss_sum, count = critic_loss.soft_bce_loss(z_BxT, mb.targets_BxT, mb.mask_BxT)
    else:
      loss_sum, count = critic_loss.clipped_value_loss(z_BxT, mb.old_values_BxT, mb.targets_BxT,
                                                       mb.mask_BxT, clip=value.value_clip)
    m = mb.mask_BxT > 0
    error = jnp.abs(jax.lax.stop_gradient(link(value, z_BxT)) - mb.targets_BxT)
    sums = {'abs_error': jnp.where(m, error, 0.0).sum()}
    if value.rank_coef > 0:
      rank_sum, rank_sums = ranking_terms(value, link(value, z_BxT), mb)
      sums.update(rank_sums, residual=jax.lax.stop_gradient(loss_sum))
      loss_sum = loss_sum + value.rank_coef * rank_sum
    return loss_sum, (count, sums)

  loss_sum, count, sums, grads = updates.accumulate(loss_fn, state.value_params, batch,
                                                    settings.micro_batch)
  loss, grads = updates.token_mean(loss_sum, count, grads)
  params, opt_state, metrics = updates.apply_update(value_optimizer(value), state.value_params,
                                                    state.value_opt_state, grads, loss)
  denom = jnp.maximum(count, 1.0)
  metrics = {'loss': loss, 'tokens': count, 'abs_error': sums['abs_error'] / denom, **metrics}
  if value.rank_coef > 0:
    metrics.update(residual_loss=sums['residual'] / denom, pairs=sums['pairs'],
                   rank_hinge=sums['rank_hinge'] / jnp.maximum(sums['pairs'], 1.0))
  return state.replace(value_params=params, value_opt_state=opt_state), metrics
