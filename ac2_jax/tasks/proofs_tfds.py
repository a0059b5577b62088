"""Proof data sets from local files: FineProofs-RL (training) and IMO-ProofBench (validation).

Both are tensorflow-datasets builders with a manual directory: the user puts the data set's files
(parquet, JSONL or CSV, in any folder layout) in a directory, and `prepare` turns them into
array_record files that `read_rows` reads back without TensorFlow.

The files are read and every row checked by `proofs_files` (its names are re-exported here): a
malformed row or file is reported with its file (and row); `skip_malformed` decides whether it is
skipped (counted in the prepared data set's metadata and warned about) or fatal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib

import numpy as np
import tensorflow_datasets as tfds

from ac2_jax.tasks import tfds_local
from ac2_jax.tasks.proofs_files import (  # noqa: F401 (re-exported)
    DEFAULT_MAX_FIELD_CHARS, FINEPROOFS_RL, IMO_PROOFBENCH, MalformedRowError, ProofColumns,
    ProofRow, ProofSourceSettings, matching_files, read_source_files)

_MAX_LISTED_SKIPS = 100  # locations kept in the metadata; the count is always exact


# ------------------------------------------------------------------------------ tfds builders

@dataclasses.dataclass(eq=False)
class ProofFilesConfig(tfds.core.BuilderConfig):
  settings: ProofSourceSettings = ProofSourceSettings()


class _ProofFilesBuilder(tfds_local.LocalBuilder, skip_registration=True):
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
