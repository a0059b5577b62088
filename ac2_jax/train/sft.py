"""Supervised warm start: next-token cross-entropy on the response tokens of (prompt, response) pairs.

A second stream of (critic context, value) pairs may teach the critic's answer format: once the
first `clean_steps` (or `critic_from`) steps are done, every `critic_every`-th step trains on a batch of those instead
(their contexts are longer, so they get their own batch shape).

The built-in tasks' warm start learns its arithmetic on clean solutions first, in a sudden
transition whose step moves with floating-point rounding (another CPU's vector width moves it by
tens to hundreds of steps). Ending the clean phase at a fixed step then leaves one machine's warm
start past the transition and another's still in it, and their start scores differ by 0.1 or more.
With `clean_loss_target` the clean phase runs on past `clean_steps` (on a clean stream of its own,
the learning rate held) until the mean clean loss of the last `CLEAN_WINDOW` steps reaches the
target, so every machine starts the noisy phase with the arithmetic learned; where it already is
at `clean_steps`, nothing changes. Measured on the bench setting (BENCHMARKS.md, "Session 14"),
that lifts the warm start on both vector widths but does not close the gap between them, which
the short noisy phase makes; hence off by default.

`noisy_tail_steps` runs the noisy phase on after the schedule, on the same streams at the constant
`noisy_tail_learning_rate`: the cosine schedule's noisy phase is short and ends at a small rate, so
where a policy stops between the clean policy and the corpus moves with rounding; at a constant
rate it goes on toward the corpus's level. Measured on the bench setting (BENCHMARKS.md, "Session
15"): it narrows the gap between vector widths (0.08 at step mistakes 0.6 without it; 0.03-0.04 at
0.7 with it) but does not close it, because a policy whose clean phase ended before the transition
also learns the noisy corpus more slowly. Both stay off by default and on the bench: with them the
seeds' warm starts still differ in how sharp their arithmetic is, and with it how fast GRPO learns.

The result is written as a Hugging Face checkpoint directory, so an RL run loads a warm-started model
exactly as it loads a released one. A finished warm start is cached: the same settings in the same
directory return the saved checkpoint without training again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import collections
import os
import time
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ac2_jax import models

DONE_FILE = 'sft_done.json'
CLEAN_WINDOW = 20  # clean-phase steps whose mean loss is held against clean_loss_target


@dataclasses.dataclass(frozen=True)
class SFTSettings:
  steps: int = 600
  batch_size: int = 64
  seq_len: int = 128  # prompt + response, right-padded; longer examples are an error
  learning_rate: float = 3e-3
  warmup_steps: int = 50
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  mistake_rate: float = 0.0  # built-in task: share of worked solutions with one injected mistake
  step_mistake_rate: float = 0.25  # built-in task: each step independently wrong
  clean_steps: int = 0  # built-in task: the first steps train on correct solutions only
  # > 0: the clean phase goes on past clean_steps (at most to clean_steps_max) until its mean
  # loss over the last CLEAN_WINDOW steps is at most this (the module docstring says why).
  clean_loss_target: float = 0.0
  clean_steps_max: int = 0
  # Steps after the schedule's `steps`, at a constant rate (the module docstring says why).
  noisy_tail_steps: int = 0
  noisy_tail_learning_rate: float = 6e-4
  critic_every: int = 0  # after critic_start, every n-th step is a critic batch; 0 = never
  # The step after which critic batches start; < 0: after clean_steps. From 0, the critic's
  # examples share the steps where the policy learns its arithmetic (a lever for a critic that
  # has to grow a check of the lines while the representations still move).
  critic_from: int = -1
  critic_batch_size: int = 16
  critic_seq_len: int = 256
  # Built-in task: the critic examples are labelled with the values of a solver at this step
  # mistake rate; < 0: at step_mistake_rate (the corpus's own values).
  critic_value_mistake_rate: float = -1.0
  # Built-in tasks: the share of the walk's numbers where the corpus's solver does not know the
  # best move (walk.blind_numbers), or of the chain's facts x op a whose results it writes at
  # random (builtin.blind_facts): the warm start guesses there, and RL has to learn them.
  blind_fraction: float = 0.0
  seed: int = 0


def _loss(model_config, params, tokens_BxT, mask_BxT):
  logits = models.forward(model_config, params, tokens_BxT)[0][:, :-1]
  logp = jax.nn.log_softmax(logits)
  picked = jnp.take_along_axis(logp, tokens_BxT[:, 1:, None], axis=-1)[..., 0]
  m = mask_BxT[:, 1:]
  return -(picked * m).sum() / jnp.maximum(m.sum(), 1.0)


def make_batch(examples: Iterator[tuple[np.ndarray, np.ndarray]], batch_size: int, seq_len: int,
               name: str = 'seq_len') -> tuple[np.ndarray, np.ndarray]:
  """Right-padded tokens and a mask on the response tokens (the loss targets)."""
  tokens = np.zeros((batch_size, seq_len), np.int32)
  mask = np.zeros((batch_size, seq_len), np.float32)
  for b in range(batch_size):
    prompt, response = next(examples)
    n = len(prompt) + len(response)
    if n > seq_len:
      raise ValueError(f'SFT example of {n} tokens exceeds {name}={seq_len}')
    tokens[b, :n] = np.concatenate([prompt, response])
    mask[b, len(prompt):n] = 1.0
  return tokens, mask


_LATER_FIELDS = {'critic_value_mistake_rate': -1.0, 'blind_fraction': 0.0, 'critic_from': -1,
                 'clean_loss_target': 0.0, 'clean_steps_max': 0, 'noisy_tail_steps': 0,
                 'noisy_tail_learning_rate': 6e-4}


def critic_start(settings: SFTSettings) -> int:
  """The step after which critic batches start."""
  return settings.clean_steps if settings.critic_from < 0 else settings.critic_from


def is_critic_step(settings: SFTSettings, i: int) -> bool:
  """Whether step i (1-based) trains on a critic batch."""
  start = critic_start(settings)
  return bool(settings.critic_every) and i > start and (i - start) % settings.critic_every == 0


def settings_key(model_config, settings: SFTSettings, data_key: str) -> str:
  fields = dataclasses.asdict(settings)
  for name, default in _LATER_FIELDS.items():
    if fields[name] == default:
      # Left out at its default, so warm starts made before the field existed keep their key.
      del fields[name]
  blob = json.dumps([dataclasses.asdict(model_config), fields, data_key], sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def done_key(out_dir: str) -> str | None:
  """The settings key of the finished warm start in `out_dir` (None: none finished there)."""
  try:
    with open(os.path.join(out_dir, DONE_FILE)) as f:
      return json.load(f).get('key')
  except (OSError, ValueError, AttributeError):
    return None


def clean_extension_wanted(settings: SFTSettings, recent_losses, extra_steps: int) -> bool:
  """Whether the clean phase, at its end, takes one more step (see `clean_loss_target`)."""
  if settings.clean_loss_target <= 0:
    return False
  if settings.clean_steps + extra_steps >= settings.clean_steps_max:
    return False
  return float(np.mean(recent_losses)) > settings.clean_loss_target


def run_sft(model_config: models.ModelConfig, settings: SFTSettings,
            examples: Iterator[tuple[np.ndarray, np.ndarray]], out_dir: str, *, data_key: str = '',
            critic_examples: Iterator[tuple[np.ndarray, np.ndarray]] | None = None,
            clean_examples: Iterator[tuple[np.ndarray, np.ndarray]] | None = None,
            log=print) -> str:
  """Trains from random weights and saves to `out_dir` (HF format); returns `out_dir`.

  `critic_examples` feeds the critic batches when `settings.critic_every` asks for them;
  `clean_examples` the clean phase's extra steps when `settings.clean_loss_target` asks for them
  (`examples` stays where the clean phase left it, so its noisy part is the same either way).

  Reuses `out_dir` when it already holds a finished run with the same settings, and refuses
  (ValueError) to overwrite a finished run of other settings.
  """
  key = settings_key(model_config, settings, data_key)
  done_path = os.path.join(out_dir, DONE_FILE)
  if os.path.exists(done_path):
    found = done_key(out_dir)
    if found == key:
      log(f'SFT: reusing the warm start in {out_dir}')
      return out_dir
    raise ValueError(f'{out_dir} holds a finished SFT warm start of other settings (key {found}, '
                     f'these are {key}); not overwriting it: choose another directory')
  if settings.critic_every and critic_examples is None:
    raise ValueError('SFTSettings.critic_every > 0 needs critic_examples')
  if settings.clean_loss_target > 0:
    if clean_examples is None:
      raise ValueError('SFTSettings.clean_loss_target > 0 needs clean_examples')
    if not 0 < settings.clean_steps <= settings.clean_steps_max:
      raise ValueError('SFTSettings.clean_loss_target > 0 needs 0 < clean_steps <= '
                       f'clean_steps_max, got {settings.clean_steps} and '
                       f'{settings.clean_steps_max}')

  warmup = min(settings.warmup_steps, settings.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, settings.learning_rate, warmup,
                                                max(settings.steps, warmup + 1),
                                                settings.learning_rate * 0.05)
  # AdamW with the learning rate applied by hand: the clean phase's extra steps hold it where
  # the clean phase ended, which an optax schedule (counting every update) cannot.
  optimizer = optax.chain(optax.clip_by_global_norm(settings.grad_clip), optax.scale_by_adam(),
                          optax.add_decayed_weights(settings.weight_decay))
  params = models.init_params(model_config, jax.random.key(settings.seed))
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, tokens, mask, schedule_count):
    loss, grads = jax.value_and_grad(lambda p: _loss(model_config, p, tokens, mask))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    # As optax.scale_by_learning_rate computes it, so a run without extra steps is bit for bit
    # the warm start optax.adamw(schedule) made.
    rate = jnp.where(schedule_count < settings.steps, schedule(schedule_count),
                     settings.noisy_tail_learning_rate)
    step_size = -1 * rate
    updates = jax.tree.map(lambda u: jnp.array(step_size, dtype=u.dtype) * u, updates)
    return optax.apply_updates(params, updates), opt_state, loss

  start = time.time()
  losses = {'solutions': float('nan'), 'critic': float('nan')}
  recent_clean = collections.deque(maxlen=CLEAN_WINDOW)
  i, extra = 0, 0  # i: the schedule's step (extra clean steps do not advance it)
  total = settings.steps + settings.noisy_tail_steps
  while i < total:
    if i == settings.clean_steps and clean_extension_wanted(settings, recent_clean, extra):
      extra += 1
      kind, batch = 'solutions', make_batch(clean_examples, settings.batch_size, settings.seq_len)
    else:
      i += 1
      if i == settings.clean_steps + 1 and settings.clean_loss_target > 0:
        log(f'SFT: clean phase of {settings.clean_steps + extra} steps, mean loss of its last '
            f'{len(recent_clean)} {float(np.mean(recent_clean)):.4f} (target '
            f'{settings.clean_loss_target}'
            + ('' if np.mean(recent_clean) <= settings.clean_loss_target
               else f'; NOT reached by clean_steps_max={settings.clean_steps_max}') + ')')
      if is_critic_step(settings, i):
        kind, batch = 'critic', make_batch(critic_examples, settings.critic_batch_size,
                                           settings.critic_seq_len, 'critic_seq_len')
      else:
        kind, batch = 'solutions', make_batch(examples, settings.batch_size, settings.seq_len)
    # The schedule's count: i - 1 for the i-th scheduled step, held at the clean phase's last one.
    params, opt_state, loss = step(params, opt_state, *batch, np.int32(i - 1))
    losses[kind] = loss
    if kind == 'solutions' and settings.clean_loss_target > 0 and i <= settings.clean_steps:
      recent_clean.append(float(loss))
    done = i + extra
    if done % 50 == 0 or i == total:
      log(f'SFT step {i}/{total}' + (f' (+{extra} clean)' if extra else '')
          + f' loss {float(losses["solutions"]):.4f}'
          # The critic examples start after critic_start: no loss to print before.
          + (f' critic loss {float(losses["critic"]):.4f}' if settings.critic_every
             and i >= critic_start(settings) + settings.critic_every else '')
          + f' ({time.time() - start:.0f}s)')
  models.save_hf_checkpoint(model_config, params, out_dir)
  with open(done_path, 'w') as f:
    json.dump({'key': key, 'steps': total, 'clean_steps_added': extra,
               'final_loss': float(losses['solutions']), 'seconds': time.time() - start}, f)
  return out_dir
