"""Update-step throughput: the actor and critic updates of the `tiny` and `small` presets at a
default run's batch shapes, against the machine's matmul peak, and what bounds them.

  python launch/bench.py train [--presets tiny,small] [--repeats 2] [--config configs/ac2.py]
      [--set KEY=VALUE ...]

Shapes are those of a default AC2 run (`--config`, with `--set` overrides) on the built-in task,
whose data and tokenizer are built in a temporary directory to measure them:
  actor   one of `actor.minibatches` minibatches of the trained rows (n_batch x group_size; the
          refills are not trained), each row as long as a prompt plus the whole response budget;
  critic  `critic_pairs_per_update` records at the longest critic context (prompt, a
          max_cut-token prefix, the instruction with a reference) plus the value tokens;
both padded as `learner.rows` pads them. The model is the preset at the built-in tokenizer's
vocabulary, as a run builds it; the update settings are the config's (`update_settings_of`).

Per update: the compile time (lower + compile), then `repeats` timed steps (median; the state is
donated and carried, as in a run); tokens/s counts rows x length, padding included; achieved
FLOP/s counts the matmuls of the forward and a backward of twice its cost
(`roofline.update_flops`), against a large matmul's rate measured in the same run. For the
actor, what bounds it:
  - the same update on 1 row of 16 tokens: the per-step cost that does not grow with the batch
    (dispatch, the optimiser's pass over every parameter and both Adam moments);
  - the forward alone (the loss's log-probs, no gradient): an update should cost about 3x it;
  - a matmul of the MLP's shape ([rows x length, hidden] @ [hidden, intermediate]): the rate
    this model's widths can reach;
  - XLA's own count of each compiled step (`cost_analysis`: FLOPs including elementwise work,
    bytes its operations read and write): the time it needs at least at each peak;
  - one actor step traced (`op_profile`), its time split by the part of the model or update each
    operation came from, forward and backward.
Run time: about 6 minutes on 2 CPU cores shared with other jobs (the small actor step takes
about 40 s there).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow_datasets as tfds

from ac2_jax import critic, models, sampling
from ac2_jax.bench import op_profile, roofline, stopwatch
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.train import cli, experiment


@dataclasses.dataclass(frozen=True)
class Shapes:
  vocab_size: int
  actor: tuple[int, int]        # (rows, length)
  critic: tuple[int, int]
  prompt_tokens: int


def default_shapes(c) -> Shapes:
  """The update batches of a run of config `c` on the built-in task (module docstring)."""
  c = c.copy_and_resolve_references()
  c.task.builtin_num_train, c.task.builtin_num_validation = 64, 8  # lengths only: few suffice
  tfds.disable_progress_bar()
  with tempfile.TemporaryDirectory() as tmp:
    task, tok = experiment.build_task(c, tmp, None)
  prompt = max(len(task.prompt_ids(tok, r)) for s in ('train', 'validation')
               for r in task.records(s))
  ctl = c.controller
  actor_rows = rows_lib.bucket_rows(-(-ctl.n_batch * ctl.group_size // c.actor.minibatches), 1)
  actor_len = sampling.train_bucket(prompt + ctl.response_budget)
  # The longest critic context: a prefix cut at max_cut tokens, valued with a reference.
  record = task.records('train')[0]
  reference = tok.encode(record.reference_solution)
  max_cut = int(ctl.max_cut_fraction * ctl.response_budget)
  prefix = (reference * (max_cut // len(reference) + 1))[:max_cut]
  context = critic.critic_context_ids(
      tok, task.prompt_ids(tok, record), prefix,
      instruction_text=task.critic_instruction(record.reference_solution, tok.decode(prefix)))
  critic_len = sampling.train_bucket(min(len(context), c.critic.max_context)
                                     + sampling.MAX_VALUE_TOKENS)
  critic_rows = rows_lib.bucket_rows(ctl.critic_pairs_per_update, 1)
  return Shapes(tok.vocab_size, (actor_rows, actor_len), (critic_rows, critic_len), prompt)


def actor_batch(rows: int, length: int, prompt: int, vocab: int) -> updates.ActorBatch:
  """Random tokens, the loss on every position after the prompt, advantages of +-1, and old
  log-probs of a uniform policy (a fresh model's is close, so few ratios are clipped)."""
  rng = np.random.RandomState(0)
  mask = np.zeros((rows, length), np.float32)
  mask[:, min(prompt, length - 1):] = 1.0
  return updates.ActorBatch(
      jnp.asarray(rng.randint(0, vocab, (rows, length)), jnp.int32), jnp.asarray(mask),
      jnp.full((rows, length), -np.log(vocab), jnp.float32),
      jnp.asarray(np.sign(rng.randn(rows, 1)) * mask, jnp.float32))


def critic_batch(rows: int, length: int, vocab: int) -> updates.CriticBatch:
  rng = np.random.RandomState(1)
  mask = np.zeros((rows, length), np.float32)
  mask[:, -sampling.MAX_VALUE_TOKENS:] = 1.0
  return updates.CriticBatch(jnp.asarray(rng.randint(0, vocab, (rows, length)), jnp.int32),
                             jnp.asarray(mask), jnp.ones((rows,), jnp.float32))


def time_update(fn, state, batch, scalar, repeats: int) -> dict:
  """Compile seconds and the timed steps of a jitted update (the state is donated and carried)."""
  start = time.perf_counter()
  compiled = jax.jit(fn, donate_argnums=0).lower(state, batch, scalar).compile()
  compile_s = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  box = [state]

  def step():
    box[0], metrics = compiled(box[0], batch, scalar)
    jax.block_until_ready(metrics)

  median, seconds = stopwatch.median_seconds(step, repeats)
  return {'compile': compile_s, 'median': median, 'seconds': seconds, 'state': box[0],
          'compiled': compiled, 'xla_flops': float(cost.get('flops', 0.0)),
          'xla_bytes': float(cost.get('bytes accessed', 0.0))}


UPDATE_GROUPS = ('matmuls', 'attention block', 'MLP elementwise', 'norms, residuals, embedding',
                 'loss', 'optimizer')


def update_group(op_name: str) -> str:
  """The part of an update a JAX operation belongs to (`op_profile` names)."""
  if 'Decoder' in op_name:
    if 'dot_general' in op_name and re.search(r'_proj/|lm_head/|embed_tokens/', op_name):
      return 'matmuls'
    if '/mlp/' in op_name:
      return 'MLP elementwise'
    if '/self_attn/' in op_name:
      return 'attention block'
    return 'norms, residuals, embedding'
  # The loss (log-softmax over the vocabulary, the PPO terms) is differentiated, the optimiser not.
  return 'loss' if 'jvp(' in op_name else 'optimizer'


def profile_update(compiled, state, batch, scalar):
  """(state, {(group, 'forward' | 'backward'): seconds}) of one traced step."""
  box = [state]

  def step():
    box[0], metrics = compiled(box[0], batch, scalar)
    return metrics

  seconds, _ = op_profile.traced_seconds(step, compiled.as_text())
  table = collections.Counter()
  for op, s in seconds.items():
    table[(update_group(op), 'backward' if 'transpose(' in op else 'forward')] += s
  return box[0], table


def time_forward(settings: updates.UpdateSettings, params, tokens_BxT, repeats: int) -> float:
  forward = jax.jit(functools.partial(updates.sequence_logprobs, settings.model,
                                      temperature=settings.temperature,
                                      logits_chunk=settings.logits_chunk))
  forward(params, tokens_BxT).block_until_ready()
  return stopwatch.median_seconds(lambda: forward(params, tokens_BxT).block_until_ready(),
                                  repeats)[0]


def time_mlp_matmul(config: models.ModelConfig, tokens: int, repeats: int) -> float:
  """FLOP/s of one [tokens, hidden] @ [hidden, intermediate] matmul, jitted."""
  x = jnp.ones((tokens, config.hidden_size), jnp.float32)
  w = jnp.ones((config.hidden_size, config.intermediate_size), jnp.float32)
  matmul = jax.jit(jnp.matmul)
  matmul(x, w).block_until_ready()
  seconds, _ = stopwatch.median_seconds(lambda: matmul(x, w).block_until_ready(), repeats)
  return 2 * tokens * config.hidden_size * config.intermediate_size / seconds


def _rate(flops: float, seconds: float, peak: float) -> str:
  return f'{flops / seconds / 1e9:7.2f} ({roofline.fraction(flops / seconds, peak)})'


def bench_preset(preset: str, c, shapes: Shapes, peaks: roofline.Peaks, repeats: int) -> None:
  config = models.get_config(preset, vocab_size=shapes.vocab_size)
  peak = peaks.matmul_flops_per_s
  settings = experiment.update_settings_of(c, config)
  state = state_lib.init_state(models.init_params(config, jax.random.key(0)), settings.optim)
  print(f'preset {preset}: {roofline.num_params(config) / 1e6:.2f}M parameters, vocabulary '
        f'{config.vocab_size}, {config.num_layers} layers, hidden {config.hidden_size}')
  print(f'  {"update":7s} {"rows x len":>10s} {"compile":>8s} {"step s (median)":>16s} '
        f'{"tokens/s":>9s} {"GFLOP/s (of peak)":>17s}   timed steps')
  batches = {'actor': actor_batch(*shapes.actor, shapes.prompt_tokens, config.vocab_size),
             'critic': critic_batch(*shapes.critic, config.vocab_size)}
  fns = {'actor': functools.partial(updates.actor_update, settings),
         'critic': functools.partial(updates.critic_update, settings)}
  steps = {}
  for name in ('actor', 'critic'):
    rows, length = getattr(shapes, name)
    run = time_update(fns[name], state, batches[name], jnp.float32(0.28), repeats)
    state = run.pop('state')
    if name == 'actor':
      state, profile = profile_update(run['compiled'], state, batches[name], jnp.float32(0.28))
    steps[name] = run
    flops = roofline.update_flops(config, rows, length)
    print(f'  {name:7s} {f"{rows} x {length}":>10s} {run["compile"]:7.1f}s '
          f'{run["median"]:16.3f} {rows * length / run["median"]:9.0f} '
          f'{_rate(flops, run["median"], peak)}   '
          + '/'.join(f'{s:.3f}' for s in run['seconds']))
  for name, run in steps.items():
    # XLA's own count of the compiled step: its FLOPs (elementwise included) and the bytes its
    # operations read and write (caches ignored): lower bounds on the time at the two peaks.
    print(f'  {name} as XLA counts it: {run["xla_flops"] / 1e9:.1f} GFLOP (>= '
          f'{run["xla_flops"] / peak:.2f} s at the matmul peak), {run["xla_bytes"] / 1e9:.1f} GB '
          f'accessed (>= {run["xla_bytes"] / peaks.copy_bytes_per_s:.2f} s at the copy peak); '
          f'measured {run["median"]:.2f} s')

  total = sum(profile.values())
  print(f'  actor step by source (one traced step: {total:.2f} s of XLA operations, op_profile):')
  print(f'    {"":28s} {"forward s":>9s} {"backward s":>10s} {"share":>6s}')
  for group in UPDATE_GROUPS:
    fwd, bwd = profile[(group, 'forward')], profile[(group, 'backward')]
    print(f'    {group:28s} {fwd:9.2f} {bwd:10.2f} {roofline.fraction(fwd + bwd, total)}')
  rows, length = shapes.actor
  small = time_update(fns['actor'], state, actor_batch(1, 16, 8, config.vocab_size),
                      jnp.float32(0.28), max(repeats, 5))
  forward = time_forward(settings, small.pop('state').params, batches['actor'].tokens_BxT,
                         repeats)
  mlp = time_mlp_matmul(config, rows * length, max(repeats, 3))
  actor = steps['actor']['median']
  print(f'  actor bounds:\n'
        f'    a 1 x 16 update (what does not grow with the batch: dispatch, the optimiser over '
        f'every parameter): {small["median"] * 1e3:.1f} ms = '
        f'{100 * small["median"] / actor:.1f}% of the step\n'
        f'    forward alone {forward:.3f} s: update / forward {actor / forward:.2f} (3 if the '
        f'backward ran at the forward\'s rate)\n'
        f'    MLP-shape matmul [{rows * length} x {config.hidden_size}] @ [{config.hidden_size} x '
        f'{config.intermediate_size}]: {mlp / 1e9:.1f} GFLOP/s = {roofline.fraction(mlp, peak)} '
        f'of the peak\n'
        f'    compile {steps["actor"]["compile"]:.1f} s = '
        f'{steps["actor"]["compile"] / actor:.1f} steps (once per run and shape)')


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py train', description=__doc__.split('\n')[0])
  parser.add_argument('--presets', default='tiny,small')
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--config', default='configs/ac2.py', help='config file[:arg]')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='config override, e.g. --set=actor.micro_batch=16')
  args = parser.parse_args(argv)
  c = cli.config_from_args(args.config, args.set)
  shapes = default_shapes(c)
  print(f'train: updates at the default AC2 run\'s batch shapes (built-in task, prompts of '
        f'{shapes.prompt_tokens} tokens): actor {shapes.actor[0]} x {shapes.actor[1]}, critic '
        f'{shapes.critic[0]} x {shapes.critic[1]}; float32; {os.cpu_count()} CPUs, load average '
        + ' '.join(f'{x:.1f}' for x in os.getloadavg()))
  peaks = roofline.measure_peaks()
  print(f'peaks (this process): {peaks.describe()}')
  for preset in [p for p in args.presets.split(',') if p]:
    bench_preset(preset, c, shapes, peaks, args.repeats)
  print('load average at the end ' + ' '.join(f'{x:.1f}' for x in os.getloadavg()))
