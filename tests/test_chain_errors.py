"""bench.py chain_errors: the first wrong line of a chain response, and why, by hand."""

import math

from ac2_jax.bench import chain_errors
from ac2_jax.tasks import builtin

# Start 11, modulo 13: 11-5=6, 6+3=9, 9+2=11, 11*4=5, 5*12=8, 8+1=9, 9+12=8, 8-3=5.
PROBLEM = builtin.ChainProblem(start=11, ops='-++**++-', operands=(5, 3, 2, 4, 12, 1, 12, 3),
                               modulus=13)
RIGHT = builtin.response_text(PROBLEM, PROBLEM.values())


def test_each_kind_of_first_error():
  assert chain_errors.line_errors(PROBLEM, RIGHT) == chain_errors.LineErrors(8, None, 8, 8)
  # A wrong result at line 3 (11*4 written as 6): the input and step were right.
  assert chain_errors.line_errors(PROBLEM, RIGHT.replace('11*4=5', '11*4=6')) == \
      chain_errors.LineErrors(3, 'result', 3, 4)
  # A right sum of the wrong step (11*2 where the problem says *4): the solver lost its place.
  assert chain_errors.line_errors(PROBLEM, RIGHT.replace('11*4=5', '11*2=9')) == \
      chain_errors.LineErrors(3, 'step', 3, 3)
  # Line 1 starts from 7 where line 0 wrote 6 (and the true value is 6).
  assert chain_errors.line_errors(PROBLEM, RIGHT.replace('6+3=9', '7+3=10')).kind == 'input'
  assert chain_errors.line_errors(PROBLEM, '11-5=6\n6+3=9\nthe rest').kind == 'form'
  # Labels are read as the score reads them: not checked.
  labelled = builtin.ChainProblem(PROBLEM.start, PROBLEM.ops, PROBLEM.operands, PROBLEM.modulus,
                                  labels=True)
  text = builtin.response_text(labelled, labelled.values())
  assert chain_errors.line_errors(labelled, text.replace('c9+2', 'q9+2')).first_wrong == 8


def test_summary_and_report():
  errors = [chain_errors.line_errors(PROBLEM, t) for t in (
      RIGHT, RIGHT.replace('11*4=5', '11*4=6'), RIGHT.replace('11*4=5', '11*2=9'), '')]
  s = chain_errors.summarize(errors, PROBLEM.steps)
  assert s['first_wrong_hist'] == [1, 0, 0, 2, 0, 0, 0, 0, 1]
  assert s['first_wrong_mean'] == (8 + 3 + 3 + 0) / 4
  assert s['kinds'] == {'result': 1, 'step': 1, 'input': 0, 'form': 1}
  # Lines tried with the right input and step: 8 + 4 + 3 + 0, of which 8 + 3 + 3 right.
  assert math.isclose(s['results_right'], 14 / 15)
  lines = list(chain_errors.report(s, 0.5))
  assert lines[1].endswith('1 0 0 2 0 0 0 0 1') and 'step 1' in lines[2]
