"""What splitting a critic update by length saves (`python launch/bench.py critic_update`).

One AC2 critic update trains `pairs` prefix-target pairs, each twice when it has a reference (with
and without it, w = 1/2), so half of its records are a reference shorter than the other half.
This benchmark times that update on records of the built-in task's corpus (prefixes of its worked
solutions cut inside the first `max_cut_fraction` of the reply, as the controller cuts them), side
by side in one process: all records padded to one length bucket (`--length_groups=1`, the update
before) against the records sorted by length and split into `length_groups` batches, each padded
to its own bucket (`learner.rows.critic_records_batch`). It prints each layout's batch shapes, the
padded tokens and the median seconds per update (after one warm-up step each), and the ratio.

  python launch/bench.py critic_update --config=configs/ac2.py:walk --workdir=DIR \
      --set=model.init_checkpoint=DIR/sft [--pairs=32] [--repeats=3] [--length_groups=2]
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Sequence

import jax
import numpy as np

from ac2_jax.bench import critic as probe


@dataclasses.dataclass(frozen=True)
class UpdateBenchSettings:
  pairs: int = 32
  repeats: int = 3
  length_groups: int = 2
  mistake_rate: float = 0.3       # the corpus's share of off-plan moves (walk) or wrong steps
  max_cut_fraction: float = 0.8   # prefixes end inside this share of the reply
  seed: int = 0

  def __post_init__(self):
    if self.pairs < 1 or self.repeats < 1 or self.length_groups < 2:
      raise ValueError('need pairs >= 1, repeats >= 1 and length_groups >= 2')


def corpus_records(rt, settings: UpdateBenchSettings) -> tuple[list[np.ndarray], list]:
  """Critic contexts and records of `pairs` corpus prefixes, each with and without the reference."""
  from ac2_jax.tasks import builtin_sft
  corpus = builtin_sft.corpus_of(rt.task, step_mistake_rate=settings.mistake_rate)
  rng = np.random.default_rng(settings.seed)
  contexts, records = [], []
  while len(records) < 2 * settings.pairs:
    i = int(rng.integers(len(rt.train_records)))
    record = rt.train_records[i]
    problem = corpus.parse(record.prompt)
    reply = builtin_sft.reply_ids(rt.tokenizer, *corpus.texts(problem, corpus.sample(problem, rng)))
    prefix = reply[:int(rng.integers(int(settings.max_cut_fraction * len(reply)) + 1))]
    for reference in (record.reference_solution, None):
      context = rt.critic_context(rt.train_prompts[i], prefix, reference)
      if context is None:
        raise SystemExit('a critic prompt does not fit critic.max_context: raise it')
      contexts.append(context)
      records.append(types.SimpleNamespace(target=float(rng.integers(11)) / 10, weight=0.5))
  return contexts, records


def run(rt, state, settings: UpdateBenchSettings, records_batch) -> dict:
  contexts, records = corpus_records(rt, settings)
  lengths = sorted(len(c) for c in contexts)
  print(f'{len(records)} critic records ({settings.pairs} pairs): context length min '
        f'{lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]}')
  lr = rt.put_batch(np.float32(1e-6))  # small: the state is carried, the reads stay put
  layouts = {1: 'one bucket', settings.length_groups: f'{settings.length_groups} length groups'}
  seconds = {k: [] for k in layouts}
  for repeat in range(settings.repeats + 1):
    for groups in layouts:  # interleaved, so both layouts see the same machine
      batch = records_batch(rt, contexts, records, length_groups=groups)
      start = time.perf_counter()
      state, metrics = rt.critic_step(state, batch, lr)
      jax.block_until_ready(metrics)
      if repeat:  # the first round compiles
        seconds[groups].append(time.perf_counter() - start)
      else:
        shapes = ' + '.join(f'{b.tokens_BxT.shape[0]}x{b.tokens_BxT.shape[1]}' for b in batch)
        padded = sum(b.tokens_BxT.size for b in batch)
        print(f'  {layouts[groups]:16s} {shapes:18s} {padded:7d} padded tokens')
  median = {k: float(np.median(v)) for k, v in seconds.items()}
  ratio = median[settings.length_groups] / median[1]
  print(f'critic update: one bucket {median[1]:.3f} s, {layouts[settings.length_groups]} '
        f'{median[settings.length_groups]:.3f} s (median of {settings.repeats}): ratio {ratio:.2f}')
  return {'seconds': median, 'ratio': ratio}


def main(argv: Sequence[str]) -> None:
  from ac2_jax.learner import rows
  _, _, settings, rt, state = probe.build_from_args(
      'bench.py critic_update', __doc__, UpdateBenchSettings, 'model.init_checkpoint=DIR/sft', argv)
  run(rt, state, settings, rows.critic_records_batch)
