"""Where a chain policy goes wrong (`python launch/bench.py chain_errors --checkpoint=RUN`).

Samples responses of a run's checkpoint (its workdir: the latest; WORKDIR/checkpoints/<step>; or,
with --warm_start, the checkpoint the run started from) to validation problems of the built-in
chain, at the run's evaluation sampling, and prints:

- the mean score and the histogram of each response's first wrong line (line K: none wrong);
- what the first wrong line got wrong: its result (the input and step were right), its step (an
  operator or operand other than the problem's: the solver lost its place in the prompt), its
  input (a previous value other than the one written before it), or its form (no line);
- of the lines reached with the right input and step, the share with the right result: how well
  the policy knows its arithmetic, apart from finding its way through the chain.

Session 23 found with it that the 4-layer `tiny` policy on 24 unlabelled steps writes the wrong
step from line 9 on, whatever RL does (BENCHMARKS.md, "Session 23").
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
from typing import Iterable, Sequence

import numpy as np

from ac2_jax.tasks import builtin

KINDS = ('result', 'step', 'input', 'form')


@dataclasses.dataclass(frozen=True)
class LineErrors:
  first_wrong: int         # index of the first line that is not the true step i (K: none)
  kind: str | None         # what it got wrong (KINDS), None when every line is right
  results_right: int       # lines reached with the right input and step, and right results
  results_tried: int       # lines reached with the right input and step


def line_errors(problem: builtin.ChainProblem, response: str) -> LineErrors:
  """The first wrong line of `response` (as 'leading' credit reads it) and why it is wrong."""
  truth = [problem.start, *problem.values()]
  lines = builtin.thinking_lines(response)
  right = tried = 0
  for i, step in enumerate(problem.step_strings()):
    m = builtin.LINE_RE.fullmatch(lines[i]) if i < len(lines) else None
    if m is None:
      return LineErrors(i, 'form', right, tried)
    if f'{m.group(2)}{int(m.group(3))}' != step:
      return LineErrors(i, 'step', right, tried)
    if int(m.group(1)) != truth[i]:
      return LineErrors(i, 'input', right, tried)
    tried += 1
    if int(m.group(4)) != truth[i + 1]:
      return LineErrors(i, 'result', right, tried)
    right += 1
  return LineErrors(problem.steps, None, right, tried)


def summarize(errors: Sequence[LineErrors], steps: int) -> dict:
  """Histogram of first wrong lines (index `steps`: none wrong), kinds, result accuracy."""
  kinds = collections.Counter(e.kind for e in errors if e.kind is not None)
  tried = sum(e.results_tried for e in errors)
  return {
      'responses': len(errors),
      'first_wrong_mean': float(np.mean([e.first_wrong for e in errors])),
      'first_wrong_hist': np.bincount([e.first_wrong for e in errors],
                                      minlength=steps + 1).tolist(),
      'kinds': {k: kinds[k] for k in KINDS},
      'results_right': sum(e.results_right for e in errors) / tried if tried else float('nan'),
  }


def report(summary: dict, score: float) -> Iterable[str]:
  yield f'mean score {score:.3f} over {summary["responses"]} responses'
  yield (f'first wrong line: mean {summary["first_wrong_mean"]:.1f}; by line (last: none '
         f'wrong): {" ".join(map(str, summary["first_wrong_hist"]))}')
  yield 'what it got wrong: ' + ', '.join(f'{k} {n}' for k, n in summary['kinds'].items())
  yield (f'results right where input and step were: {summary["results_right"]:.3f}')


def main(argv: Sequence[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py chain_errors',
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--checkpoint', required=True, help='a run: its workdir (the latest '
                      'checkpoint) or WORKDIR/checkpoints/<step>')
  parser.add_argument('--warm_start', action='store_true',
                      help="the run's starting checkpoint instead of a saved step")
  parser.add_argument('--problems', type=int, default=96, help='validation problems')
  parser.add_argument('--responses', type=int, default=8, help='responses per problem')
  parser.add_argument('--seed', type=int, default=1)
  args = parser.parse_args(argv)
  if args.problems < 1 or args.responses < 1:
    raise SystemExit('bench.py chain_errors: --problems and --responses must be >= 1')
  import jax
  from ac2_jax.learner import rows as rows_lib
  from ac2_jax.train import checkpoint_eval, experiment
  from ac2_jax.train.evaluation import sample_scores
  try:
    source, config = checkpoint_eval.load_run(args.checkpoint)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f'bench.py chain_errors: --checkpoint: {e}') from None
  if config.task.name != 'builtin':
    raise SystemExit(f'bench.py chain_errors: the run is on task {config.task.name!r}, not the '
                     f'built-in chain')
  rt, _, state = experiment.build(config, source.workdir, log=lambda *a: None)
  step = 0
  if not args.warm_start:
    step, state, _ = checkpoint_eval.restore_run_state(source, config, state)
  scores_PxN, _, rows = sample_scores(
      rt, state.params, jax.random.key(args.seed), num_problems=args.problems,
      num_responses=args.responses,
      max_new_tokens=experiment.run_settings(config).eval_max_new_tokens)
  texts = rows_lib.response_texts(rt, rows)
  problems = [builtin.parse_problem(rt.val_records[p].prompt)
              for p in range(scores_PxN.shape[0]) for _ in range(args.responses)]
  errors = [line_errors(problem, text) for problem, text in zip(problems, texts)]
  print(f'{source.workdir}, ' + ('warm start' if args.warm_start else f'step {step}'))
  for line in report(summarize(errors, problems[0].steps), float(scores_PxN.mean())):
    print(line)
