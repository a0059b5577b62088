"""Seconds per JAX operation of one call of a compiled program, from a JAX profiler trace.

  seconds_by_op, result = traced_seconds(lambda: compiled(*args), compiled.as_text())

The trace names each executed XLA operation (a fusion, a matmul, a loop); the compiled HLO text
gives each one the op_name of the JAX operation it came from (`jit(f)/while/body/Decoder/
layers_0/mlp/up_proj/dot_general`; a gradient's are `transpose(jvp(...))/...`), so the time can be
added up by source. An operation with no metadata (a copy XLA inserted) is left out.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
from typing import Callable

import jax


def op_names(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> the op_name of its metadata."""
  found = {}
  for m in re.finditer(r'^\s*(?:ROOT )?%(\S+) = .*?metadata=\{op_name="([^"]*)"', hlo_text, re.M):
    found[m.group(1)] = m.group(2)
  return found


def traced_seconds(call: Callable[[], object],
                   hlo_text: str) -> tuple[collections.Counter, object]:
  """(seconds per op_name, the call's result) of one `call()` of the program `hlo_text` is."""
  names = op_names(hlo_text)
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp)
    result = call()
    jax.block_until_ready(result)
    jax.profiler.stop_trace()
    (trace,) = glob.glob(os.path.join(tmp, '**', '*.trace.json.gz'), recursive=True)
    with gzip.open(trace) as f:
      events = json.load(f)['traceEvents']
  seconds = collections.Counter()
  for e in events:
    op = names.get(e.get('name')) if e.get('ph') == 'X' else None
    if op is not None:
      seconds[op] += e['dur'] / 1e6
  return seconds, result
