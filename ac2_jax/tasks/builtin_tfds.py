"""The built-in tasks as tensorflow-datasets data sets (array_record files, no TensorFlow), and
`build_builtin`, which builds (or reuses) a data set and its SentencePiece tokenizer.

Layout under `data_dir` (the walk's the same under `builtin_walk`):
  builtin_chain/<config>/1.0.0/...          the tfds data set, one config per `ChainSettings`
  builtin_chain_tokenizer/<config>_v<N>.model  the tokenizer trained on its corpus
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow_datasets as tfds

from ac2_jax import tokenization
from ac2_jax.tasks import base
from ac2_jax.tasks import builtin
from ac2_jax.tasks import builtin_sft
from ac2_jax.tasks import tfds_local
from ac2_jax.tasks import walk

_FILE_FORMAT = 'array_record'


@dataclasses.dataclass
class ChainConfig(tfds.core.BuilderConfig):
  """A tfds builder config carrying `ChainSettings` (the name encodes every field)."""

  settings: builtin.ChainSettings = builtin.ChainSettings()


def _op_names(ops: str) -> str:
  return ''.join({'+': 'a', '-': 's', '*': 'm'}[op] for op in ops)


def config_for(settings: builtin.ChainSettings) -> ChainConfig:
  s = settings
  name = (f'k{s.steps}_p{s.modulus}_n{s.num_train}_v{s.num_validation}_s{s.seed}'
          f'_e{s.validation_every}' + ('' if s.ops == builtin.OPS else f'_o{_op_names(s.ops)}')
          + ('_l' if s.labels else ''))
  return ChainConfig(name=name, settings=settings,
                     description=f'{s.steps} steps modulo {s.modulus}')


class _GeneratedProblems(tfds_local.LocalBuilder, skip_registration=True):
  """A built-in task's problems, generated from the builder config's settings: one row per
  problem with its prompt, reference solution and answer (subclasses say how)."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First version.'}
  DESCRIPTION = ''

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict({
            'index': np.int64,  # generation order within the split
            'id': tfds.features.Text(),
            'prompt': tfds.features.Text(),
            'reference_solution': tfds.features.Text(),
            'answer': np.int64,
        }),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # everything is generated
    problems = self._problems(self.builder_config.settings)
    return {split: self._generate_examples(problems[split]) for split in base.SPLITS}

  def _generate_examples(self, problems):
    for index, problem in enumerate(problems):
      yield problem.problem_id(), {
          'index': index,
          'id': problem.problem_id(),
          'prompt': problem.prompt(),
          'reference_solution': self._reference(problem),
          'answer': self._answer(problem),
      }


class BuiltinChain(_GeneratedProblems):
  """Chain-arithmetic problems (ac2_jax/tasks/builtin.py), generated from a seed."""

  BUILDER_CONFIGS = [config_for(builtin.ChainSettings())]
  DESCRIPTION = 'Chains of modular arithmetic with written-out intermediate results.'
  _problems = staticmethod(builtin.generate)
  _reference = staticmethod(builtin.reference_text)
  _answer = staticmethod(lambda problem: problem.answer)


def _text(value) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


@dataclasses.dataclass
class WalkConfig(tfds.core.BuilderConfig):
  """A tfds builder config carrying `WalkSettings` (the name encodes every field)."""

  settings: walk.WalkSettings = walk.WalkSettings()


def walk_config_for(settings: walk.WalkSettings) -> WalkConfig:
  s = settings
  moves = ''.join({'+': 'a', '*': 'm'}[op] + str(a) for op, a in s.menu)
  name = (f'g{s.goal}_{moves}_t{s.trap_digit if s.trap_digit >= 0 else "n"}_d{s.min_distance}'
          f'-{s.max_distance}_x{s.slack}_e{s.validation_every}')
  return WalkConfig(name=name, settings=settings, description=f'walks to {s.goal}')


class BuiltinWalk(_GeneratedProblems):
  """Walk problems (ac2_jax/tasks/walk.py): every (start, budget) pair of the settings."""

  BUILDER_CONFIGS = [walk_config_for(walk.WalkSettings())]
  DESCRIPTION = 'Walks to a goal number with a menu of moves and dead ends.'
  _problems = staticmethod(walk.generate)
  _reference = staticmethod(walk.reference_text)
  _answer = staticmethod(lambda problem: problem.goal)


def load_records(builder: _GeneratedProblems, split: str) -> list[base.ProblemRecord]:
  """The records of a prepared split, in generation order."""
  source = builder.as_data_source(split=base.check_split(split))
  rows = source.__getitems__(list(range(len(source))))
  rows = sorted(rows, key=lambda row: int(row['index']))
  return [base.ProblemRecord(id=_text(r['id']), split=split, prompt=_text(r['prompt']),
                             reference_solution=_text(r['reference_solution'])) for r in rows]


def build_builtin(data_dir: str,
                  settings: builtin.ChainSettings | walk.WalkSettings = builtin.ChainSettings(),
                  *, vocab_size: int = 512
                  ) -> tuple[builtin.BuiltinTask, tokenization.SentencePieceTokenizer]:
  """Builds (or reuses) the data set and its tokenizer in `data_dir`; returns (task, tokenizer).

  `settings` picks the task: `ChainSettings` the chain, `WalkSettings` the walk. The tokenizer has
  at most `vocab_size` pieces (a small corpus gives fewer); digits, the answer tags, `Q value:`
  and the value grid '0', '0.1', ..., '1' are single tokens.
  """
  is_walk = isinstance(settings, walk.WalkSettings)
  builder_class, config, task_class = ((BuiltinWalk, walk_config_for(settings), walk.WalkTask)
                                       if is_walk else
                                       (BuiltinChain, config_for(settings), builtin.BuiltinTask))
  # tfds accepts a registered config only by name, and any other config as an instance.
  registered = config.name in builder_class.builder_configs
  builder = builder_class(data_dir=data_dir, config=config.name if registered else config,
                          file_format=_FILE_FORMAT)
  builder.download_and_prepare(file_format=_FILE_FORMAT)
  task = task_class(settings, {s: load_records(builder, s) for s in base.SPLITS})
  prefix = os.path.join(data_dir, f'{builder.name}_tokenizer', f'{config.name}_v{vocab_size}')
  if os.path.isfile(prefix + '.model'):
    tok = tokenization.SentencePieceTokenizer.load(prefix + '.model')
  else:
    tok = tokenization.SentencePieceTokenizer.train(
        builtin_sft.tokenizer_corpus(task), prefix, vocab_size,
        user_defined_symbols=builtin.SPECIAL_SYMBOLS)
  if tok.vocab_size > vocab_size:
    raise ValueError(f'tokenizer {prefix}.model has {tok.vocab_size} pieces, more than '
                     f'vocab_size={vocab_size}')
  return task, tok
