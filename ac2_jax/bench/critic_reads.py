"""What the read layout saves (`python launch/bench.py critic_reads`).

A step's critic reads (`critic.readout` 'expectation': one forward per critic prompt) are prompts
whose lengths vary by a third: the reference or none, a replayed prefix of 0 to 4 chunks, the
chunk. This benchmark reads `reads` such prompts of the built-in task's corpus (prefixes of its
worked solutions, as `bench.py critic_update` cuts them, each once with and once without the
reference) through `sampling.token_distribution` in two layouts, side by side in one process:
the layout before (the reads in the given order, 128 rows a call, rows and length on the
sampler's half-octave ladder) and the one the trainer uses (longest first, `rows` a call, each
call padded to a multiple of 8 rows and `train_bucket` of its longest). It prints each layout's
call shapes and padded tokens, the median seconds per read of all prompts (after one warm-up
round each, which compiles), the ratio, and the largest difference of the read probabilities.

  python launch/bench.py critic_reads --config=configs/ac2.py:bench --workdir=DIR \
      --set=model.init_checkpoint=DIR/sft [--reads=140] [--rows=16] [--repeats=5]
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from ac2_jax import critic, sampling
from ac2_jax.bench import critic as probe
from ac2_jax.bench import critic_update
from ac2_jax.sampling import critic_reads, requests


@dataclasses.dataclass(frozen=True)
class ReadsBenchSettings:
  reads: int = 140                # one AC2 step at 16 replay groups, most of them ready (measured)
  rows: int = sampling.READ_ROWS  # rows per call of the sorted layout (a CPU's default)
  repeats: int = 5
  mistake_rate: float = 0.3
  max_cut_fraction: float = 0.8
  seed: int = 0

  def __post_init__(self):
    if self.reads < 2 or self.rows < 1 or self.repeats < 1:
      raise ValueError('need reads >= 2, rows >= 1 and repeats >= 1')


def layouts(settings: ReadsBenchSettings) -> dict[str, dict]:
  return {'given order, 128 rows': {'max_batch': 128, 'length_sorted': False},
          f'sorted, {settings.rows} rows': {'max_batch': settings.rows, 'length_sorted': True}}


def call_shapes(rt, contexts: Sequence[np.ndarray], max_batch: int, length_sorted: bool
                ) -> list[tuple[int, int]]:
  """(rows, length) of each device call `token_distribution` makes in this layout."""
  return [requests.pack([contexts[i] for i in rows], 1, None,
                        vocab_size=rt.model_config.vocab_size,
                        max_total_len=rt.model_config.max_position_embeddings + 1,
                        fine=length_sorted).contexts_BxP.shape
          for rows in critic_reads.read_calls(contexts, max_batch, length_sorted)]


def run(rt, params, settings: ReadsBenchSettings) -> dict:
  update_settings = critic_update.UpdateBenchSettings(
      pairs=-(-settings.reads // 2), mistake_rate=settings.mistake_rate,
      max_cut_fraction=settings.max_cut_fraction, seed=settings.seed)
  contexts = critic_update.corpus_records(rt, update_settings)[0][:settings.reads]
  lengths = sorted(len(c) for c in contexts)
  print(f'{len(contexts)} critic prompts: length min {lengths[0]}, median '
        f'{lengths[len(lengths) // 2]}, max {lengths[-1]}; {sum(lengths)} tokens')
  grid_ids = [critic.value_target_ids(rt.tokenizer, v)[0] for v in critic.GRID]
  kinds = layouts(settings)
  seconds = {name: [] for name in kinds}
  probs = {}
  for name, kw in kinds.items():
    shapes = call_shapes(rt, contexts, **kw)
    padded = sum(b * t for b, t in shapes)
    print(f'  {name:22s} {" + ".join(f"{b}x{t}" for b, t in shapes):34s} {padded:7d} padded '
          f'tokens ({sum(lengths) / padded:.2f} used)')
  for repeat in range(settings.repeats + 1):
    for name, kw in kinds.items():  # interleaved, so both layouts see the same machine
      start = time.perf_counter()
      probs[name] = sampling.token_distribution(rt.model_config, params, contexts, grid_ids,
                                                valid_vocab_size=rt.valid_vocab_size, **kw)
      if repeat:  # the first round compiles
        seconds[name].append(time.perf_counter() - start)
  median = {name: float(np.median(v)) for name, v in seconds.items()}
  before, now = kinds
  ratio = median[now] / median[before]
  gap = float(np.max(np.abs(probs[now] - probs[before])))
  print(f'critic reads: {before} {median[before]:.3f} s, {now} {median[now]:.3f} s (median of '
        f'{settings.repeats}): ratio {ratio:.2f}; largest probability difference {gap:.1e}')
  return {'seconds': median, 'ratio': ratio, 'max_abs_difference': gap}


def main(argv: Sequence[str]) -> None:
  _, _, settings, rt, state = probe.build_from_args(
      'bench.py critic_reads', __doc__, ReadsBenchSettings, 'model.init_checkpoint=DIR/sft', argv)
  run(rt, state.params, settings)
