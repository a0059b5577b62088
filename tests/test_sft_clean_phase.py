"""The SFT's clean phase held to a loss target (sft.clean_loss_target) and its noisy tail at a
constant rate (sft.noisy_tail_steps), on real tiny warm starts."""

import dataclasses
import json
import os

import jax
import numpy as np
import optax
import pytest

from ac2_jax import models
from ac2_jax.tasks import builtin_sft
from ac2_jax.train import experiment
from ac2_jax.train import sft as sft_lib
from train_fixtures import SMALL, apply, load_config

BATCH, SEQ = 4, 112


@pytest.fixture(scope='module')
def task_and_model(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('clean_phase'))
  c = apply(load_config('ac2'), {**SMALL, 'task.data_dir': os.path.join(root, 'data')})
  task, tok = experiment.build_task(c, root, None)
  return task, tok, models.get_config('tiny', vocab_size=tok.vocab_size, num_layers=1)


class Counted:
  """An example stream that counts what it hands out."""

  def __init__(self, stream):
    self.stream, self.taken = stream, 0

  def __iter__(self):
    return self

  def __next__(self):
    self.taken += 1
    return next(self.stream)


def _streams(task, tok):
  noisy = Counted(builtin_sft.sft_examples(task, tok, mistake_rate=0.0, step_mistake_rate=0.5,
                                           seed=0, epochs=None, clean_first=2 * BATCH))
  clean = Counted(builtin_sft.sft_examples(task, tok, mistake_rate=0.0, seed=2, epochs=None))
  return noisy, clean


def _run(task_and_model, out_dir, **kw):
  task, tok, model = task_and_model
  settings = sft_lib.SFTSettings(steps=4, batch_size=BATCH, seq_len=SEQ, warmup_steps=1,
                                 clean_steps=2, **kw)
  noisy, clean = _streams(task, tok)
  sft_lib.run_sft(model, settings, noisy, str(out_dir), clean_examples=clean, log=lambda *_: None)
  with open(os.path.join(out_dir, sft_lib.DONE_FILE)) as f:
    done = json.load(f)
  return models.load_hf_checkpoint(str(out_dir))[1], done, noisy.taken, clean.taken


def test_a_reached_target_changes_nothing_and_a_missed_one_extends_on_the_clean_stream(
    task_and_model, tmp_path):
  base, done, noisy, clean = _run(task_and_model, tmp_path / 'off')
  assert done['clean_steps_added'] == 0 and (noisy, clean) == (4 * BATCH, 0)
  # Any loss is under 1e9: the clean phase ends at clean_steps, with the very same weights.
  same, done, noisy, clean = _run(task_and_model, tmp_path / 'met', clean_loss_target=1e9,
                                  clean_steps_max=10)
  assert done['clean_steps_added'] == 0 and (noisy, clean) == (4 * BATCH, 0)
  for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(same)):
    np.testing.assert_array_equal(a, b)
  # No loss is under 1e-9: the clean phase runs to clean_steps_max on the clean stream, and the
  # main stream still gives exactly the schedule's steps.
  longer, done, noisy, clean = _run(task_and_model, tmp_path / 'missed', clean_loss_target=1e-9,
                                    clean_steps_max=5)
  assert done['clean_steps_added'] == 3 and (noisy, clean) == (4 * BATCH, 3 * BATCH)
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(base),
                                                       jax.tree.leaves(longer)))


def test_the_noisy_tail_continues_the_main_stream_at_its_own_constant_rate(task_and_model,
                                                                         tmp_path):
  base, _, _, _ = _run(task_and_model, tmp_path / 'off')
  tailed, done, noisy, clean = _run(task_and_model, tmp_path / 'tail', noisy_tail_steps=2)
  assert done['steps'] == 6 and (noisy, clean) == (6 * BATCH, 0)
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(base),
                                                       jax.tree.leaves(tailed)))
  # At a vanishing tail rate the two extra steps move nothing: the tail's rate is its own, not
  # the schedule's (whose floor, 5% of the peak, would move every weight).
  still, _, noisy, _ = _run(task_and_model, tmp_path / 'still', noisy_tail_steps=2,
                            noisy_tail_learning_rate=1e-30)
  assert noisy == 6 * BATCH
  for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(still)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-20)
  # A warm start made before the tail existed keeps its cache key.
  task, tok, model = task_and_model
  plain = sft_lib.SFTSettings(steps=4)
  assert (sft_lib.settings_key(model, plain, 'd')
          != sft_lib.settings_key(model, sft_lib.SFTSettings(steps=4, noisy_tail_steps=2), 'd'))
  blob = dataclasses.asdict(plain)
  for name in ('noisy_tail_steps', 'noisy_tail_learning_rate'):
    assert blob.pop(name) == sft_lib._LATER_FIELDS[name]


def test_sft_optimizer_is_adamw_on_the_warmup_cosine_schedule(task_and_model, tmp_path):
  """The hand-applied learning rate is optax.adamw on the schedule, bit for bit (old warm starts
  stay what they were)."""
  task, tok, model = task_and_model
  params, _, _, _ = _run(task_and_model, tmp_path / 'run')
  settings = sft_lib.SFTSettings(steps=4, batch_size=BATCH, seq_len=SEQ, warmup_steps=1)
  schedule = optax.warmup_cosine_decay_schedule(0.0, settings.learning_rate, 1, 4,
                                                settings.learning_rate * 0.05)
  optimizer = optax.chain(optax.clip_by_global_norm(settings.grad_clip),
                          optax.adamw(schedule, weight_decay=settings.weight_decay))
  expected = models.init_params(model, jax.random.key(0))
  state = optimizer.init(expected)

  @jax.jit
  def step(params, state, tokens, mask):  # the SFT step as it was before the clean extension
    loss, grads = jax.value_and_grad(lambda p: sft_lib._loss(model, p, tokens, mask))(params)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  noisy, _ = _streams(task, tok)
  for _ in range(4):
    expected, state, _ = step(expected, state, *sft_lib.make_batch(noisy, BATCH, SEQ))
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_clean_extension_rule():
  s = sft_lib.SFTSettings(clean_steps=10, clean_loss_target=0.01, clean_steps_max=12)
  full_low = [0.005] * sft_lib.CLEAN_WINDOW
  full_high = [0.005] * (sft_lib.CLEAN_WINDOW - 1) + [1.0]
  assert not sft_lib.clean_extension_wanted(s, full_low, 0)
  assert sft_lib.clean_extension_wanted(s, full_high, 0)
  assert not sft_lib.clean_extension_wanted(s, full_high, 2)  # clean_steps_max reached
  off = sft_lib.SFTSettings(clean_steps=10)
  assert not sft_lib.clean_extension_wanted(off, full_high, 0)


def test_a_loss_target_needs_its_clean_stream_and_a_sane_cap(task_and_model, tmp_path):
  _, _, model = task_and_model
  with pytest.raises(ValueError, match='needs clean_examples'):
    sft_lib.run_sft(model, sft_lib.SFTSettings(steps=2, clean_steps=1, clean_loss_target=0.1,
                                               clean_steps_max=2), iter(()), str(tmp_path / 'a'))
  with pytest.raises(ValueError, match='clean_steps <= clean_steps_max'):
    sft_lib.run_sft(model, sft_lib.SFTSettings(steps=2, clean_steps=3, clean_loss_target=0.1,
                                               clean_steps_max=2), iter(()), str(tmp_path / 'b'),
                    clean_examples=iter(()))
