"""Named device-to-host reads: the few places where the host waits for the device on purpose.

  host = device_reads.read('update_metrics', metrics_tree)   # jax.device_get, under a name

A training step reads the device a few times by design: the sampler's outputs (once per device
call), the critic's next-token distributions, the update metrics (once, at the end of a step).
Each of those goes through `read(name, tree)`: an explicit `jax.device_get` that lifts any
device-to-host transfer guard around itself and counts itself under its name. Any other read
(a `float(x)` or `np.asarray(x)` of a device array) stalls the host until the device is done
and is an accident: tests/test_device_reads.py runs a whole training step with every transfer
but the named reads disallowed.

The open reads are kept per thread (`open_read`), so a test on a backend whose arrays live in
host memory (CPU, where reading is no transfer and the guard never fires) can still tell a named
read from an accidental one.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any

import jax

_COUNTS: collections.Counter = collections.Counter()
_OPEN = threading.local()


@contextlib.contextmanager
def allowed(name: str):
  """Device-to-host transfers allowed inside, counted as one read named `name`."""
  _COUNTS[name] += 1
  stack = _OPEN.__dict__.setdefault('names', [])
  stack.append(name)
  try:
    with jax.transfer_guard_device_to_host('allow'):
      yield
  finally:
    stack.pop()


def read(name: str, tree: Any) -> Any:
  """`jax.device_get(tree)` as the read named `name` (the arrays of a tree copy in parallel)."""
  with allowed(name):
    return jax.device_get(tree)


def counts() -> dict[str, int]:
  """Reads so far in this process, by name."""
  return dict(_COUNTS)


def open_read() -> str | None:
  """The name of the read in progress on this thread, None outside any."""
  stack = getattr(_OPEN, 'names', None)
  return stack[-1] if stack else None
