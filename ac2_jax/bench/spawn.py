"""One benchmark job in a fresh Python process: the driver's side (`run`), the worker's (`serve`).

Engines that share a process share its CPU thread pools (JAX's and torch's each size theirs to
every core and then compete), and the first one to run warms the caches of the second. So each
engine runs alone in its own process, and the driver compares what they write back.

  result = spawn.run('ac2_jax.bench.sampler_hf', {'task': 'time', ...})     # driver
  if __name__ == '__main__': spawn.serve({'time': time_fn, ...})             # worker module

A job is a JSON object whose 'task' names the worker's handler; the other keys are its keyword
arguments. The handler returns JSON data, which `run` returns. This module imports no JAX, so a
worker that does not need JAX never starts its thread pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Callable

# The repository root that holds this copy of ac2_jax: workers import the same code as the driver.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class WorkerFailed(RuntimeError):
  pass


def run(module: str, job: dict, env: dict | None = None, timeout_s: float = 1800.0) -> dict:
  """Runs `python -m module` on `job` (with `env` added to the environment); returns its result.
  Raises WorkerFailed (with the worker's last output) when it exits non-zero."""
  env = {**os.environ, **(env or {})}
  env['PYTHONPATH'] = os.pathsep.join(p for p in (_ROOT, env.get('PYTHONPATH')) if p)
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, 'result.json')
    proc = subprocess.run([sys.executable, '-m', module, json.dumps(job), out], env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
      tail = '\n'.join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
      raise WorkerFailed(f'{module} {job.get("task")} exited with {proc.returncode}:\n{tail}')
    with open(out) as f:
      return json.load(f)


def serve(handlers: dict[str, Callable[..., dict]], argv: list[str] | None = None) -> None:
  """The worker's main: runs the job in argv[1] and writes its result to argv[2]."""
  argv = sys.argv if argv is None else argv
  if len(argv) != 3:
    raise SystemExit(f'usage: python -m MODULE JOB_JSON RESULT_PATH (jobs: {sorted(handlers)})')
  job = json.loads(argv[1])
  task = job.pop('task')
  if task not in handlers:
    raise SystemExit(f'unknown task {task!r}; this worker runs {sorted(handlers)}')
  result = handlers[task](**job)
  with open(argv[2], 'w') as f:
    json.dump(result, f)
