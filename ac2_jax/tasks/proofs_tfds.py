"""Proof data sets from local files: FineProofs-RL (training) and IMO-ProofBench (validation).

Both are tensorflow-datasets builders with a manual directory: the user puts the data set's files
(parquet, JSONL or CSV, in any folder layout) in a directory, and `prepare` turns them into
array_record files that `read_rows` reads back without TensorFlow.

Column names are settings (`ProofColumns`). A malformed row (missing or non-text problem, invalid
JSON line, duplicate id, a validation row without reference or guidelines) is reported with its
file and 1-based row number (the line number for JSONL); `skip_malformed` decides whether it is
skipped (counted in the prepared data set's metadata and warned about) or fatal.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import pathlib
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

logger = logging.getLogger(__name__)

_MAX_LISTED_SKIPS = 100  # locations kept in the metadata; the count is always exact


@dataclasses.dataclass(frozen=True)
class ProofColumns:
  """Which column holds what; None for a field the files do not have."""

  problem: str = 'problem'
  id: str | None = None  # None: the id is a hash of the problem text (stable across builds)
  reference_solution: str | None = None
  guidelines: str | None = None  # grading guidelines or rubric
  source: str | None = None  # competition or site


@dataclasses.dataclass(frozen=True)
class ProofSourceSettings:
  """How to read one data set's files."""

  columns: ProofColumns = ProofColumns()
  # Globs relative to the manual directory; every match is read, in sorted order.
  file_patterns: tuple[str, ...] = ('**/*.parquet', '**/*.jsonl', '**/*.csv')
  # True: malformed rows are skipped, counted and warned about. False: the first one is fatal.
  skip_malformed: bool = False
  # Validation data needs a reference solution and grading guidelines in every row.
  require_reference: bool = False


# Column names of the public releases (Hugging Face: lm-provers/FineProofs-RL, and IMO-ProofBench
# from Google DeepMind's IMO-Bench).
FINEPROOFS_RL = ProofSourceSettings(
    columns=ProofColumns(problem='problem', guidelines='rubrics', source='source'))
IMO_PROOFBENCH = ProofSourceSettings(
    columns=ProofColumns(problem='Problem', id='Problem ID', reference_solution='Solution',
                         guidelines='Grading guidelines', source='Source'),
    require_reference=True)


@dataclasses.dataclass(frozen=True)
class ProofRow:
  """One problem as read from the files."""

  id: str
  problem: str
  reference_solution: str = ''
  guidelines: str = ''
  source: str = ''
  file: str = ''  # path relative to the manual directory
  row: int = 0  # 1-based row (JSONL: line) number in that file


class MalformedRowError(ValueError):
  """A row that cannot become a problem; the message names file and row."""

  def __init__(self, file: str, row: int, reason: str):
    super().__init__(f'{file}: row {row}: {reason}')
    self.file, self.row, self.reason = file, row, reason


# ------------------------------------------------------------------------------ reading files

def _iter_file(path: pathlib.Path, where: str, columns: list[str]
               ) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
  """(row number, row dict or None, reason when None) for every row of one file.

  Tabular files (parquet, CSV) must have every configured column: a missing one is a settings
  error for the whole file, raised at once whatever `skip_malformed` says.
  """
  suffix = path.suffix.lower()
  if suffix == '.jsonl':
    with open(path, encoding='utf-8') as f:
      for line_no, line in enumerate(f, start=1):
        if not line.strip():
          continue  # blank lines (a trailing newline) are not rows
        try:
          obj = json.loads(line)
        except json.JSONDecodeError as e:
          yield line_no, None, f'invalid JSON ({e})'
          continue
        if not isinstance(obj, dict):
          yield line_no, None, f'a JSON {type(obj).__name__}, not an object'
          continue
        yield line_no, obj, ''
  elif suffix == '.parquet':
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    parquet = pq.ParquetFile(path)
    _check_columns(where, parquet.schema_arrow.names, columns)
    row_no = 0
    for batch in parquet.iter_batches(batch_size=1024):
      for obj in batch.to_pylist():
        row_no += 1
        yield row_no, obj, ''
  elif suffix == '.csv':
    # The csv module keeps every cell a string (ids like '007' stay intact).
    with open(path, encoding='utf-8', newline='') as f:
      reader = csv.DictReader(f)
      _check_columns(where, reader.fieldnames or [], columns)
      for row_no, obj in enumerate(reader, start=1):
        if None in obj:  # more cells than the header has names
          yield row_no, None, f'{len(obj[None])} cells more than the header names'
          continue
        yield row_no, obj, ''
  else:
    raise ValueError(f'{where}: unsupported file type {suffix!r} (use .parquet, .jsonl or .csv)')


def _check_columns(where: str, names: list[str], columns: list[str]) -> None:
  missing = [c for c in columns if c not in names]
  if missing:
    raise ValueError(f'{where}: no column(s) {missing}; the file has {list(names)}. '
                     'Set ProofColumns to the names this file uses.')


def _text(obj: dict[str, Any], column: str | None, *, required: bool) -> str:
  """A cell as text; raises KeyError/ValueError with the reason when it cannot be one."""
  if column is None:
    return ''
  if column not in obj:
    raise KeyError(f'no column {column!r} (row has {sorted(obj)})')
  value = obj[column]
  if value is None:
    if required:
      raise ValueError(f'column {column!r} is null')
    return ''
  if isinstance(value, (list, dict)):  # structured rubrics: keep them readable, as JSON
    return json.dumps(value, ensure_ascii=False)
  if isinstance(value, int) and not isinstance(value, bool):
    return str(value)  # numeric ids
  if not isinstance(value, str):
    raise ValueError(f'column {column!r} holds a {type(value).__name__}, not text')
  if required and not value.strip():
    raise ValueError(f'column {column!r} is empty')
  return value


def _problem_id(problem: str) -> str:
  return 'p-' + hashlib.sha1(problem.strip().encode('utf-8')).hexdigest()[:16]


def matching_files(manual_dir: pathlib.Path, patterns: tuple[str, ...]) -> list[pathlib.Path]:
  files = sorted({p for pattern in patterns for p in manual_dir.glob(pattern) if p.is_file()})
  if not files:
    raise FileNotFoundError(f'no files matching {list(patterns)} under {manual_dir}')
  return files


def read_source_files(manual_dir: str | pathlib.Path, settings: ProofSourceSettings
                      ) -> tuple[list[ProofRow], list[MalformedRowError]]:
  """All good rows of the files, and the malformed ones that were skipped.

  Raises the first `MalformedRowError` unless `settings.skip_malformed`.
  """
  root = pathlib.Path(manual_dir)
  cols = settings.columns
  rows: list[ProofRow] = []
  skipped: list[MalformedRowError] = []
  seen: dict[str, str] = {}  # id -> where it was first seen
  wanted = [c for c in dataclasses.astuple(cols) if c is not None]
  for path in matching_files(root, settings.file_patterns):
    rel = path.relative_to(root).as_posix()
    where = str(path)  # errors name the file as the user can open it
    for row_no, obj, reason in _iter_file(path, where, wanted):
      try:
        if obj is None:
          raise MalformedRowError(where, row_no, reason)
        try:
          problem = _text(obj, cols.problem, required=True)
          reference = _text(obj, cols.reference_solution, required=settings.require_reference)
          guidelines = _text(obj, cols.guidelines, required=settings.require_reference)
          source = _text(obj, cols.source, required=False)
          row_id = (_text(obj, cols.id, required=True).strip() if cols.id is not None
                    else _problem_id(problem))
        except (KeyError, ValueError) as e:
          raise MalformedRowError(where, row_no, str(e).strip('"')) from None
        if row_id in seen:
          raise MalformedRowError(where, row_no,
                                  f'duplicate id {row_id!r} (first at {seen[row_id]})')
      except MalformedRowError as e:
        if not settings.skip_malformed:
          raise
        logger.warning('skipping malformed row: %s', e)
        skipped.append(e)
        continue
      seen[row_id] = f'{where}: row {row_no}'
      rows.append(ProofRow(row_id, problem, reference, guidelines, source, rel, row_no))
  if skipped:
    logger.warning('skipped %d malformed rows under %s', len(skipped), root)
  return rows, skipped


# ------------------------------------------------------------------------------ tfds builders

@dataclasses.dataclass(eq=False)
class ProofFilesConfig(tfds.core.BuilderConfig):
  settings: ProofSourceSettings = ProofSourceSettings()


class _ProofFilesBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared body of the two builders: one split, read from the manual directory."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First release.'}
  SPLIT = ''

  def _info(self) -> tfds.core.DatasetInfo:
    text = tfds.features.Text()
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.__doc__,
        features=tfds.features.FeaturesDict({
            'id': text, 'problem': text, 'reference_solution': text, 'guidelines': text,
            'source': text, 'file': text, 'row': tfds.features.Scalar(dtype=np.int64),
        }),
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    return {self.SPLIT: self._generate_examples(pathlib.Path(dl_manager.manual_dir))}

  def _generate_examples(self, manual_dir: pathlib.Path):
    rows, skipped = read_source_files(manual_dir, self.builder_config.settings)
    self.info.metadata['num_skipped_rows'] = len(skipped)
    self.info.metadata['skipped_rows'] = [str(e) for e in skipped[:_MAX_LISTED_SKIPS]]
    for r in rows:
      yield r.id, {'id': r.id, 'problem': r.problem, 'reference_solution': r.reference_solution,
                   'guidelines': r.guidelines, 'source': r.source, 'file': r.file, 'row': r.row}


class FineproofsRl(_ProofFilesBuilder):
  """FineProofs-RL: olympiad proof problems (with rubrics) for RL training."""

  name = 'fineproofs_rl'
  SPLIT = 'train'
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      'Put the FineProofs-RL files (parquet or JSONL, e.g. data/train-*.parquet from the Hugging '
      'Face data set lm-provers/FineProofs-RL) in the manual directory.')


class ImoProofbench(_ProofFilesBuilder):
  """IMO-ProofBench: olympiad problems with reference solutions and grading guidelines."""

  name = 'imo_proofbench'
  SPLIT = 'validation'
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      'Put the IMO-ProofBench files (parquet, JSONL or CSV with columns Problem ID, Problem, '
      'Solution, Grading guidelines) in the manual directory.')


# Explicit registry: which builder prepares which data set.
BUILDERS: dict[str, type[_ProofFilesBuilder]] = {
    'fineproofs_rl': FineproofsRl,
    'imo_proofbench': ImoProofbench,
}
DEFAULT_SETTINGS = {'fineproofs_rl': FINEPROOFS_RL, 'imo_proofbench': IMO_PROOFBENCH}


def _config_name(manual_dir: pathlib.Path, settings: ProofSourceSettings) -> str:
  """A config name that changes when the settings or the manual files change.

  So a prepared copy is reused only while it still matches what it was built from.
  """
  h = hashlib.sha1(repr(settings).encode())
  for path in matching_files(manual_dir, settings.file_patterns):
    stat = path.stat()
    h.update(f'{path.relative_to(manual_dir).as_posix()}|{stat.st_size}|{stat.st_mtime_ns}'
             .encode())
  return 'files_' + h.hexdigest()[:12]


def prepare(dataset: str, manual_dir: str | pathlib.Path, data_dir: str | pathlib.Path,
            settings: ProofSourceSettings | None = None) -> tfds.core.DatasetBuilder:
  """Builds (or reuses) the array_record copy of `dataset` ('fineproofs_rl' or 'imo_proofbench')."""
  if dataset not in BUILDERS:
    raise ValueError(f'unknown proof data set {dataset!r}; choose one of {sorted(BUILDERS)}')
  settings = DEFAULT_SETTINGS[dataset] if settings is None else settings
  manual = pathlib.Path(manual_dir)
  if not manual.is_dir():
    raise FileNotFoundError(f'manual directory {manual} for {dataset} does not exist')
  config = ProofFilesConfig(name=_config_name(manual, settings), settings=settings,
                            description=f'{dataset} read from local files')
  builder = BUILDERS[dataset](config=config, data_dir=str(data_dir), file_format='array_record')
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
  return builder


def read_rows(builder: tfds.core.DatasetBuilder) -> list[ProofRow]:
  """The prepared rows in file order (files sorted by path, then row number)."""
  split = builder.SPLIT  # type: ignore[attr-defined]
  source = builder.as_data_source(split=split)
  rows = []
  for i in range(len(source)):
    ex = source[i]
    text = {k: (v.decode('utf-8') if isinstance(v, bytes) else str(v)) for k, v in ex.items()
            if k != 'row'}
    rows.append(ProofRow(text['id'], text['problem'], text['reference_solution'],
                         text['guidelines'], text['source'], text['file'], int(ex['row'])))
  rows.sort(key=lambda r: (r.file, r.row))
  return rows


def num_skipped_rows(builder: tfds.core.DatasetBuilder) -> int:
  return int(builder.info.metadata.get('num_skipped_rows', 0))
