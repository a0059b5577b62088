"""The critic probe: can the critic judge the policy's own prefixes? (`python launch/bench.py critic`)

From a run's warm start it builds prefixes of the policy's own rollouts with Monte Carlo labels
(g continuations of each prefix to the end, the grid-rounded mean score: exactly AC2's critic
target), holds out a share of the problems, and trains the critic alone through the real critic
prompt, loss and update. Every `eval_every` pairs it prints, on the held-out prefixes:

- MAE of the critic's reads against the labels, beside the best constant predictor's;
- the share of prefixes whose error is under tau_local, in all and by cut position;
- the correlation of the reads with the labels;
- the correlation of critic chunk advantages (v_i - mean_j v_j, each chunk the first b tokens of a
  continuation, routed as AC2 routes it) with the continuations' Monte Carlo advantages
  (R_i - mean_j R_j), the figure the AC2 paper reports as 0.388 for its audited groups;
- the same for a reference lookup: the prefix's lines compared with the true solution (how many
  are written, how many earn credit; in the walk, the number reached and the moves left), valued
  by the mean label of the training prefixes with the same key. That is the ceiling a critic that
  reads the lines should approach.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import sys
import time
from typing import Sequence

import jax
import numpy as np

from ac2_jax import critic as critic_lib
from ac2_jax.controller import sampling as ctl_sampling
from ac2_jax.tasks import builtin_sft

POSITIONS = ('early', 'middle', 'late')


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
  num_problems: int = 256        # training problems with one rollout each (their prefixes)
  held_out_problems: int = 64    # of those, problems whose prefixes are only evaluated
  group_size: int = 8            # continuations per prefix: the Monte Carlo label
  pairs: int = 2_000             # critic pair-updates (a record under both prompts is one pair)
  pairs_per_update: int = 32
  eval_every: int = 500          # pairs between evaluations
  # Training prefixes also evaluated (the fit): a critic that does not fit the prefixes it trains
  # on cannot learn them (capacity, rate, too few pairs); one that fits but fails on the held-out
  # ones memorises.
  fit_prefixes: int = 128
  learning_rate: float = 0.0     # 0: the run's initial critic learning rate
  # Critic warm-up on the SFT corpus first (exact expected values under the corpus's per-step
  # mistake rate, no rollouts needed): pairs and that mistake rate.
  corpus_pairs: int = 0
  corpus_mistake_rate: float = 0.3
  seed: int = 0


@dataclasses.dataclass
class ProbePrefix:
  """One labelled prefix and its continuations."""

  problem_index: int
  prefix_P: np.ndarray            # response tokens before the cut
  position: str                   # 'early' | 'middle' | 'late' in the reasoning
  label: float                    # grid-rounded mean reward of the continuations
  rewards_G: np.ndarray           # each continuation's reward
  chunk_ends: list                # per continuation: response tokens at the chunk's end
  chunk_scored: np.ndarray        # bool [G]: the chunk would go to the critic (else its reward)
  lines: tuple[int, int]          # the prefix's `builtin_sft.lookup_key`
  chunk_lines: list               # per continuation, the same key at the chunk's end


@dataclasses.dataclass(frozen=True)
class _Record:
  """What `critic_records_batch` reads from a critic-buffer record."""

  problem_id: str
  prefix_tokens_P: np.ndarray
  reference: str | None
  target: float
  weight: float
  value: float | None = None  # the unrounded label (two-hot targets spread it)


def position_of(cut: int, reasoning_len: int) -> str:
  frac = cut / max(reasoning_len, 1)
  return POSITIONS[min(int(frac * 3), 2)]


def build_prefixes(rt, params, controller_settings, settings: ProbeSettings, key: jax.Array,
                   generate_rows) -> list[ProbePrefix]:
  """Rollouts of `num_problems` training problems, every allowed cut of each, g continuations."""
  s = controller_settings
  tok = rt.tokenizer
  think_close = tok.token_id('</think>')
  rng = np.random.default_rng(settings.seed)
  if settings.num_problems > len(rt.train_records):
    raise ValueError(f'--num_problems={settings.num_problems} is more than the task\'s '
                     f'{len(rt.train_records)} training problems')
  problems = rng.choice(len(rt.train_records), settings.num_problems, replace=False)
  k1, k2 = jax.random.split(key)
  prompts = [rt.train_prompts[p] for p in problems]
  rows, _ = generate_rows(rt, params, prompts, [0] * len(prompts), problems,
                          [s.response_budget] * len(prompts), [s.response_budget] * len(prompts),
                          k1, rt.train_sampling)
  # Every cut the controller could draw, measured against the reasoning (tokens before </think>).
  cuts = []
  for p, row in zip(problems, rows):
    tokens = row.new_N[row.new_N != tok.eos_id]
    where = np.flatnonzero(tokens == think_close)
    reasoning = int(where[0]) if len(where) else len(tokens)
    for cut in ctl_sampling.cut_candidates(len(tokens), s.cut_grid, s.max_cut_fraction):
      cuts.append((int(p), tokens[:cut], position_of(int(cut), reasoning)))
  contexts, owners = [], []
  for j, (p, prefix, _) in enumerate(cuts):
    for _ in range(settings.group_size):
      contexts.append(np.concatenate([rt.train_prompts[p], prefix]).astype(np.int32))
      owners.append(j)
  budgets = [s.response_budget - len(cuts[j][1]) for j in owners]
  conts, _ = generate_rows(rt, params, contexts, [len(cuts[j][1]) for j in owners],
                           [cuts[j][0] for j in owners], budgets, budgets, k2, rt.train_sampling)
  texts = [tok.decode(np.concatenate([cuts[j][1], r.new_N]).tolist())
           for j, r in zip(owners, conts)]
  grades = rt.task.score_batch([rt.train_records[cuts[j][0]] for j in owners], texts)
  out = []
  for j, (p, prefix, position) in enumerate(cuts):
    members = [i for i, o in enumerate(owners) if o == j]
    rewards = np.array([grades[i].reward for i in members], np.float32)
    record = rt.train_records[p]
    ends, scored, chunk_lines = [], [], []
    for i in members:
      new = conts[i].new_N[:s.chunk_size]
      end = np.concatenate([prefix, new]).astype(np.int32)
      text = tok.decode(end.tolist())
      # Reached b new tokens with budget left: AC2 would have stopped it there.
      capped = len(conts[i].new_N) > s.chunk_size
      scored.append(capped and not rt.task.has_complete_answer(text))
      ends.append(end)
      chunk_lines.append(builtin_sft.lookup_key(rt.task, record, text))
    out.append(ProbePrefix(
        problem_index=p, prefix_P=np.asarray(prefix, np.int32), position=position,
        label=critic_lib.round_to_grid(float(rewards.mean())), rewards_G=rewards,
        chunk_ends=ends, chunk_scored=np.array(scored),
        lines=builtin_sft.lookup_key(rt.task, record, tok.decode(prefix.tolist())),
        chunk_lines=chunk_lines))
  return out


def split(prefixes: Sequence[ProbePrefix], held_out_problems: int, seed: int):
  """(train, held-out) by problem, so no held-out problem is ever trained on."""
  problems = sorted({p.problem_index for p in prefixes})
  rng = np.random.default_rng(seed + 1)
  count = min(held_out_problems, len(problems) - 1)
  held = set(rng.choice(problems, count, replace=False).tolist())
  return ([p for p in prefixes if p.problem_index not in held],
          [p for p in prefixes if p.problem_index in held])


class Lookup:
  """Values a prefix by the mean training label of prefixes with the same line counts."""

  def __init__(self, train: Sequence[ProbePrefix]):
    self.mean = float(np.mean([p.label for p in train]))
    sums: dict = {}
    for p in train:
      n, c = sums.get(p.lines, (0, 0.0))
      sums[p.lines] = (n + 1, c + p.label)
    self.table = {k: c / n for k, (n, c) in sums.items()}

  def __call__(self, lines: tuple[int, int]) -> float:
    return self.table.get(lines, self.mean)


def _corr(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if len(a) < 2 or a.std() == 0 or b.std() == 0:
    return 0.0
  return float(np.corrcoef(a, b)[0, 1])


def figures(values: Sequence[float | None], chunk_values: Sequence[np.ndarray],
            held: Sequence[ProbePrefix], constant: float, tau_local: float) -> dict:
  """The probe's figures for one predictor: its prefix values and its chunk-end values."""
  labels = np.array([p.label for p in held])
  v = np.array([1.0 if x is None else x for x in values])  # an unparseable read is error 1
  err = np.where([x is None for x in values], 1.0, np.abs(v - labels))
  out = {'mae': float(err.mean()), 'mae_constant': float(np.abs(labels - constant).mean()),
         'under_tau_local': float((err < tau_local).mean()),
         'under_tau_local_constant': float((np.abs(labels - constant) < tau_local).mean()),
         'corr': _corr(v, labels), 'invalid': int(sum(x is None for x in values))}
  for pos in POSITIONS:
    sel = np.array([p.position == pos for p in held])
    if sel.any():
      out[f'mae/{pos}'] = float(err[sel].mean())
      out[f'under_tau_local/{pos}'] = float((err[sel] < tau_local).mean())
  routed, only = ([], []), ([], [])
  for p, ends in zip(held, chunk_values):
    # Routed as AC2 routes: chunks that hit the cap with no answer take the predictor's value.
    e = np.where(p.chunk_scored, ends, p.rewards_G)
    valid = np.isfinite(e)
    e = np.where(valid, e, e[valid].mean() if valid.any() else 0.0)
    mc = p.rewards_G - p.rewards_G.mean()
    routed[0].extend(e - e.mean())
    routed[1].extend(mc)
    if p.chunk_scored.all():
      only[0].extend(e - e.mean())
      only[1].extend(mc)
  # The figure to compare with the paper's 0.388: groups whose every chunk the predictor valued.
  # With judged chunks mixed in, their true rewards alone lift the correlation of a constant.
  out['chunk_adv_corr'] = _corr(*only)
  out['chunk_adv_corr_routed'] = _corr(*routed)
  out['chunks_scored'] = float(np.mean(np.concatenate([p.chunk_scored for p in held])))
  return out


def records_for(rt, prefixes: Sequence[ProbePrefix], use_reference: bool = True) -> list[_Record]:
  """Critic records of labelled prefixes: with a reference under both prompts at w = 1/2."""
  out = []
  for p in prefixes:
    r = rt.train_records[p.problem_index]
    value = float(p.rewards_G.mean())
    if use_reference:
      out.append(_Record(r.id, p.prefix_P, r.reference_solution, p.label, 0.5, value))
      out.append(_Record(r.id, p.prefix_P, None, p.label, 0.5, value))
    else:
      out.append(_Record(r.id, p.prefix_P, None, p.label, 1.0, value))
  return out


def evaluate(rt, params, held: Sequence[ProbePrefix], read, lookup: Lookup, constant: float,
             tau_local: float, policy_params=None) -> tuple[dict, dict]:
  """(critic figures, lookup figures) on the held-out prefixes; reads use the reference (and a
  self-checking critic's check `policy_params`, the actor's weights)."""
  prompts, responses, refs, owner = [], [], [], []
  for j, p in enumerate(held):
    r = rt.train_records[p.problem_index]
    prompts.append(rt.train_prompts[p.problem_index])
    responses.append(p.prefix_P)
    refs.append(r.reference_solution)
    owner.append((j, -1))
    for g, end in enumerate(p.chunk_ends):
      if p.chunk_scored[g]:
        prompts.append(rt.train_prompts[p.problem_index])
        responses.append(end)
        refs.append(r.reference_solution)
        owner.append((j, g))
  values = read(rt, params, prompts, responses, refs, policy_params)
  prefix_values = [None] * len(held)
  chunk_values = [np.full(len(p.chunk_ends), np.nan) for p in held]
  for (j, g), v in zip(owner, values):
    if g < 0:
      prefix_values[j] = v
    else:
      chunk_values[j][g] = np.nan if v is None else v
  critic_fig = figures(prefix_values, chunk_values, held, constant, tau_local)
  lookup_fig = figures([lookup(p.lines) for p in held],
                       [np.array([lookup(c) for c in p.chunk_lines]) for p in held],
                       held, constant, tau_local)
  return critic_fig, lookup_fig


def _batch(rt, state, records_batch, records: Sequence[_Record], contexts=None):
  """A critic batch of records; `contexts` when their critic prompts are built already (each is
  self-checked by the policy of `state` when the run's critic is: `rollouts.self_checked`)."""
  if contexts is None:
    contexts = [rt.critic_context(rt.prompt_ids_by_id[r.problem_id], r.prefix_tokens_P,
                                  r.reference) for r in records]
  if rt.critic_marks:
    from ac2_jax.learner import rows as rollouts
    contexts = rollouts.self_checked(rt, state.params, contexts)
  keep = [i for i, c in enumerate(contexts) if c is not None]
  return records_batch(rt, [contexts[i] for i in keep], [records[i] for i in keep])


def _corpus_batch(rt, state, records_batch, corpus, n: int):
  """A critic batch of n (context ids, value target ids) pairs from the warm-up corpus."""
  contexts, records = [], []
  for _ in range(n):
    context, target = next(corpus)
    value = critic_lib.parse_value(rt.tokenizer.decode(target[:-1].tolist()))
    contexts.append(context)
    records.append(_Record('', context[:0], None, value, 1.0))
  return _batch(rt, state, records_batch, records, contexts)


def train_and_evaluate(rt, state, train: Sequence[ProbePrefix], held: Sequence[ProbePrefix],
                       settings: ProbeSettings, *, learning_rate: float, tau_local: float, read,
                       records_batch, log=print, corpus=None, on_report=None) -> list[dict]:
  """Trains the critic alone on `train` and evaluates on `held` every `eval_every` pairs.

  With `corpus` (an iterator of (context, target) ids), the first `corpus_pairs` pairs come from
  it instead. `on_report(curve)` runs after every evaluation (to save the curve as it grows).
  """
  lookup = Lookup(train)
  constant = lookup.mean
  records = records_for(rt, train)
  rng = np.random.default_rng(settings.seed + 2)
  fit_set = [train[i] for i in np.sort(rng.choice(len(train), min(settings.fit_prefixes,
                                                                   len(train)), replace=False))]
  curve, done, start = [], 0, time.time()

  def report():
    params = rt.critic_params(state)  # one merge per report when the critic has an adapter
    c, l = evaluate(rt, params, held, read, lookup, constant, tau_local, state.params)
    entry = {'pairs': done, 'seconds': round(time.time() - start, 1), 'critic': c, 'lookup': l}
    fit_log = ''
    if fit_set:
      fit, _ = evaluate(rt, params, fit_set, read, lookup, constant, tau_local, state.params)
      entry['fit'] = fit
      fit_log = (f'  fit: MAE {fit["mae"]:.3f} (constant {fit["mae_constant"]:.3f}) corr '
                 f'{fit["corr"]:+.3f}')
    curve.append(entry)
    if on_report is not None:
      on_report(curve)
    log(f'pairs {done:6d} ({entry["seconds"]:6.1f}s)  critic MAE {c["mae"]:.3f} '
        f'(constant {c["mae_constant"]:.3f}, lookup {l["mae"]:.3f})  '
        f'under tau_local {c["under_tau_local"]:.2f} (constant '
        f'{c["under_tau_local_constant"]:.2f}, lookup {l["under_tau_local"]:.2f})  '
        f'corr {c["corr"]:+.3f} (lookup {l["corr"]:+.3f})  chunk-adv corr '
        f'{c["chunk_adv_corr"]:+.3f} (lookup {l["chunk_adv_corr"]:+.3f})  invalid {c["invalid"]}'
        + fit_log)
    return entry

  report()
  lr = np.float32(learning_rate)
  total = settings.pairs + (settings.corpus_pairs if corpus is not None else 0)
  while done < total:
    if corpus is not None and done < settings.corpus_pairs:
      n = settings.pairs_per_update
      batch = _corpus_batch(rt, state, records_batch, corpus, n)
    else:
      take = rng.choice(len(records), min(settings.pairs_per_update, len(records)), replace=False)
      n = len(take)
      batch = _batch(rt, state, records_batch, [records[i] for i in take])
    state, _ = rt.critic_step(state, batch, lr)
    done += n
    if done // settings.eval_every != (done - n) // settings.eval_every:
      report()
  if curve[-1]['pairs'] != done:
    report()
  return curve


def argument_parser(prog: str, description: str, settings_cls, set_example: str
                    ) -> argparse.ArgumentParser:
  """The critic benchmarks' shared flags: config, workdir, overrides, settings fields, out."""
  parser = argparse.ArgumentParser(prog=prog, description=description)
  parser.add_argument('--config', default='configs/ac2.py', help='config file[:arg]')
  parser.add_argument('--workdir', required=True, help='run directory (its warm start is reused)')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help=f'config override, e.g. --set={set_example}')
  for f in dataclasses.fields(settings_cls):
    parser.add_argument(f'--{f.name}', type=type(f.default), default=f.default)
  parser.add_argument('--out', default='', help='JSON file for the learning curve')
  return parser


def parse_settings(prog: str, args: argparse.Namespace, settings_cls):
  """The settings dataclass from the parsed flags; a bad value ends with one line."""
  try:
    return settings_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(settings_cls)})
  except ValueError as e:
    raise SystemExit(f'{prog}: {e}') from None


def build_from_args(prog: str, doc: str, settings_cls, set_example: str, argv: Sequence[str]):
  """(args, config, settings, runtime, state) of a critic benchmark's command line (the shared flags
  of `argument_parser`; the run's warm start is reused from the workdir)."""
  args = argument_parser(prog, doc.split('\n')[0], settings_cls, set_example).parse_args(argv)
  from ac2_jax.train import cli, experiment
  config = cli.config_from_args(args.config, args.set)
  settings = parse_settings(prog, args, settings_cls)
  rt, _, state = experiment.build(config, args.workdir, log=lambda *a: None)
  return args, config, settings, rt, state


def curve_writer(args: argparse.Namespace, settings):
  """`on_report` that rewrites `args.out` (if given) with the curve so far."""
  def save(curve):
    if args.out:
      os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
      with open(args.out, 'w') as f:
        json.dump({'settings': dataclasses.asdict(settings), 'config': args.config,
                   'overrides': args.set, 'curve': curve}, f, indent=1)
  return save


def main(argv: Sequence[str]) -> None:
  prog = 'bench.py critic'
  parser = argument_parser(prog, __doc__.split('\n')[0], ProbeSettings,
                           'critic.readout=expectation')
  parser.add_argument('--prefixes', default='',
                      help='pickle of the labelled prefixes: read if it exists, else written '
                           '(one set serves every lever that leaves the policy and labels alone)')
  parser.add_argument('--checkpoint', default='',
                      help='probe the policy and critic of a run: its workdir (the latest '
                           'checkpoint) or WORKDIR/checkpoints/<step>; --config and --set as the '
                           'run had them')
  args = parser.parse_args(argv)
  from ac2_jax.learner import rows as rollouts
  from ac2_jax.train import checkpoint_eval, cli, experiment
  config = cli.config_from_args(args.config, args.set)
  settings = parse_settings(prog, args, ProbeSettings)
  rt, algorithm, state = experiment.build(config, args.workdir, log=lambda *a: None)
  if args.checkpoint:
    try:
      source = checkpoint_eval.resolve_run(args.checkpoint)
    except (FileNotFoundError, ValueError) as e:
      raise SystemExit(f'{prog}: --checkpoint: {e}') from None
    step, state, _ = checkpoint_eval.restore_run_state(source, config, state)
    print(f'probing {args.checkpoint} at step {step}')
  ctl_settings = experiment.controller_settings(config)
  t0 = time.time()
  if args.prefixes and os.path.isfile(args.prefixes):
    with open(args.prefixes, 'rb') as f:
      prefixes = pickle.load(f)
  else:
    prefixes = build_prefixes(rt, state.params, ctl_settings, settings,
                              jax.random.key(settings.seed), rollouts.generate_rows)
    if args.prefixes:
      with open(args.prefixes, 'wb') as f:
        pickle.dump(prefixes, f)
  train, held = split(prefixes, settings.held_out_problems, settings.seed)
  print(f'{len(prefixes)} prefixes ({len(train)} train, {len(held)} held out) of '
        f'{settings.num_problems} rollouts x g={settings.group_size} in {time.time() - t0:.0f}s; '
        f'equal-reward groups {np.mean([p.rewards_G.std() == 0 for p in prefixes]):.2f}')
  lr = settings.learning_rate or ctl_settings.critic_lr_init
  corpus = None
  if settings.corpus_pairs:
    from ac2_jax.tasks import builtin_sft
    corpus = builtin_sft.critic_examples(rt.task, rt.tokenizer,
                                         step_mistake_rate=settings.corpus_mistake_rate,
                                         seed=settings.seed + 3)
  train_and_evaluate(rt, state, train, held, settings, learning_rate=lr,
                     tau_local=ctl_settings.tau_local,
                     read=rollouts.critic_reader(config.critic.readout),
                     records_batch=rollouts.critic_records_batch, corpus=corpus,
                     on_report=curve_writer(args, settings))
  sys.stdout.flush()
