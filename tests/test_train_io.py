"""Run outputs: TensorBoard event files, metrics JSONL, plots and orbax checkpoints."""

import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ac2_jax.train import checkpointing, metrics, plots, tensorboard


def _fields(data: bytes) -> list[tuple[int, int, object]]:
  """Minimal protobuf wire decoder: (field number, wire type, raw value)."""
  out, i = [], 0

  def varint():
    nonlocal i
    shift = value = 0
    while True:
      b = data[i]
      i += 1
      value |= (b & 0x7F) << shift
      shift += 7
      if not b & 0x80:
        return value

  while i < len(data):
    key = varint()
    number, wire = key >> 3, key & 7
    if wire == 0:
      out.append((number, wire, varint()))
    elif wire == 1:
      out.append((number, wire, data[i:i + 8]))
      i += 8
    elif wire == 5:
      out.append((number, wire, data[i:i + 4]))
      i += 4
    elif wire == 2:
      n = varint()
      out.append((number, wire, data[i:i + n]))
      i += n
    else:
      raise AssertionError(f'unexpected wire type {wire}')
  return out


def test_crc32c_known_vector():
  assert tensorboard.crc32c(b'123456789') == 0xE3069283


def test_event_file_holds_scalars(tmp_path):
  writer = tensorboard.SummaryWriter(str(tmp_path))
  writer.scalars(7, {'reward': 0.25, 'flag': True, 'name': 'x'})
  writer.close()
  records = tensorboard.read_records(writer.path)
  assert len(records) == 2
  first = dict((n, v) for n, _, v in _fields(records[0]))
  assert first[3] == b'brain.Event:2'
  event = dict((n, v) for n, _, v in _fields(records[1]))
  assert event[2] == 7
  (value_msg,) = [v for n, _, v in _fields(event[5]) if n == 1]
  value = dict((n, v) for n, _, v in _fields(value_msg))
  assert value[1] == b'reward'  # Booleans and strings are not scalars.
  assert struct.unpack('<f', value[2])[0] == pytest.approx(0.25)


def test_event_file_corruption_is_detected(tmp_path):
  writer = tensorboard.SummaryWriter(str(tmp_path))
  writer.scalars(1, {'a': 1.0})
  writer.close()
  raw = bytearray(open(writer.path, 'rb').read())
  raw[-6] ^= 0xFF
  open(writer.path, 'wb').write(bytes(raw))
  with pytest.raises(ValueError, match='corrupt'):
    tensorboard.read_records(writer.path)


def test_metrics_jsonl_and_truncate(tmp_path):
  logger = metrics.MetricsLogger(str(tmp_path))
  for step in range(1, 5):
    logger.write(step, {'loss': np.float32(step / 2), 'bad': float('nan')})
  logger.truncate_after(2)
  logger.close()
  records = metrics.read_metrics(logger.path)
  assert [r['step'] for r in records] == [1, 2]
  assert records[1]['loss'] == 1.0 and records[1]['bad'] is None
  with open(logger.path, 'a') as f:
    f.write('{not json\n')
  with pytest.raises(ValueError, match=':3: malformed'):
    metrics.read_metrics(logger.path)


def test_metrics_torn_last_line_dropped_on_resume(tmp_path, caplog):
  logger = metrics.MetricsLogger(str(tmp_path))
  for step in range(1, 4):
    logger.write(step, {'loss': 0.5 * step})
  logger.close()
  full = open(logger.path, 'rb').read()
  torn = full[:len(full) - 9]  # killed while appending record 3
  open(logger.path, 'wb').write(torn)
  records = metrics.read_metrics(logger.path)
  assert [r['step'] for r in records] == [1, 2]
  assert ':3: dropped a torn last line' in caplog.text
  # The resume path (truncate_after the checkpoint's step) rewrites the file without it.
  logger = metrics.MetricsLogger(str(tmp_path))
  logger.truncate_after(2)
  logger.write(3, {'loss': 1.5})
  logger.close()
  assert open(logger.path, 'rb').read() == full
  # A malformed line that is not a torn tail is still an error naming the line.
  open(logger.path, 'wb').write(torn + b'\n')
  with pytest.raises(ValueError, match=':3: malformed metrics record'):
    metrics.read_metrics(logger.path)


def test_audits_jsonl_nested_records_truncated_and_torn(tmp_path):
  """AC2's audits.jsonl: nested numpy numbers written as JSON numbers (NaN as null); a resume drops
  the records past its checkpoint and a torn tail, as for metrics.jsonl."""
  log = metrics.StepLog(str(tmp_path / metrics.AUDITS_FILE))
  groups = [{'rewards': np.array([0.5, 1.0], np.float32), 'chunk_end_value': [np.float64('nan')],
             'chunk_end_read': [np.bool_(True)], 'cut': np.int64(16)}]
  for step in range(1, 4):
    log.write(step, {'groups': groups if step == 2 else []})
  with open(log.path, 'ab') as f:
    f.write(b'{"step": 4, "gro')  # killed while appending step 4
  assert metrics.read_metrics(log.path)[1] == {
      'step': 2, 'groups': [{'rewards': [0.5, 1.0], 'chunk_end_value': [None],
                             'chunk_end_read': [True], 'cut': 16}]}
  log.truncate_after(2)
  assert [r['step'] for r in metrics.read_metrics(log.path)] == [1, 2]
  assert open(log.path).read().endswith('\n')
  metrics.StepLog(str(tmp_path / 'off.jsonl'), enabled=False).write(1, {'groups': []})
  assert not (tmp_path / 'off.jsonl').exists()


def test_plots_written(tmp_path):
  logger = metrics.MetricsLogger(str(tmp_path))
  for step in range(1, 4):
    logger.write(step, {'decoding_flops_cum': 1e9 * step, 'val/mean_score': 0.1 * step,
                        'ready_fraction': 0.2, 'critic_error': 0.3})
  logger.close()
  paths = plots.plot_run(str(tmp_path))
  assert len(paths) == 4
  for path in paths:
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_orbax_checkpoint_round_trip(tmp_path):
  params = {'w': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones((3,), jnp.bfloat16)}
  opt_state = optax.adamw(1e-3).init(params)
  state = {'params': params, 'opt': opt_state}
  host = {'controller': {'buffer': [[1, 2, 3]], 'k': 0.06}, 'rng': [1, 2]}
  ckpt = checkpointing.Checkpointer(str(tmp_path / 'ckpt'), keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, state, {**host, 'step': step})
  assert ckpt.latest_step() == 3
  assert sorted(int(d) for d in os.listdir(tmp_path / 'ckpt') if d.isdigit()) == [2, 3]
  abstract = jax.tree.map(jnp.zeros_like, state)
  step, restored, restored_host = checkpointing.Checkpointer(str(tmp_path / 'ckpt')).restore(abstract)
  assert step == 3 and restored_host['step'] == 3
  assert restored_host['controller'] == host['controller']
  chex_equal = jax.tree.map(lambda a, b: bool(jnp.all(a == b)), restored, state)
  assert all(jax.tree.leaves(chex_equal))
  assert jax.tree.structure(restored) == jax.tree.structure(state)


def test_missing_checkpoint_is_clear(tmp_path):
  with pytest.raises(FileNotFoundError, match='no checkpoint'):
    checkpointing.Checkpointer(str(tmp_path / 'empty')).restore({'a': jnp.zeros(2)})


def test_mechanism_summary_by_hand():
  from ac2_jax.train import metrics as metrics_lib
  records = [{'step': 0, 'val/mean_score': 0.3}]
  for step, ready, frac, routed, zero in [(1, 0, 0.0, 0, 0.5), (2, 3, 0.0, 0, None),
                                          (3, 5, 0.5, 10, 0.0), (4, 6, 0.7, 30, 0.25)]:
    records.append({'step': step, 'num_ready_problems': ready, 'ready_fraction': frac,
                    'routed_to_critic': routed, 'rows_generated': 40,
                    'replay/zero_variance_groups': zero,
                    'replay/zero_variance_groups/ready_chunk': None if step < 3 else 1 - frac,
                    'critic_audit_corr': [float('nan'), None, 0.2, 0.4][step - 1],
                    'critic_trusted': float(step == 4),
                    'chunk_advantage_scale': [1.0, 1.0, 1.5, 2.5][step - 1]})
  out = metrics_lib.mechanism_summary(records)
  assert out == pytest.approx({
      'ready_problems': 6, 'first_ready_step': 2, 'ready_fraction_second_half': 0.6,
      'critic_scored_share': 40 / 160, 'zero_variance_groups': 0.25,
      'zero_variance_groups/ready_chunk': 0.4, 'critic_audit_corr': 0.3,
      'critic_trusted_share': 1 / 3, 'chunk_advantage_scale': 5 / 3})
  # A run without a critic (GRPO) has nothing to say.
  assert metrics_lib.mechanism_summary([{'step': 1, 'reward/judged_mean': 0.2}]) == {}
