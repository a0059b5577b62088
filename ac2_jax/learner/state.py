"""Train state: one parameter set with two optimizer states (actor and critic share the weights).

AC2's critic is the policy itself asked through a prompt, so actor and critic updates move the same
parameters; each keeps its own Adam moments.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimSettings:
  """Static optimiser hyperparameters (hashable: part of the jitted update's static arguments)."""

  actor_lr: float = 2e-6
  actor_weight_decay: float = 0.01
  actor_grad_clip: float = 0.3
  actor_b1: float = 0.9
  actor_b2: float = 0.999
  critic_grad_clip: float = 0.2
  critic_b1: float = 0.9
  critic_b2: float = 0.999
  critic_eps: float = 1e-8


def actor_optimizer(s: OptimSettings) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(s.actor_grad_clip),
                     optax.adamw(s.actor_lr, b1=s.actor_b1, b2=s.actor_b2,
                                 weight_decay=s.actor_weight_decay))


def critic_optimizer(s: OptimSettings) -> optax.GradientTransformation:
  """Adam direction only: the critic learning rate is a traced argument of the update, because the
  host-side controller halves it during the run without recompiling."""
  return optax.chain(optax.clip_by_global_norm(s.critic_grad_clip),
                     optax.scale_by_adam(b1=s.critic_b1, b2=s.critic_b2, eps=s.critic_eps))


@flax.struct.dataclass
class TrainState:
  params: dict
  actor_opt_state: optax.OptState
  critic_opt_state: optax.OptState
  step: jax.Array  # actor updates applied (a skipped, non-finite one does not count)


def init_state(params, settings: OptimSettings) -> TrainState:
  return TrainState(params=params,
                    actor_opt_state=actor_optimizer(settings).init(params),
                    critic_opt_state=critic_optimizer(settings).init(params),
                    step=jnp.zeros((), jnp.int32))
