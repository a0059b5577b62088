"""HF checkpoint import/export: parity with transformers, round trips, sharded files, errors.

The fixture (tests/fixtures/qwen3_tiny, made by scripts/make_hf_fixture.py with transformers) holds
random Qwen3 checkpoints and the logits transformers computed; nothing here imports torch.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from ac2_jax import sharding
from ac2_jax.models import (check_vocabulary, get_config, load_hf_checkpoint, logits,
                            save_hf_checkpoint)

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'qwen3_tiny')
TIED = os.path.join(FIXTURE, 'tied')


def _hf_tensors(path):
  """All tensors of a checkpoint directory, by HF name."""
  out = {}
  for file in sorted(os.listdir(path)):
    if file.endswith('.safetensors'):
      out.update(load_file(os.path.join(path, file)))
  return out


def _assert_parity(path):
  config, params = load_hf_checkpoint(path)
  ref = np.load(os.path.join(path, 'reference.npz'))
  out_BxTxV = np.asarray(logits(config, params, jnp.asarray(ref['tokens_BxT']),
                                jnp.asarray(ref['lengths_B'])))
  valid_BxT = np.arange(out_BxTxV.shape[1])[None, :] < ref['lengths_B'][:, None]
  assert out_BxTxV.dtype == np.float32
  np.testing.assert_allclose(out_BxTxV[valid_BxT], ref['logits_BxTxV'][valid_BxT], atol=1e-4,
                             rtol=0)
  return config, params


def test_parity_with_transformers_tiny_untied():
  config, params = _assert_parity(FIXTURE)
  # The fixture is the `tiny` preset, so tests elsewhere can rely on its dimensions.
  assert config == get_config('tiny')
  assert 'lm_head' in params


def test_parity_with_transformers_tied_sharded_index():
  assert os.path.exists(os.path.join(TIED, 'model.safetensors.index.json'))
  config, params = _assert_parity(TIED)
  assert config.tie_embeddings and 'lm_head' not in params
  assert config.rope_theta == 1_000_000.0 and config.num_kv_heads == 1


@pytest.mark.parametrize('max_shard_bytes', [10**12, 600_000])
def test_save_round_trip_reproduces_hf_files(tmp_path, max_shard_bytes):
  config, params = load_hf_checkpoint(FIXTURE)
  out = str(tmp_path / 'ckpt')
  save_hf_checkpoint(config, params, out, max_shard_bytes=max_shard_bytes)
  files = sorted(f for f in os.listdir(out) if f.endswith('.safetensors'))
  if max_shard_bytes > 10**9:
    assert files == ['model.safetensors']
    assert not os.path.exists(os.path.join(out, 'model.safetensors.index.json'))
  else:
    assert len(files) > 3 and files[0] == f'model-00001-of-{len(files):05d}.safetensors'
    with open(os.path.join(out, 'model.safetensors.index.json')) as f:
      index = json.load(f)
    assert set(index['weight_map'].values()) == set(files)
    for file in files:
      assert os.path.getsize(os.path.join(out, file)) <= max_shard_bytes + 4096
  # Every tensor is written back exactly as transformers stored it (layout and name).
  original, written = _hf_tensors(FIXTURE), _hf_tensors(out)
  assert set(written) == set(original)
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  config2, params2 = load_hf_checkpoint(out)
  assert config2 == config
  jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


def test_bfloat16_load_and_save(tmp_path):
  config, params = load_hf_checkpoint(TIED, dtype='bfloat16')
  assert config.param_dtype == config.dtype == 'bfloat16'
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(params))
  out = str(tmp_path / 'bf16')
  save_hf_checkpoint(config, params, out)
  with open(os.path.join(out, 'config.json')) as f:
    assert json.load(f)['torch_dtype'] == 'bfloat16'
  with safe_open(os.path.join(out, 'model.safetensors'), framework='numpy') as f:
    assert f.get_slice('model.norm.weight').get_dtype() == 'BF16'
  # With no dtype requested, the checkpoint's own dtype is kept.
  config2, params2 = load_hf_checkpoint(out)
  assert config2.param_dtype == 'bfloat16'
  jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)
  ref = np.load(os.path.join(TIED, 'reference.npz'))
  out_BxTxV = logits(config2, params2, jnp.asarray(ref['tokens_BxT'][:1, :9]))
  np.testing.assert_allclose(out_BxTxV, ref['logits_BxTxV'][:1, :9], atol=0.1)


def test_load_onto_mesh_places_each_array_with_its_sharding(tmp_path):
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  config, sharded = load_hf_checkpoint(FIXTURE, mesh=mesh)
  _, plain = load_hf_checkpoint(FIXTURE)
  expected = sharding.param_partition_specs(plain, mesh)
  q = sharded['layers_1']['self_attn']['q_proj']['kernel']
  assert q.sharding.spec == P('fsdp', 'tensor', None)
  # [E=128, H=4, D=32] split 2 ways over fsdp and tensor: each device holds a quarter.
  assert q.addressable_shards[0].data.shape == (64, 2, 32)
  assert sharded['embed_tokens']['embedding'].sharding.spec == P('tensor', 'fsdp')
  jax.tree_util.tree_map(lambda a, s: a.sharding.spec == s or pytest.fail(f'{a.sharding} != {s}'),
                         sharded, expected, is_leaf=lambda x: isinstance(x, P))
  jax.tree_util.tree_map(np.testing.assert_array_equal, sharded, plain)
  # Sharded arrays are gathered on save.
  save_hf_checkpoint(config, sharded, str(tmp_path / 'from_mesh'))
  original, written = _hf_tensors(FIXTURE), _hf_tensors(str(tmp_path / 'from_mesh'))
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


def _single_file_tied(tmp_path):
  """The tied fixture re-saved as one model.safetensors, for easy tensor surgery."""
  config, params = load_hf_checkpoint(TIED)
  path = str(tmp_path / 'tied_single')
  save_hf_checkpoint(config, params, path)
  return path, os.path.join(path, 'model.safetensors')


def test_missing_tensor_is_named(tmp_path):
  path, file = _single_file_tied(tmp_path)
  tensors = load_file(file)
  del tensors['model.layers.1.mlp.up_proj.weight']
  save_file(tensors, file)
  with pytest.raises(ValueError, match=r'missing tensor model\.layers\.1\.mlp\.up_proj\.weight'):
    load_hf_checkpoint(path)


def test_wrong_shape_is_named(tmp_path):
  path, file = _single_file_tied(tmp_path)
  tensors = load_file(file)
  tensors['model.layers.0.self_attn.k_proj.weight'] = np.zeros((32, 64), np.float32)
  save_file(tensors, file)
  with pytest.raises(ValueError, match=r'k_proj\.weight has shape \(32, 64\), expected \(16, 64\)'):
    load_hf_checkpoint(path)


def test_unexpected_tensor_is_named(tmp_path):
  path, file = _single_file_tied(tmp_path)
  tensors = load_file(file)
  tensors['model.layers.7.mlp.up_proj.weight'] = np.zeros((4,), np.float32)
  save_file(tensors, file)
  with pytest.raises(ValueError, match=r'unexpected tensors \[.model\.layers\.7\.mlp\.up_proj'):
    load_hf_checkpoint(path)


def test_tied_checkpoint_with_stored_lm_head(tmp_path):
  # Qwen3-0.6B stores the tied matrix twice; equal copies load, different ones are an error.
  path, file = _single_file_tied(tmp_path)
  tensors = load_file(file)
  tensors['lm_head.weight'] = tensors['model.embed_tokens.weight'].copy()
  save_file(tensors, file)
  config, params = load_hf_checkpoint(path)
  assert config.tie_embeddings and 'lm_head' not in params
  tensors['lm_head.weight'][0, 0] += 1.0
  save_file(tensors, file)
  with pytest.raises(ValueError, match='lm_head.weight differs'):
    load_hf_checkpoint(path)


def test_broken_directories(tmp_path):
  empty = tmp_path / 'empty'
  empty.mkdir()
  shutil.copy(os.path.join(FIXTURE, 'config.json'), empty / 'config.json')
  with pytest.raises(ValueError, match='neither model.safetensors nor'):
    load_hf_checkpoint(str(empty))
  path = _copy(TIED, tmp_path / 'tied')
  os.remove(os.path.join(path, 'model-00002-of-00003.safetensors'))
  with pytest.raises(ValueError, match='mapped to missing file model-00002-of-00003'):
    load_hf_checkpoint(path)


def _one_line(e) -> str:
  message = str(e.value)
  assert '\n' not in message, message
  return message


@pytest.mark.parametrize('damage', ['truncated', 'bad_header', 'empty', 'huge_header'])
def test_corrupt_safetensors_error_names_the_file(tmp_path, damage):
  single = _copy(FIXTURE, tmp_path / 'single')
  sharded = _copy(TIED, tmp_path / 'sharded')
  for file in (os.path.join(single, 'model.safetensors'),
               os.path.join(sharded, 'model-00002-of-00003.safetensors')):
    raw = open(file, 'rb').read()
    broken = {'truncated': raw[:len(raw) // 2],
              'bad_header': raw[:8] + b'{bad' + raw[12:],
              'empty': b'',
              'huge_header': (10 ** 12).to_bytes(8, 'little') + raw[8:]}[damage]
    open(file, 'wb').write(broken)
    with pytest.raises(ValueError) as e:
      load_hf_checkpoint(os.path.dirname(file))
    message = _one_line(e)
    assert message.startswith(f'{file}: not a readable safetensors file'), message


def test_index_naming_a_tensor_its_file_lacks(tmp_path):
  path = _copy(TIED, tmp_path / 'tied')
  index = os.path.join(path, 'model.safetensors.index.json')
  with open(index) as f:
    hf_index = json.load(f)
  name = 'model.layers.0.mlp.up_proj.weight'
  shard = hf_index['weight_map'][name]
  hf_index['weight_map'][name] = next(f for f in set(hf_index['weight_map'].values()) if f != shard)
  with open(index, 'w') as f:
    json.dump(hf_index, f)
  with pytest.raises(ValueError,
                     match=rf'-of-00003\.safetensors: no tensor {name}, though the index'):
    load_hf_checkpoint(path)


@pytest.mark.parametrize('which, text, reason', [
    ('config.json', '{"vocab_size": 256,', 'malformed config.json: Expecting'),
    ('config.json', '[1, 2]', 'malformed config.json: a JSON list, not an object'),
    ('config.json', b'{"a": "\xff"}', 'malformed config.json: '),
    ('config.json', '{"vocab_size": 256}', "missing keys ['hidden_size'"),
    ('model.safetensors.index.json', '{"weight_map": ', 'malformed safetensors index: '),
])
def test_malformed_json_error_names_the_file(tmp_path, which, text, reason):
  path = _copy(TIED, tmp_path / 'tied')
  mode = 'wb' if isinstance(text, bytes) else 'w'
  with open(os.path.join(path, which), mode) as f:
    f.write(text)
  with pytest.raises(ValueError) as e:
    load_hf_checkpoint(path)
  assert _one_line(e).startswith(f'{os.path.join(path, which)}: {reason}'), str(e.value)
  os.remove(os.path.join(path, which))
  with pytest.raises((FileNotFoundError, ValueError), match=path):
    load_hf_checkpoint(path)


def test_check_vocabulary():
  config = get_config('tiny')  # 512 rows
  check_vocabulary(config, 512)
  check_vocabulary(config, 300)  # a padded embedding is fine
  with pytest.raises(ValueError) as e:
    check_vocabulary(config, 600, where='/ckpt/qwen')
  assert _one_line(e).startswith('/ckpt/qwen: the model has 512 vocabulary rows but the '
                                 'tokenizer has 600 ids')
  with pytest.raises(ValueError, match='must be >= 1'):
    check_vocabulary(config, 0)


def test_save_rejects_params_not_matching_config(tmp_path):
  config, params = load_hf_checkpoint(TIED)
  with pytest.raises(ValueError, match=r'parameter lm_head/kernel is not part of the config'):
    save_hf_checkpoint(config, {**params, 'lm_head': {'kernel': np.zeros((64, 256))}},
                       str(tmp_path / 'x'))
  params['norm'] = {'scale': np.zeros((3,), np.float32)}
  with pytest.raises(ValueError, match=r'parameter norm/scale has shape \(3,\)'):
    save_hf_checkpoint(config, params, str(tmp_path / 'y'))


def test_unsupported_config_is_rejected(tmp_path):
  path = _copy(TIED, tmp_path / 'tied')
  with open(os.path.join(path, 'config.json')) as f:
    hf = json.load(f)
  hf['rope_parameters'] = {'rope_type': 'yarn', 'rope_theta': 1e6, 'factor': 4.0}
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf, f)
  with pytest.raises(ValueError, match='rope_parameters'):
    load_hf_checkpoint(path)


def test_bfloat16_tensor_values_survive(tmp_path):
  # bf16 on disk -> fp32 request: values are exact (bf16 is a subset of fp32).
  config, params = load_hf_checkpoint(TIED, dtype='bfloat16')
  path = str(tmp_path / 'bf16')
  save_hf_checkpoint(config, params, path)
  _, params32 = load_hf_checkpoint(path, dtype='float32')
  emb32 = np.asarray(params32['embed_tokens']['embedding'])
  assert emb32.dtype == np.float32
  np.testing.assert_array_equal(emb32.astype(ml_dtypes.bfloat16),
                                np.asarray(params['embed_tokens']['embedding']))
