"""Test-wide settings: 8 fake CPU devices so sharding tests can build real meshes, and one persistent
XLA compilation cache for the whole suite."""

import os
import tempfile

# Must be set before JAX initialises its backends. The tests' programs are tiny, so compiling them
# takes far longer than running them: XLA's cheaper CPU backend passes cut the suite's compile time
# (measured: a walk run's test 76 -> 59 s) and the golden step metrics stay within their 1e-5.
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8 '
                      '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# Both xdist workers and every process the tests start (launchers, distributed workers, notebooks)
# compile the same tiny programs again and again; one cache for all of them turns the repeats into
# loads. It is keyed by the program, so a changed program compiles anew.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(
    tempfile.gettempdir(), f'ac2_jax_tests_xla_cache_{os.getuid()}'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')

# The longest modules first (measured, idle 2-core machine, session 7: 60-140 s each), so that the
# two xdist workers (`--dist loadfile`) start them early and finish together instead of one of them
# running a long module alone at the end.
LONGEST_FIRST = ('test_distributed.py', 'test_train_smoke.py', 'test_train_guards.py',
                 'test_dry_run.py', 'test_value_critic.py', 'test_train_updates.py',
                 'test_critic_probe.py', 'test_train_devices.py', 'test_walk_run.py',
                 'test_golden_steps.py', 'test_train_resume.py', 'test_notebooks.py')


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: others keep order
