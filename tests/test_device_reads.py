"""A whole training step reads the device only where it says so (`ac2_jax.device_reads`).

The step runs under `jax.transfer_guard('disallow')` with explicit device-to-host transfers
disallowed too, so the named reads (which lift the guard around themselves) are the only way
back to the host; an accidental `float(x)` or `np.asarray(x)` fails the test.

On CPU the guard alone cannot see a read: a CPU array is host memory and numpy reads it without
a transfer (jax-ml/jax#16602). So there `guarded` also fails, outside a named read, the property
`ArrayImpl._value` that `float`, `int`, `bool`, `tolist`, `__array__` and `jax.device_get` read
through, and `np.asarray` / `np.array` of a device array (numpy takes a CPU array's memory
through the buffer protocol, past `_value`). A numpy function handed a device array directly
(`np.mean(x)`) still reads it unseen on CPU; on an accelerator the guard catches that too.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import array as array_impl

from ac2_jax import device_reads
from ac2_jax.train import experiment
from train_fixtures import (compile_cache, length_credit_build_task, tiny_config,  # noqa: F401
                            train_base)


class UnnamedRead(AssertionError):
  pass


@contextlib.contextmanager
def guarded(monkeypatch):
  """No implicit transfers, and no device-to-host reads but the named ones."""
  if jax.default_backend() == 'cpu':
    value = array_impl.ArrayImpl._value

    def checked(self):
      if device_reads.open_read() is None:
        raise UnnamedRead(f'device read outside device_reads: {self.dtype}{list(self.shape)}')
      return value.fget(self)

    monkeypatch.setattr(array_impl.ArrayImpl, '_value', property(checked))
    for name in ('asarray', 'array'):
      monkeypatch.setattr(np, name, _checked_numpy(getattr(np, name)))
  with jax.transfer_guard('disallow'), jax.transfer_guard_device_to_host('disallow_explicit'):
    yield
  monkeypatch.undo()


def _checked_numpy(convert):
  def checked(a, *args, **kwargs):
    if isinstance(a, array_impl.ArrayImpl) and device_reads.open_read() is None:
      raise UnnamedRead(f'np.{convert.__name__} of a device array outside device_reads: '
                        f'{a.dtype}{list(a.shape)}')
    return convert(a, *args, **kwargs)
  return checked


def reads_during(fn):
  before = device_reads.counts()
  result = fn()
  after = device_reads.counts()
  return result, {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}


def test_the_guard_fails_an_unnamed_read_and_passes_a_named_one(monkeypatch):
  x_3 = jax.device_put(np.arange(3, dtype=np.float32))
  total = jnp.sum(x_3)
  with guarded(monkeypatch):
    for accident in (lambda: float(total), lambda: np.asarray(x_3), lambda: x_3.tolist(),
                     lambda: jax.device_get(x_3)):
      with pytest.raises((UnnamedRead, jax.errors.JaxRuntimeError)):
        accident()
    with pytest.raises(jax.errors.JaxRuntimeError, match='host-to-device'):
      x_3 + np.float32(1.0)  # an implicit upload fails too
    (got, reads) = reads_during(lambda: device_reads.read('named', {'total': total, 'x': x_3}))
  assert float(got['total']) == 3.0 and got['x'].tolist() == [0.0, 1.0, 2.0]
  assert reads == {'named': 1}


@pytest.mark.usefixtures('compile_cache')
def test_one_ac2_step_reads_the_device_only_where_named(train_base, tmp_path, monkeypatch):
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, 'ac2')
  rt, algorithm, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  key = experiment.step_key(c.seed, 1)
  with guarded(monkeypatch):
    (state, record), reads = reads_during(lambda: algorithm.step(rt, state, 1, key))
  # At this size every call fits one device batch: one read of the rollouts, one of the critic's
  # distributions (AC2's expectation readout), one of the advantages, one of the update metrics.
  assert reads == {'sampler_outputs': 1, 'token_distribution': 1, 'advantages': 1,
                   'update_metrics': 1}
  assert record['actor1/tokens'] > 0 and record['critic/pairs'] > 0
