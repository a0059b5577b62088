"""Hugging Face Qwen3 checkpoints (config.json + safetensors) <-> the decoder's parameter pytree.

Layout differences (HF stores torch `Linear.weight` as [out, in]):
  q/k/v_proj.weight [N*D, E]   -> self_attn/{q,k,v}_proj/kernel [E, N, D]
  o_proj.weight     [E, H*D]   -> self_attn/o_proj/kernel       [H, D, E]
  mlp and lm_head   [out, in]  -> kernel [in, out]
  embeddings and norm weights are stored as they are.

Loading reads one tensor at a time on the host, converts it, and places it straight onto its
devices (with a mesh: `jax.make_array_from_callback` with the partition rules' NamedSharding, so
each device receives only its shard and no device ever holds the whole tree).

Every error names the file it is about: a truncated safetensors file or one with a bad header, a
malformed config.json or index, a missing or misshapen tensor. `check_vocabulary` is the check a
launcher makes once the tokenizer is known: the embedding must have a row for every token id (it
may have more: official Qwen3 checkpoints pad 151,669 ids to 151,936 rows, and the sampler and
the learner mask the extra rows out, see `SamplingSettings.valid_vocab_size` and
`UpdateSettings.valid_vocab_size`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Optional

import jax
import ml_dtypes
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ac2_jax import sharding as sharding_lib
from ac2_jax.models import qwen3
from ac2_jax.models.config import ModelConfig

SINGLE_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'
# Hugging Face's default shard size for save_pretrained.
DEFAULT_MAX_SHARD_BYTES = 5_000_000_000

_NP_DTYPES = {'float32': np.dtype(np.float32), 'bfloat16': np.dtype(ml_dtypes.bfloat16)}
# Non-parameter buffers some exporters write; they carry nothing the decoder needs.
_IGNORED = re.compile(r'(^|\.)rotary_emb\.inv_freq$')


def _layout(path: str):
  """(HF tensor name, HF -> ours, ours -> HF) for one of our parameter paths."""
  m = re.fullmatch(r'layers_(\d+)/(.+)', path)
  if path == 'embed_tokens/embedding':
    return 'model.embed_tokens.weight', _same, _same
  if path == 'norm/scale':
    return 'model.norm.weight', _same, _same
  if path == 'lm_head/kernel':
    return 'lm_head.weight', _transpose, _transpose
  if m is None:
    raise ValueError(f'parameter {path} has no Hugging Face counterpart')
  prefix, rest = f'model.layers.{m.group(1)}.', m.group(2)
  module, leaf = rest.rsplit('/', 1)
  name = prefix + module.replace('/', '.') + '.weight'
  if leaf == 'scale':
    return name, _same, _same
  if re.fullmatch(r'self_attn/[qkv]_proj', module):
    # ours [E, N, D] <-> HF [N*D, E]
    return name, _transpose_to, _from_heads_in
  if module == 'self_attn/o_proj':
    # ours [H, D, E] <-> HF [E, H*D]
    return name, _transpose_to, _from_heads_out
  if module.startswith('mlp/'):
    return name, _transpose, _transpose
  raise ValueError(f'parameter {path} has no Hugging Face counterpart')


def _same(x, shape=None):
  return x


def _transpose(x, shape=None):
  return x.T


def _transpose_to(w, shape):
  return w.T.reshape(shape)


def _from_heads_in(k, shape=None):
  return k.reshape(k.shape[0], -1).T


def _from_heads_out(k, shape=None):
  return k.reshape(-1, k.shape[-1]).T


def _hf_shape(ours_to_hf, shape) -> tuple:
  # A zero-stride view: the layout functions only reshape/transpose, so nothing is allocated.
  return ours_to_hf(np.broadcast_to(np.zeros((), np.int8), shape)).shape


def _read_json(file: str, what: str) -> dict:
  """A JSON object from `file`; errors name the file."""
  try:
    with open(file, encoding='utf-8') as f:
      value = json.load(f)
  except FileNotFoundError:
    raise FileNotFoundError(f'{file}: no such file (the checkpoint\'s {what})') from None
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f'{file}: malformed {what}: {e}') from None
  if not isinstance(value, dict):
    raise ValueError(f'{file}: malformed {what}: a JSON {type(value).__name__}, not an object')
  return value


def _open_safetensors(file: str):
  """`safe_open(file)`, with an error naming the file when it is truncated or has a bad header."""
  try:
    return safe_open(file, framework='numpy')
  except (SafetensorError, OSError) as e:
    raise ValueError(f'{file}: not a readable safetensors file ({e}); is it truncated or '
                     'corrupt?') from None


def _tensor_files(path: str) -> dict:
  """Maps every tensor name in the checkpoint directory to its safetensors file."""
  single = os.path.join(path, SINGLE_FILE)
  index = os.path.join(path, INDEX_FILE)
  if os.path.exists(single):
    with _open_safetensors(single) as f:
      return {name: single for name in f.keys()}
  if not os.path.exists(index):
    raise ValueError(f'{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found')
  weight_map = _read_json(index, 'safetensors index').get('weight_map')
  if not isinstance(weight_map, dict):
    raise ValueError(f'{index}: no "weight_map" object')
  files = {}
  for name, file in weight_map.items():
    full = os.path.join(path, file)
    if not os.path.exists(full):
      raise ValueError(f'{index}: tensor {name} is mapped to missing file {file}')
    files[name] = full
  return files


class _Reader:
  """Reads single tensors, keeping each safetensors file open once."""

  def __init__(self, files: dict):
    self._files = files
    self._handles = {}
    self._names = {}  # file -> the tensor names it holds

  def shape(self, name):
    return tuple(self._handle(name).get_slice(name).get_shape())

  def dtype(self, name):
    return self._handle(name).get_slice(name).get_dtype()

  def read(self, name) -> np.ndarray:
    handle = self._handle(name)
    try:
      return handle.get_tensor(name)
    except (SafetensorError, OSError) as e:
      raise ValueError(f'{self._files[name]}: cannot read tensor {name} ({e})') from None

  def _handle(self, name):
    file = self._files[name]
    if file not in self._handles:
      handle = _open_safetensors(file)
      self._handles[file] = handle
      self._names[file] = set(handle.keys())
    if name not in self._names[file]:
      raise ValueError(f'{file}: no tensor {name}, though the index maps it to this file')
    return self._handles[file]

  def close(self):
    for h in self._handles.values():
      h.__exit__(None, None, None)


def _checkpoint_dtype(hf: dict, reader: _Reader, files: dict) -> str:
  declared = hf.get('torch_dtype', hf.get('dtype'))
  if declared is None and 'model.embed_tokens.weight' in files:
    declared = {'F32': 'float32'}.get(reader.dtype('model.embed_tokens.weight'), 'bfloat16')
  return 'float32' if declared == 'float32' else 'bfloat16'


def load_hf_checkpoint(path: str, mesh: Optional[Mesh] = None, dtype: Optional[str] = None,
                       **config_overrides):
  """Reads a Hugging Face Qwen3 checkpoint directory into (ModelConfig, params).

  Args:
    path: directory with config.json and model.safetensors, or sharded
      model-0000i-of-0000n.safetensors files with model.safetensors.index.json.
    mesh: when given, each array is placed with its partition-rule sharding (`ac2_jax.sharding`);
      otherwise on the default device.
    dtype: 'float32' or 'bfloat16' for parameters and compute; default: the checkpoint's dtype
      (float16 checkpoints load as bfloat16).
    **config_overrides: further ModelConfig fields (e.g. remat=True, attention_impl='pallas').

  Raises:
    ValueError naming the tensor when one is missing, has the wrong shape, or is not expected.
  """
  config_file = os.path.join(path, 'config.json')
  hf = _read_json(config_file, 'config.json')
  files = _tensor_files(path)
  reader = _Reader(files)
  try:
    dtype = dtype or _checkpoint_dtype(hf, reader, files)
    try:
      config = ModelConfig.from_hf_dict(hf, param_dtype=dtype, dtype=dtype, **config_overrides)
    except (KeyError, TypeError, ValueError) as e:
      reason = str(e).strip('"').removeprefix('config.json: ')
      raise ValueError(f'{config_file}: {reason}') from None
    np_dtype = _NP_DTYPES[config.param_dtype]
    shapes = jax.eval_shape(lambda: qwen3.init_params(config, jax.random.key(0)))
    shardings = None if mesh is None else sharding_lib.param_shardings(shapes, mesh)

    expected = set()

    def load(key_path, leaf):
      path_s = sharding_lib.path_str(key_path)
      name, to_ours, to_hf = _layout(path_s)
      expected.add(name)
      if name not in files:
        raise ValueError(f'checkpoint {path}: missing tensor {name} (for parameter {path_s})')
      want = _hf_shape(to_hf, leaf.shape)
      got = reader.shape(name)
      if got != want:
        raise ValueError(f'checkpoint {path}: tensor {name} has shape {got}, expected {want} '
                         f'for config {config}')
      host = np.ascontiguousarray(to_ours(reader.read(name), leaf.shape).astype(np_dtype))
      if mesh is None:
        return jax.device_put(host)
      sharding = _leaf_at(shardings, key_path)
      return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    params = jax.tree_util.tree_map_with_path(load, shapes)
    unexpected = sorted(n for n in files if n not in expected and not _IGNORED.search(n))
    if config.tie_embeddings and 'lm_head.weight' in unexpected:
      # Some tied checkpoints (e.g. Qwen3-0.6B) also store the shared matrix as lm_head.weight.
      if not np.array_equal(reader.read('lm_head.weight'),
                            reader.read('model.embed_tokens.weight')):
        raise ValueError(f'checkpoint {path}: tie_word_embeddings is true but tensor '
                         'lm_head.weight differs from model.embed_tokens.weight')
      unexpected.remove('lm_head.weight')
    if unexpected:
      raise ValueError(f'checkpoint {path}: unexpected tensors {unexpected}')
  finally:
    reader.close()
  return config, params


def check_vocabulary(config: ModelConfig, tokenizer_vocab_size: int, where: str = '') -> None:
  """Raises unless the model has a row for every token id of the tokenizer.

  More rows than ids is fine (checkpoints pad the embedding to a round size; pass the tokenizer's
  size as `SamplingSettings.valid_vocab_size` and `UpdateSettings.valid_vocab_size`, so that the
  sampler never draws the padding ids and the learner never normalises over them). Fewer rows
  would make the embedding lookup and the logits of the top ids silently wrong.
  """
  where = f'{where}: ' if where else ''
  if int(tokenizer_vocab_size) < 1:
    raise ValueError(f'{where}tokenizer vocabulary size must be >= 1, got {tokenizer_vocab_size}')
  if config.vocab_size < tokenizer_vocab_size:
    raise ValueError(
        f'{where}the model has {config.vocab_size} vocabulary rows but the tokenizer has '
        f'{tokenizer_vocab_size} ids; ids >= {config.vocab_size} have no embedding. Use the '
        'tokenizer that came with the checkpoint.')


def _leaf_at(tree, key_path):
  for key in key_path:
    tree = tree[key.key]
  return tree


def _to_host(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(x)


def save_hf_checkpoint(config: ModelConfig, params, path: str,
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
  """Writes config.json and safetensors in Hugging Face Qwen3 layout to directory `path`.

  One file when everything fits in `max_shard_bytes`, else model-0000i-of-0000n.safetensors plus
  model.safetensors.index.json. Arrays sharded across hosts are gathered; only process 0 writes.
  """
  if max_shard_bytes <= 0:
    raise ValueError(f'max_shard_bytes must be positive, got {max_shard_bytes}')
  shapes = jax.eval_shape(lambda: qwen3.init_params(config, jax.random.key(0)))
  want = {sharding_lib.path_str(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(shapes)}
  have = {sharding_lib.path_str(k): v for k, v in jax.tree_util.tree_leaves_with_path(params)}
  for p in sorted(set(want) ^ set(have)):
    raise ValueError(f'save_hf_checkpoint: parameter {p} is '
                     f'{"missing from params" if p in want else "not part of the config"}')
  for p, shape in want.items():
    if tuple(have[p].shape) != tuple(shape):
      raise ValueError(f'save_hf_checkpoint: parameter {p} has shape {tuple(have[p].shape)}, '
                       f'config expects {tuple(shape)}')

  # Plan shards from shapes alone, then convert and write one shard at a time.
  np_dtype = _NP_DTYPES[config.param_dtype]
  plan, sizes = [[]], [0]
  for p in want:
    nbytes = int(np.prod(want[p])) * np_dtype.itemsize
    if plan[-1] and sizes[-1] + nbytes > max_shard_bytes:
      plan.append([])
      sizes.append(0)
    plan[-1].append(p)
    sizes[-1] += nbytes

  writer = jax.process_index() == 0
  if writer:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'config.json'), 'w') as f:
      json.dump(config.to_hf_dict(), f, indent=2)
  n = len(plan)
  weight_map = {}
  for i, shard in enumerate(plan):
    file = SINGLE_FILE if n == 1 else f'model-{i + 1:05d}-of-{n:05d}.safetensors'
    tensors = {}
    for p in shard:
      name, _, to_hf = _layout(p)
      tensors[name] = np.ascontiguousarray(to_hf(_to_host(have[p]).astype(np_dtype)))
      weight_map[name] = file
    if writer:
      save_file(tensors, os.path.join(path, file), metadata={'format': 'pt'})
  if writer and n > 1:
    with open(os.path.join(path, INDEX_FILE), 'w') as f:
      json.dump({'metadata': {'total_size': sum(sizes)}, 'weight_map': weight_map}, f, indent=2)
