"""Deterministic random draws: one numpy Generator per (seed, purpose, step, index).

Every draw of the controller comes from a generator keyed by what it is for, so a run restored from
a checkpoint (or replayed in another process) draws exactly the same numbers, and adding a new kind
of draw never shifts the existing ones. The key is hashed with BLAKE2b, never Python's `hash()`
(salted per process).
"""

from __future__ import annotations

import hashlib

import numpy as np


def key(seed: int, purpose: str, step: int, index: int = 0) -> int:
  """A 128-bit integer that depends only on the four parts."""
  text = f'{int(seed)}|{purpose}|{int(step)}|{int(index)}'.encode()
  return int.from_bytes(hashlib.blake2b(text, digest_size=16).digest(), 'little')


def generator(seed: int, purpose: str, step: int, index: int = 0) -> np.random.Generator:
  """A fresh PCG64 generator for one purpose of one step."""
  return np.random.Generator(np.random.PCG64(key(seed, purpose, step, index)))
