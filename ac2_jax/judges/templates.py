"""The proof judge's prompts: a training template and a validation template.

As in the AC2 paper (Section 4), the training judge sees only the problem and the candidate proof;
the validation judge also sees the reference solution and the problem's grading guidelines. Both
ask for the verdict as `<points>N out of 7</points>`, the first form `grading.parse_points` reads.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Mode = Literal['training', 'validation']
MODES = ('training', 'validation')


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
  """One proof to grade.

  `proof` is the text of the response's answer block, or None when the response has none: such a
  request scores 0 without any call to the judge.
  """

  problem: str
  proof: str | None
  reference_solution: str = ''
  grading_guidelines: str = ''


SYSTEM_PROMPT = (
    'You are an expert grader of mathematical olympiad proofs. You grade strictly and fairly on '
    'the standard 0 to 7 scale.')

_SCALE = """\
Scale:
- 7: a complete, rigorous and correct proof.
- 5 or 6: a correct proof with minor gaps or small errors that are easily fixed.
- 1 to 4: real progress (key lemmas, a correct reduction, a substantial special case) but no \
complete proof.
- 0: no meaningful progress, an incorrect argument, or only a restatement of the problem.
Claims stated without justification earn no credit. A final answer without proof earns at most 1."""

_VERDICT = """\
First explain your assessment briefly, pointing to the first serious error if there is one. \
Then end your reply with your verdict on its own line, exactly in this form:
<points>N out of 7</points>
where N is an integer from 0 to 7."""

_TRAINING = """\
Grade the following proof of the problem below.

<problem>
{problem}
</problem>

<proof>
{proof}
</proof>

{scale}

{verdict}"""

_VALIDATION = """\
Grade the following proof of the problem below. A reference solution and grading guidelines are \
given to help you; a correct proof may follow a different route from the reference.

<problem>
{problem}
</problem>

<reference_solution>
{reference_solution}
</reference_solution>

<grading_guidelines>
{grading_guidelines}
</grading_guidelines>

<proof>
{proof}
</proof>

{scale}
Follow the grading guidelines where they apply.

{verdict}"""


def training_prompt(problem: str, proof: str) -> str:
  """The user message for the training judge: problem and proof only."""
  return _TRAINING.format(problem=problem.strip(), proof=proof.strip(), scale=_SCALE,
                          verdict=_VERDICT)


def validation_prompt(problem: str, proof: str, reference_solution: str,
                      grading_guidelines: str) -> str:
  """The user message for the validation judge: adds the reference and the guidelines."""
  if not reference_solution.strip():
    raise ValueError('the validation template needs a reference solution; got an empty one')
  if not grading_guidelines.strip():
    raise ValueError('the validation template needs grading guidelines; got empty ones')
  return _VALIDATION.format(problem=problem.strip(), proof=proof.strip(),
                            reference_solution=reference_solution.strip(),
                            grading_guidelines=grading_guidelines.strip(), scale=_SCALE,
                            verdict=_VERDICT)


def build_messages(request: JudgeRequest, mode: Mode) -> list[dict[str, str]]:
  """OpenAI-style chat messages for one request (which must have a proof)."""
  if request.proof is None:
    raise ValueError('a request without a proof is scored 0 locally; it has no judge prompt')
  if mode == 'training':
    user = training_prompt(request.problem, request.proof)
  elif mode == 'validation':
    user = validation_prompt(request.problem, request.proof, request.reference_solution,
                             request.grading_guidelines)
  else:
    raise ValueError(f'unknown judge mode {mode!r}; choose one of {MODES}')
  return [{'role': 'system', 'content': SYSTEM_PROMPT}, {'role': 'user', 'content': user}]
