"""JSON form of the controller's state (the run checkpoint writes host state with orbax JsonSave).

Arrays travel as base64 of their raw little-endian bytes with dtype and shape: 10^7 tokens cost
about 53 MB of JSON text rather than ~70 MB of decimal lists, and NaN never reaches the encoder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from typing import Any, Hashable, Sequence

import numpy as np

from ac2_jax.controller.critic_buffer import CriticPair
from ac2_jax.controller.replay import Trajectory, freeze_tokens

_ARRAY_TAG = '__ndarray__'


def pack_array(array: np.ndarray) -> dict:
  array = np.ascontiguousarray(array)
  dtype = array.dtype.newbyteorder('<') if array.dtype.byteorder == '>' else array.dtype
  return {'dtype': dtype.str, 'shape': list(array.shape),
          'base64': base64.b64encode(array.astype(dtype, copy=False).tobytes()).decode('ascii')}


def unpack_array(packed: dict) -> np.ndarray:
  try:
    raw = base64.b64decode(packed['base64'])
    return np.frombuffer(raw, dtype=np.dtype(packed['dtype'])).reshape(packed['shape']).copy()
  except (KeyError, TypeError, ValueError) as error:
    raise ValueError(f'not a packed array: {str(packed)[:80]!r} ({error})') from error


def pack_ragged(arrays: Sequence[np.ndarray], dtype: Any) -> dict:
  """A list of 1-D arrays as one flat array plus lengths."""
  lengths = np.array([a.shape[0] for a in arrays], np.int64)
  flat = np.concatenate([np.asarray(a, dtype) for a in arrays]) if arrays else np.zeros((0,), dtype)
  return {'flat': pack_array(flat.astype(dtype, copy=False)), 'lengths': pack_array(lengths)}


def unpack_ragged(packed: dict) -> list[np.ndarray]:
  flat = unpack_array(packed['flat'])
  lengths = unpack_array(packed['lengths'])
  if int(lengths.sum()) != flat.shape[0]:
    raise ValueError(f'ragged array lengths sum to {int(lengths.sum())}, '
                     f'the flat array holds {flat.shape[0]}')
  return np.split(flat, np.cumsum(lengths)[:-1]) if lengths.size else []


def pack_value(value: Any) -> Any:
  """Opaque caller data (references) to JSON: numpy arrays are tagged, containers recurse."""
  if isinstance(value, np.ndarray):
    return {_ARRAY_TAG: pack_array(value)}
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, (list, tuple)):
    return [pack_value(v) for v in value]
  if isinstance(value, dict):
    if not all(isinstance(k, str) for k in value):
      raise TypeError(f'only dicts with str keys can be checkpointed, got keys {list(value)[:5]}')
    return {k: pack_value(v) for k, v in value.items()}
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  raise TypeError(f'cannot checkpoint a reference of type {type(value).__name__}: use a numpy '
                  'array or JSON data (str, numbers, lists, dicts)')


def unpack_value(value: Any) -> Any:
  if isinstance(value, dict):
    if set(value) == {_ARRAY_TAG}:
      return unpack_array(value[_ARRAY_TAG])
    return {k: unpack_value(v) for k, v in value.items()}
  if isinstance(value, list):
    return [unpack_value(v) for v in value]
  return value


def ids_digest(problem_ids: Sequence[Hashable]) -> str:
  """A fingerprint of the ordered problem ids (checked on restore)."""
  text = json.dumps([repr(p) for p in problem_ids])
  return hashlib.sha256(text.encode()).hexdigest()


def pack_trajectories(trajectories: Sequence[Trajectory], kept_lengths: dict[int, int]) -> dict:
  """Trajectories as columns; each keeps only its first kept_lengths[id] tokens."""
  ts = trajectories
  return {
      'ids': pack_array(np.array([t.trajectory_id for t in ts], np.int64)),
      'problems': pack_array(np.array([t.problem for t in ts], np.int64)),
      'points': pack_array(np.array([-1 if t.points is None else t.points for t in ts],
                                    np.float64)),
      'passed': pack_array(np.array([t.passed for t in ts], bool)),
      'steps': pack_array(np.array([t.step for t in ts], np.int64)),
      'cut_ends': pack_array(np.array([-1 if t.cut_end is None else t.cut_end for t in ts],
                                      np.int64)),
      'chunk_ends': pack_array(np.array([-1 if t.chunk_end is None else t.chunk_end for t in ts],
                                        np.int64)),
      'tokens': pack_ragged([t.tokens_L[:kept_lengths[t.trajectory_id]] for t in ts], np.int32),
      'references': [pack_value(t.reference) for t in ts],
  }


def unpack_trajectories(packed: dict) -> dict[int, Trajectory]:
  """Trajectory id -> Trajectory."""
  columns = [unpack_array(packed[k]).tolist()
             for k in ('ids', 'problems', 'points', 'passed', 'steps')]
  tokens = unpack_ragged(packed['tokens'])
  references = packed['references']
  # A state saved before trajectories kept a cut (chunk) end has none (-1: None).
  cut_ends, chunk_ends = ((unpack_array(packed[k]).tolist() if k in packed
                           else [-1] * len(columns[0])) for k in ('cut_ends', 'chunk_ends'))
  if not (len(tokens) == len(references) == len(cut_ends) == len(chunk_ends)
          == len(columns[0])):
    raise ValueError(f'trajectory columns disagree: {len(columns[0])} ids, {len(tokens)} token '
                     f'arrays, {len(references)} references, {len(cut_ends)} cut ends, '
                     f'{len(chunk_ends)} chunk ends')
  by_id = {}
  for k, (i, problem, points, passed, step) in enumerate(zip(*columns)):
    by_id[i] = Trajectory(i, problem, freeze_tokens(tokens[k]), None if points < 0 else points,
                          bool(passed), unpack_value(references[k]), step,
                          None if cut_ends[k] < 0 else cut_ends[k],
                          None if chunk_ends[k] < 0 else chunk_ends[k])
  return by_id


def pack_pairs(pairs: Sequence[CriticPair]) -> dict:
  return {
      'problems': pack_array(np.array([p.problem for p in pairs], np.int64)),
      'sources': pack_array(np.array([-1 if p.source is None else p.source.trajectory_id
                                      for p in pairs], np.int64)),
      'cuts': pack_array(np.array([p.cut for p in pairs], np.int64)),
      'targets': pack_array(np.array([p.target for p in pairs], np.float64)),
      'steps': pack_array(np.array([p.step for p in pairs], np.int64)),
      'values': pack_array(np.array([np.nan if p.value is None else p.value for p in pairs],
                                    np.float64)),
  }


def unpack_pairs(packed: dict, trajectories: dict[int, Trajectory]) -> list[CriticPair]:
  columns = [unpack_array(packed[k]).tolist()
             for k in ('problems', 'sources', 'cuts', 'targets', 'steps')]
  # A state saved before pairs kept their unrounded means has none (NaN: None).
  values = (unpack_array(packed['values']).tolist() if 'values' in packed
            else [math.nan] * len(columns[0]))
  return [CriticPair(problem, trajectories[source] if source >= 0 else None, cut, target, step,
                     None if math.isnan(value) else value)
          for problem, source, cut, target, step, value in zip(*columns, values)]
