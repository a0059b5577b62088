"""Reading the proof data sets' local files (parquet, JSONL, CSV) into rows, checking every row.

Column names are settings (`ProofColumns`). A malformed row (missing or non-text problem, invalid
JSON line, bytes that are not UTF-8, a field longer than `max_field_chars`, duplicate id, a
validation row without reference or guidelines) is reported with its file and 1-based row number
(the line number for JSONL); a file that holds no rows (empty or 0 bytes) or cannot be read as its
format (a corrupt parquet file) is reported with its file, as one malformed entry. `skip_malformed`
decides whether they are skipped (counted and warned about) or fatal. Only a configured column
that a tabular file lacks is always fatal: it is a settings error, not bad data.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import hashlib
import json
import logging
import pathlib
from typing import Any, Iterator

logger = logging.getLogger(__name__)

# Longest text field accepted, in characters (about 25k tokens): far above any olympiad problem,
# reference solution or rubric in the public releases, far below a pasted file or a stray
# unclosed CSV quote swallowing the rest of the file.
DEFAULT_MAX_FIELD_CHARS = 100_000


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
  # A configured text field longer than this many characters makes its row malformed.
  max_field_chars: int = DEFAULT_MAX_FIELD_CHARS

  def __post_init__(self):
    if self.max_field_chars < 1:
      raise ValueError(f'max_field_chars must be >= 1, got {self.max_field_chars}')


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
  """A row that cannot become a problem; the message names file and row (row 0: the whole file)."""

  def __init__(self, file: str, row: int, reason: str):
    super().__init__(f'{file}: row {row}: {reason}' if row else f'{file}: {reason}')
    self.file, self.row, self.reason = file, row, reason


# ------------------------------------------------------------------------------ reading files

_EMPTY = 'empty file: no rows'


def _iter_file(path: pathlib.Path, where: str, columns: list[str]
               ) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
  """(row number, row dict or None, reason when None) for every row of one file.

  Row number 0 with a reason is the whole file: it holds no rows, or it cannot be read (from that
  point on: rows read before a corrupt part are kept). Tabular files (parquet, CSV) must have every
  configured column: a missing one is a settings error for the whole file, raised at once
  whatever `skip_malformed` says.
  """
  suffix = path.suffix.lower()
  if suffix == '.jsonl':
    yield from _iter_jsonl(path)
  elif suffix == '.parquet':
    yield from _iter_parquet(path, where, columns)
  elif suffix == '.csv':
    yield from _iter_csv(path, where, columns)
  else:
    raise ValueError(f'{where}: unsupported file type {suffix!r} (use .parquet, .jsonl or .csv)')


def _not_utf8(e: UnicodeError) -> str:
  return f'not valid UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})'


def _iter_jsonl(path: pathlib.Path):
  # Bytes, decoded line by line: one line that is not UTF-8 is one malformed row.
  rows = 0
  with open(path, 'rb') as f:
    for line_no, raw in enumerate(f, start=1):
      if line_no == 1 and raw.startswith(b'\xef\xbb\xbf'):
        raw = raw[3:]  # a UTF-8 byte order mark
      try:
        line = raw.decode('utf-8')
      except UnicodeDecodeError as e:
        rows += 1
        yield line_no, None, _not_utf8(e)
        continue
      if not line.strip():
        continue  # blank lines (a trailing newline) are not rows
      rows += 1
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        yield line_no, None, f'invalid JSON ({e})'
        continue
      if not isinstance(obj, dict):
        yield line_no, None, f'a JSON {type(obj).__name__}, not an object'
        continue
      yield line_no, obj, ''
  if not rows:
    yield 0, None, _EMPTY


def _iter_parquet(path: pathlib.Path, where: str, columns: list[str]):
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  if path.stat().st_size == 0:
    yield 0, None, 'empty file (0 bytes)'
    return
  try:
    parquet = pq.ParquetFile(path)
  except (pa.ArrowException, OSError) as e:
    yield 0, None, f'not a readable parquet file ({type(e).__name__}: {e})'
    return
  _check_columns(where, parquet.schema_arrow.names, columns)
  row_no = 0
  try:
    # Only the configured columns are read (once each): other columns may be large or exotic.
    for batch in parquet.iter_batches(batch_size=1024, columns=list(dict.fromkeys(columns))):
      for obj in batch.to_pylist():
        row_no += 1
        yield row_no, obj, ''
  except (pa.ArrowException, OSError) as e:
    yield 0, None, f'unreadable after row {row_no} ({type(e).__name__}: {e})'
    return
  if not row_no:
    yield 0, None, _EMPTY


@contextlib.contextmanager
def _csv_fields_unlimited():
  # The csv module refuses a field over 131,072 characters with an error that ends the file;
  # lifted, an oversized cell reaches the per-field check and is one malformed row.
  old = csv.field_size_limit()
  csv.field_size_limit(2 ** 31 - 1)
  try:
    yield
  finally:
    csv.field_size_limit(old)


def _iter_csv(path: pathlib.Path, where: str, columns: list[str]):
  # The csv module keeps every cell a string (ids like '007' stay intact). Bytes that are not
  # UTF-8 survive decoding as surrogates, so only the row holding them is malformed.
  with _csv_fields_unlimited(), open(path, encoding='utf-8-sig', errors='surrogateescape',
                                     newline='') as f:
    reader = csv.DictReader(f)
    if reader.fieldnames is None:
      yield 0, None, _EMPTY
      return
    _check_columns(where, reader.fieldnames, columns)
    row_no = 0
    for row_no, obj in enumerate(reader, start=1):
      if None in obj:  # more cells than the header has names
        yield row_no, None, f'{len(obj[None])} cells more than the header names'
        continue
      bad = next((c for c in columns if _has_surrogates(obj.get(c))), None)
      if bad is not None:
        yield row_no, None, f'column {bad!r} is not valid UTF-8'
        continue
      yield row_no, obj, ''
    if not row_no:
      yield 0, None, _EMPTY


def _has_surrogates(value) -> bool:
  if not isinstance(value, str):
    return False
  try:
    value.encode('utf-8')
  except UnicodeEncodeError:
    return True
  return False


def _check_columns(where: str, names: list[str], columns: list[str]) -> None:
  missing = [c for c in columns if c not in names]
  if missing:
    raise ValueError(f'{where}: no column(s) {missing}; the file has {list(names)}. '
                     'Set ProofColumns to the names this file uses.')


def _text(obj: dict[str, Any], column: str | None, *, required: bool, max_chars: int) -> str:
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
  if isinstance(value, bytes):  # a parquet binary column
    try:
      value = value.decode('utf-8')
    except UnicodeDecodeError as e:
      raise ValueError(f'column {column!r} is {_not_utf8(e)}') from None
  if isinstance(value, (list, dict)):  # structured rubrics: keep them readable, as JSON
    value = json.dumps(value, ensure_ascii=False)
  elif isinstance(value, int) and not isinstance(value, bool):
    value = str(value)  # numeric ids
  if not isinstance(value, str):
    raise ValueError(f'column {column!r} holds a {type(value).__name__}, not text')
  if len(value) > max_chars:
    raise ValueError(f'column {column!r} holds {len(value):,} characters, more than '
                     f'max_field_chars={max_chars:,}')
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
          text = functools.partial(_text, obj, max_chars=settings.max_field_chars)
          problem = text(cols.problem, required=True)
          reference = text(cols.reference_solution, required=settings.require_reference)
          guidelines = text(cols.guidelines, required=settings.require_reference)
          source = text(cols.source, required=False)
          row_id = (text(cols.id, required=True).strip() if cols.id is not None
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
