"""train/compile_cache.py: a fresh process keeps every program it compiles, and the next one loads
them (the suite's own cache, tests/conftest.py, is left out of these processes' environment)."""

import os
import subprocess
import sys

SCRIPT = """
import sys
from ac2_jax.train import compile_cache
compile_cache.enable(sys.argv[1])
import jax, jax.numpy as jnp
print(float(jax.jit(lambda x: (x * 3.0 + 1.0).sum())(jnp.arange(4.0))))
"""


def _run(directory):
  env = {k: v for k, v in os.environ.items() if not k.startswith('JAX_PERSISTENT_CACHE')
         and k != 'JAX_COMPILATION_CACHE_DIR'}
  out = subprocess.run([sys.executable, '-c', SCRIPT, directory], env=env, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  return out


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
  directory = str(tmp_path / 'cache')  # created by enable
  first = _run(directory)
  assert first.stdout.strip() == '22.0'
  saved = sorted(os.listdir(directory))
  assert saved  # a program that compiles in milliseconds is kept too
  second = _run(directory)
  assert second.stdout.strip() == '22.0'
  assert sorted(os.listdir(directory)) == saved  # nothing new: every program was loaded
