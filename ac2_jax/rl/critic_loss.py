"""Critic losses: AC2's value-token NLL, clipped value MSE, Li2SAO's ranking hinge, PACT's soft BCE.

Like the policy losses, each returns (loss_sum, count) so accumulation over micro-batches is exact
and the caller divides once: loss = total loss_sum / total count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ac2_jax.critic.values import MAX_VALUE_TOKENS


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def value_nll_loss(target_logprobs_BxT, target_mask_BxT, weights_B, *,
                   max_tokens: int = MAX_VALUE_TOKENS):
  """AC2's critic loss: per record w * NLL(value tokens + <|im_end|>) / 4; count = records.

  A record is one (prefix, prompt) row: a pair with a reference is two records at w = 1/2 (with and
  without the reference), a pair without one is one record at w = 1. `target_logprobs_BxT` are the
  model's log-probs of the target tokens at the positions that predict them; `target_mask_BxT` marks
  those tokens. Rows with no target token (padding) are not records.
  """
  logp, m, w = _f32(target_logprobs_BxT), _f32(target_mask_BxT), _f32(weights_B)
  if logp.shape != m.shape or logp.ndim != 2 or w.shape != logp.shape[:1]:
    raise ValueError(f'value_nll_loss: shapes {logp.shape}, {m.shape}, {w.shape} are not '
                     '[B, T], [B, T], [B]')
  nll_B = -jnp.where(m > 0, logp, 0.0).sum(-1)
  is_record_B = m.sum(-1) > 0
  loss_sum = jnp.where(is_record_B, w * nll_B / max_tokens, 0.0).sum()
  return loss_sum, is_record_B.astype(jnp.float32).sum()



def rationale_nll_loss(logprobs_BxR, mask_BxR, weights_B):
  """A critic rationale's loss (`critic.prompt.with_rationale`): per record w * the mean NLL of its
  rationale tokens, so a record's rationale weighs as much as its value however many lines it
  judges (rows without one add 0). Summed like `value_nll_loss`, over the same records."""
  logp, m, w = _f32(logprobs_BxR), _f32(mask_BxR), _f32(weights_B)
  n_B = m.sum(-1)
  nll_B = -jnp.where(m > 0, logp, 0.0).sum(-1) / jnp.maximum(n_B, 1.0)
  return jnp.where(n_B > 0, w * nll_B, 0.0).sum()

def clipped_value_loss(values_BxT, old_values_BxT, returns_BxT, mask_BxT, *, clip: float = 0.2):
  """max((V - G)^2, (V_clipped - G)^2) on masked tokens; V_clipped = V_old + clip(V - V_old, +-c).

  Also Li2SAO's residual loss when `returns_BxT` are the group-residual targets and `mask_BxT` the
  divergence mask. Returns (loss_sum, token_count).
  """
  v, v_old, g, m = _f32(values_BxT), _f32(old_values_BxT), _f32(returns_BxT), _f32(mask_BxT)
  v_old = jax.lax.stop_gradient(v_old)
  v_clipped = v_old + jnp.clip(v - v_old, -clip, clip)
  loss = jnp.maximum((v - g) ** 2, (v_clipped - g) ** 2)
  return jnp.where(m > 0, loss, 0.0).sum(), m.sum()


def ranking_hinge_loss(terminal_values_NxG, pairs_NxGxG, *, margin: float = 0.1):
  """Li2SAO's terminal ranking loss: sum over pairs (i+, i-) of [margin - V(i+) + V(i-)]_+.

  `pairs_NxGxG[n, i, j]` is True when response i outranks response j in group n (see
  li2sao.ranking_pairs), or a float weight of that pair (0: no pair); values are read at each
  response's last action token. Returns (weighted loss_sum, summed pair weights).
  """
  v = _f32(terminal_values_NxG)
  pairs = _f32(pairs_NxGxG)
  if pairs.shape != v.shape + v.shape[-1:]:
    raise ValueError(f'pairs_NxGxG shape {pairs.shape} does not match values {v.shape}')
  hinge = jax.nn.relu(margin - v[:, :, None] + v[:, None, :])
  return jnp.where(pairs > 0, hinge * pairs, 0.0).sum(), pairs.sum()


def soft_bce_loss(logits_BxT, targets_BxT, mask_BxT):
  """Binary cross-entropy of sigmoid(z) against soft targets y: softplus(z) - y z (stable form).

  PACT's targets y = rho R may exceed 1; the formula (gradient sigmoid(z) - y) is used as is.
  Returns (loss_sum, token_count).
  """
  z, y, m = _f32(logits_BxT), _f32(targets_BxT), _f32(mask_BxT)
  loss = jax.nn.softplus(z) - y * z
  return jnp.where(m > 0, loss, 0.0).sum(), m.sum()
