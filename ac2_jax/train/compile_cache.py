"""The persistent XLA compilation cache: compiled programs saved to a directory and loaded by any
later process that compiles the same program (a rerun, a resumed run, a comparison's other runs).

jax has the cache (`jax_compilation_cache_dir`) but by default keeps only programs that took a
second or more to compile. An AC2 step compiles many smaller ones: its sampler, reads and updates
meet new shapes for tens of steps (BENCHMARKS.md, "Session 32": 4.2 s of compiles a step in a
restored run's first steps). With every program kept, the same restore ran its steps in 0.67x
the time with a warm cache.

A process initialises its cache at its first compile and keeps it: `enable` takes effect only
before then (launch/compare.py calls it at its start, the trainer before it builds anything). The
environment's JAX_COMPILATION_CACHE_DIR works too.
"""

from __future__ import annotations

import os

import jax


def enable(directory: str) -> str:
  """Saves every compiled program under `directory` (created) and loads from it; returns its
  absolute path."""
  path = os.path.abspath(os.path.expanduser(directory))
  os.makedirs(path, exist_ok=True)
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  return path
