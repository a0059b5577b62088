"""The proof task: olympiad problems, answered by a `<proof>...</proof>` block, graded by a judge.

Training problems come from FineProofs-RL and validation problems from IMO-ProofBench (read by
`proofs_tfds`). A response is complete when a non-empty proof block follows its thinking section
(AC2 item 3). Scoring sends the proof to the training judge (problem + proof) or, for validation
problems, to the validation judge (adds the reference solution and grading guidelines); a
response without a proof scores 0 without a judge call, and no failure escapes as an exception.

Given a tokenizer, the task also checks every prompt against the context limit
(`max_prompt_tokens`, counted in the tokenizer's tokens of the whole rendered prompt: template and
chat markup included, exactly what the model is fed): a longer prompt is skipped and counted
(`num_long_prompts`) where its split skips malformed rows, else it is a `MalformedRowError` naming
its file and row.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Mapping, Protocol, Sequence

from ac2_jax import tokenization
from ac2_jax.critic import prompt as critic_prompt
from ac2_jax.judges import grading
from ac2_jax.judges.templates import JudgeRequest
from ac2_jax.tasks import base
from ac2_jax.tasks import proofs_tfds

logger = logging.getLogger(__name__)

PROOF_OPEN = '<proof>'
PROOF_CLOSE = '</proof>'
PROBLEM_SLOT = '{problem}'
# The longest prompt accepted, in tokens of the rendered prompt. Olympiad statements run to a few
# hundred tokens; the limit leaves the context to the response budget and the critic prompt.
DEFAULT_MAX_PROMPT_TOKENS = 4096
DEFAULT_PROMPT_TEMPLATE = (
    PROBLEM_SLOT + '\n\nWrite a complete and rigorous proof. When you have finished thinking, give '
    'your final proof between ' + PROOF_OPEN + ' and ' + PROOF_CLOSE + '.')


class ProofJudge(Protocol):
  """What the task needs of a judge (`judges.http.HttpJudge` is one)."""

  def grade_batch(self, requests: Sequence[JudgeRequest]) -> list[grading.Grade]: ...


def extract_proof(response_text: str) -> str | None:
  """The first proof block after the thinking section, stripped; None if absent or empty."""
  block = base.answer_block(response_text, PROOF_OPEN, PROOF_CLOSE)
  if block is None or not block.strip():
    return None
  return block.strip()


def _normalise(problem: str) -> str:
  return ' '.join(problem.split()).casefold()


class ProofTask:
  """The `base.Task` for proofs."""

  def __init__(self, train_rows: Sequence[proofs_tfds.ProofRow],
               validation_rows: Sequence[proofs_tfds.ProofRow], *,
               train_judge: ProofJudge | None,
               validation_judge: ProofJudge | None = None,
               prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
               critic_instructions: critic_prompt.CriticInstructions = (
                   critic_prompt.PROOF_INSTRUCTIONS),
               name: str = 'proofs',
               tokenizer: tokenization.Tokenizer | None = None,
               max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
               skip_long_prompts: Mapping[str, bool] | None = None):
    """`tokenizer` (None: no check) and `max_prompt_tokens` (0: no limit) set the prompt-length
    check; `skip_long_prompts[split]` says whether a long prompt is skipped (else fatal)."""
    if prompt_template.count(PROBLEM_SLOT) != 1:
      raise ValueError(f'prompt_template must contain {PROBLEM_SLOT!r} exactly once')
    if max_prompt_tokens < 0:
      raise ValueError(f'max_prompt_tokens must be >= 0 (0 = no limit), got {max_prompt_tokens}')
    self._name = name
    self._template = prompt_template
    self._critic_instructions = critic_instructions
    self._judges: dict[str, ProofJudge | None] = {'train': train_judge,
                                                  'validation': validation_judge}
    # Validation problems must never be trained on: drop training copies of them.
    held_out = {_normalise(r.problem) for r in validation_rows}
    kept = [r for r in train_rows if _normalise(r.problem) not in held_out]
    self.num_dropped_overlaps = len(train_rows) - len(kept)
    if self.num_dropped_overlaps:
      logger.warning('dropped %d training problems that are also validation problems',
                     self.num_dropped_overlaps)
    self._rows: dict[str, proofs_tfds.ProofRow] = {}
    self._records: dict[str, tuple[base.ProblemRecord, ...]] = {}
    self.num_long_prompts = {'train': 0, 'validation': 0}
    check = tokenizer is not None and max_prompt_tokens > 0
    for split, rows in (('train', kept), ('validation', validation_rows)):
      records = []
      for r in rows:
        if r.id in self._rows:
          raise ValueError(f'problem id {r.id!r} occurs in both splits or twice in one '
                           f'({r.file}: row {r.row})')
        record = base.ProblemRecord(
            id=r.id, split=split, prompt=self._template.replace(PROBLEM_SLOT, r.problem.strip()),
            reference_solution=r.reference_solution, guidelines=r.guidelines)
        if check and (n := len(self.prompt_ids(tokenizer, record))) > max_prompt_tokens:
          error = proofs_tfds.MalformedRowError(
              r.file, r.row, f'prompt is {n:,} tokens long, more than max_prompt_tokens='
              f'{max_prompt_tokens:,} (the context limit; {split} split)')
          if not (skip_long_prompts or {}).get(split, False):
            raise error
          logger.warning('skipping a long prompt: %s', error)
          self.num_long_prompts[split] += 1
          continue
        self._rows[r.id] = r
        records.append(record)
      self._records[split] = tuple(records)
    for split, n in self.num_long_prompts.items():
      if n:
        logger.warning('skipped %d %s prompts longer than max_prompt_tokens=%d', n, split,
                       max_prompt_tokens)

  @property
  def name(self) -> str:
    return self._name

  def records(self, split: str) -> Sequence[base.ProblemRecord]:
    return self._records[base.check_split(split)]

  def prompt_ids(self, tok: tokenization.Tokenizer, record: base.ProblemRecord) -> list[int]:
    return base.render_prompt(tok, record.prompt)

  def has_complete_answer(self, response_text: str) -> bool:
    return extract_proof(response_text) is not None

  def reference_from_response(self, response_text: str) -> str | None:
    return extract_proof(response_text)

  critic_sees_response = False

  def critic_instruction(self, reference: str | None, response: str = '') -> str:
    return self._critic_instructions.render(reference)

  def score_batch(self, records: Sequence[base.ProblemRecord], responses: Sequence[str]
                  ) -> list[grading.Grade]:
    """One grade per pair; judge failures are invalid grades, never exceptions.

    Only a length mismatch between `records` and `responses` (a caller bug) raises.
    """
    if len(records) != len(responses):
      raise ValueError(f'score_batch got {len(records)} records but {len(responses)} responses')
    grades: list[grading.Grade | None] = [None] * len(records)
    pending: dict[str, list[tuple[int, JudgeRequest]]] = {'train': [], 'validation': []}
    for i, (record, response) in enumerate(zip(records, responses)):
      row = self._rows.get(record.id)
      if row is None:
        grades[i] = grading.invalid_grade(grading.STATUS_INTERNAL_ERROR,
                                          f'unknown problem id {record.id!r}')
        continue
      proof = extract_proof(response) if isinstance(response, str) else None
      if proof is None:
        grades[i] = grading.no_answer_grade()
        continue
      pending[record.split].append((i, JudgeRequest(
          problem=row.problem, proof=proof, reference_solution=row.reference_solution,
          grading_guidelines=row.guidelines)))
    for split, items in pending.items():
      if not items:
        continue
      for (i, _), grade in zip(items, self._judge(split, [req for _, req in items])):
        grades[i] = grade
    return grades  # type: ignore[return-value]

  def _judge(self, split: str, requests: list[JudgeRequest]) -> list[grading.Grade]:
    judge = self._judges[split]
    if judge is None:
      return [grading.invalid_grade(grading.STATUS_INTERNAL_ERROR,
                                    f'no judge configured for the {split} split')] * len(requests)
    try:
      grades = list(judge.grade_batch(requests))
    except Exception as e:  # a judge that breaks its no-raise promise must not stop training
      logger.warning('%s judge raised %s', split, type(e).__name__)
      return [grading.invalid_grade(grading.STATUS_INTERNAL_ERROR,
                                    f'judge raised {type(e).__name__}')] * len(requests)
    if len(grades) != len(requests):
      return [grading.invalid_grade(
          grading.STATUS_INTERNAL_ERROR,
          f'judge returned {len(grades)} grades for {len(requests)} requests')] * len(requests)
    return grades


@dataclasses.dataclass(frozen=True)
class ProofDataSettings:
  """Where the proof data sets' files are, and how to read them."""

  train_manual_dir: str
  validation_manual_dir: str
  data_dir: str  # where the prepared array_record copies go
  train: proofs_tfds.ProofSourceSettings = proofs_tfds.FINEPROOFS_RL
  validation: proofs_tfds.ProofSourceSettings = proofs_tfds.IMO_PROOFBENCH
  # Context limit for a prompt, in tokens of the rendered prompt (0 = none); a longer one is a
  # malformed row of its split (skipped and counted under that split's skip_malformed).
  max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS


def load_rows(settings: ProofDataSettings
              ) -> Mapping[str, list[proofs_tfds.ProofRow]]:
  """Prepares (or reuses) both data sets and reads their rows: {'train': ..., 'validation': ...}."""
  data_dir = pathlib.Path(settings.data_dir)
  train = proofs_tfds.prepare('fineproofs_rl', settings.train_manual_dir, data_dir,
                              settings.train)
  validation = proofs_tfds.prepare('imo_proofbench', settings.validation_manual_dir, data_dir,
                                   settings.validation)
  for label, builder in (('FineProofs-RL', train), ('IMO-ProofBench', validation)):
    skipped = proofs_tfds.num_skipped_rows(builder)
    if skipped:
      logger.warning('%s: %d malformed rows were skipped when it was prepared', label, skipped)
  return {'train': proofs_tfds.read_rows(train), 'validation': proofs_tfds.read_rows(validation)}


def make_proof_task(settings: ProofDataSettings, *, train_judge: ProofJudge | None,
                    validation_judge: ProofJudge | None = None,
                    tokenizer: tokenization.Tokenizer | None = None) -> ProofTask:
  """The proof task from the settings' files; with `tokenizer`, prompts are length-checked."""
  rows = load_rows(settings)
  return ProofTask(rows['train'], rows['validation'], train_judge=train_judge,
                   validation_judge=validation_judge, tokenizer=tokenizer,
                   max_prompt_tokens=settings.max_prompt_tokens,
                   skip_long_prompts={'train': settings.train.skip_malformed,
                                      'validation': settings.validation.skip_malformed})
