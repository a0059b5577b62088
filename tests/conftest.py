"""Test-wide settings: 8 fake CPU devices so sharding tests can build real meshes, and one persistent
XLA compilation cache for the whole suite."""

import os
import tempfile

# Must be set before JAX initialises its backends.
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# Both xdist workers and every process the tests start (launchers, distributed workers, notebooks)
# compile the same tiny programs again and again; one cache for all of them turns the repeats into
# loads. It is keyed by the program, so a changed program compiles anew.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(
    tempfile.gettempdir(), f'ac2_jax_tests_xla_cache_{os.getuid()}'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')
