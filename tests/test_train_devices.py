"""The whole tiny AC2 run on a data x fsdp x tensor = 2 x 2 x 2 mesh of 8 fake CPU devices gives the
metrics of the same run on one device (a fresh 1-device process). The 8-device run also projects
its update logits in chunks (`model.logits_chunk`), as the pod configs do; the other does not.

Both runs score with `LengthCreditTask`, so advantages and actor gradients are not all zero.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from ac2_jax.train import experiment, loop
from train_fixtures import (comparable, compile_cache, length_credit_build_task,  # noqa: F401
                            overrides, read_records, tiny_config, train_base, xla_flags)

pytestmark = [pytest.mark.usefixtures('compile_cache'), pytest.mark.slow]

MESH_8 = {'mesh.data': 2, 'mesh.fsdp': 2, 'mesh.tensor': 2, 'model.logits_chunk': 24}
MESH_1 = {'mesh.data': 1, 'mesh.fsdp': 1, 'mesh.tensor': 1}


def _close(a, b) -> bool:
  if isinstance(a, float) or isinstance(b, float):
    if a is None or b is None:
      return a is b
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
  return a == b


def test_eight_devices_match_one(train_base, tmp_path, monkeypatch):
  one, eight = tmp_path / 'one', tmp_path / 'eight'
  # The 1-device run is its own process (the device count is fixed when JAX starts); it runs
  # alongside this process's 8-device run.
  env = {**os.environ, 'XLA_FLAGS': xla_flags(1), 'JAX_PLATFORMS': 'cpu'}
  single = subprocess.Popen(
      [sys.executable, os.path.join(os.path.dirname(__file__), 'train_fixtures.py'),
       json.dumps({**overrides(train_base), **MESH_1}), str(one)],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  try:
    c = tiny_config(train_base, 'ac2', **{k.replace('.', '__'): v for k, v in MESH_8.items()})
    rt, _, state = experiment.build(c, str(tmp_path / 'build'), log=lambda *_: None)
    assert dict(rt.mesh.shape) == {'data': 2, 'fsdp': 2, 'tensor': 2}
    q_kernel = state.params['layers_0']['self_attn']['q_proj']['kernel']
    assert len(q_kernel.sharding.device_set) == 8 and not q_kernel.sharding.is_fully_replicated
    del rt, state
    summary = loop.train(c, str(eight), log=lambda *_: None)
    output, _ = single.communicate(timeout=600)
  finally:
    if single.poll() is None:
      single.kill()
  assert single.returncode == 0, output[-3000:]
  assert 'on 1 devices' in output
  assert summary.last_step == 1
  a, b = read_records(str(eight)), read_records(str(one))
  assert sorted(a) == sorted(b) == [0, 1]
  for step in (0, 1):
    a[step], b[step] = comparable(a[step]), comparable(b[step])
    assert sorted(a[step]) == sorted(b[step])
    differ = {k: (a[step][k], b[step][k]) for k in a[step] if not _close(a[step][k], b[step][k])}
    assert not differ, f'step {step}: 8 devices vs 1 device: {differ}'
  assert a[1]['decoding_flops'] > 0 and a[1]['critic/pairs'] > 0
  assert a[1]['adv/abs_mean'] > 0
  assert a[1]['actor1/grad_norm'] > 0 and a[1]['actor2/grad_norm'] > 0
