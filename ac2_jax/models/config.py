"""Model configuration: one frozen dataclass for every Qwen3-architecture decoder, plus named presets.

The config is hashable so it can be a static argument of `jax.jit`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Dimensions and numerics of a Qwen3-architecture decoder.

  Field names follow the Hugging Face `config.json` of Qwen3 where one exists, so that
  `from_hf_dict`/`to_hf_dict` stay a plain rename.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = True
  max_position_embeddings: int = 40_960
  # 'float32' or 'bfloat16': storage of parameters, and dtype of the matmuls.
  param_dtype: str = 'float32'
  dtype: str = 'float32'
  # Recompute each block's activations in the backward pass (saves memory at long context).
  remat: bool = False
  # 'xla' (plain jnp attention) or 'pallas' (kernels/ flash + decode attention).
  attention_impl: Literal['xla', 'pallas'] = 'xla'
  # Pallas kernels run through the interpreter (CPU tests) when True.
  pallas_interpret: bool = False
  # Which Pallas kernels: 'tpu' (Mosaic), 'gpu' (Triton) or None (the running backend's). An
  # explicit one exports for that platform from any machine, or (with pallas_interpret) runs
  # the TPU kernels on CPU in TPU interpret mode.
  pallas_backend: Literal['gpu', 'tpu'] | None = None

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f'num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}')
    if self.attention_impl not in ('xla', 'pallas'):
      raise ValueError(f"attention_impl must be 'xla' or 'pallas', got {self.attention_impl!r}")
    if self.pallas_backend not in (None, 'gpu', 'tpu'):
      raise ValueError(f"pallas_backend must be 'gpu', 'tpu' or None, got {self.pallas_backend!r}")
    for name in ('param_dtype', 'dtype'):
      if getattr(self, name) not in ('float32', 'bfloat16'):
        raise ValueError(f"{name} must be 'float32' or 'bfloat16', got {getattr(self, name)!r}")

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def jnp_param_dtype(self):
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes) -> 'ModelConfig':
    return dataclasses.replace(self, **changes)

  def to_hf_dict(self) -> dict:
    """The fields of a Hugging Face Qwen3 `config.json`."""
    return {
        'architectures': ['Qwen3ForCausalLM'],
        'model_type': 'qwen3',
        'vocab_size': self.vocab_size,
        'hidden_size': self.hidden_size,
        'intermediate_size': self.intermediate_size,
        'num_hidden_layers': self.num_layers,
        'num_attention_heads': self.num_heads,
        'num_key_value_heads': self.num_kv_heads,
        'head_dim': self.head_dim,
        'rope_theta': self.rope_theta,
        'rms_norm_eps': self.rms_norm_eps,
        'tie_word_embeddings': self.tie_embeddings,
        'max_position_embeddings': self.max_position_embeddings,
        'hidden_act': 'silu',
        'attention_bias': False,
        'torch_dtype': self.param_dtype,
    }

  @classmethod
  def from_hf_dict(cls, hf: dict, **overrides) -> 'ModelConfig':
    """Reads a Hugging Face Qwen3 `config.json` dict; unsupported features are errors."""
    if hf.get('model_type', 'qwen3') != 'qwen3':
      raise ValueError(f"config.json: model_type {hf.get('model_type')!r} is not 'qwen3'")
    if hf.get('attention_bias', False):
      raise ValueError('config.json: attention_bias=True is not supported by the Qwen3 decoder')
    if hf.get('hidden_act', 'silu') != 'silu':
      raise ValueError(f"config.json: hidden_act {hf.get('hidden_act')!r} is not 'silu'")
    if hf.get('rope_scaling'):
      raise ValueError(f"config.json: rope_scaling {hf['rope_scaling']!r} is not supported")
    # transformers >= 5 writes rope settings as `rope_parameters`; older files use `rope_theta`.
    rope = hf.get('rope_parameters') or {}
    if rope.get('rope_type', 'default') != 'default':
      raise ValueError(f"config.json: rope_parameters {rope!r} is not supported (only 'default')")
    if hf.get('use_sliding_window', False):
      raise ValueError('config.json: use_sliding_window=True is not supported')
    required = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
                'num_attention_heads', 'num_key_value_heads')
    missing = [k for k in required if k not in hf]
    if missing:
      raise ValueError(f'config.json: missing keys {missing}')
    kwargs = dict(
        vocab_size=hf['vocab_size'],
        hidden_size=hf['hidden_size'],
        intermediate_size=hf['intermediate_size'],
        num_layers=hf['num_hidden_layers'],
        num_heads=hf['num_attention_heads'],
        num_kv_heads=hf['num_key_value_heads'],
        head_dim=hf.get('head_dim', hf['hidden_size'] // hf['num_attention_heads']),
        rope_theta=float(rope.get('rope_theta', hf.get('rope_theta', 1_000_000.0))),
        rms_norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
        tie_embeddings=bool(hf.get('tie_word_embeddings', True)),
        max_position_embeddings=int(hf.get('max_position_embeddings', 40_960)),
    )
    kwargs.update(overrides)
    return cls(**kwargs)


# CPU tests: about 1.2M parameters. Untied so the separate lm_head path is exercised.
_TINY = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=512, num_layers=4,
                    num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10_000.0,
                    tie_embeddings=False, max_position_embeddings=4096)
# The qwen3_* entries: dimensions of the official Qwen3 configs (Hugging Face Qwen/Qwen3-*/config.json).
_PRESETS = {
    'tiny': _TINY,
    # The critic's capacity lever (issue 15): `tiny` twice as deep, about 2.1M parameters.
    'tiny_deep': _TINY.replace(num_layers=8),
    # CPU benchmarks: about 29M parameters.
    'small': ModelConfig(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=8,
                         num_heads=8, num_kv_heads=4, head_dim=64, rope_theta=10_000.0,
                         tie_embeddings=True, max_position_embeddings=8192),
    'qwen3_0_6b': ModelConfig(vocab_size=151_936, hidden_size=1024, intermediate_size=3072,
                              num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                              tie_embeddings=True, param_dtype='bfloat16', dtype='bfloat16'),
    'qwen3_1_7b': ModelConfig(vocab_size=151_936, hidden_size=2048, intermediate_size=6144,
                              num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                              tie_embeddings=True, param_dtype='bfloat16', dtype='bfloat16'),
    'qwen3_4b': ModelConfig(vocab_size=151_936, hidden_size=2560, intermediate_size=9728,
                            num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                            tie_embeddings=True, param_dtype='bfloat16', dtype='bfloat16'),
}

PRESET_NAMES = tuple(_PRESETS)


def get_config(name: str, **overrides) -> ModelConfig:
  """Returns the preset `name` ('tiny', 'tiny_deep', 'small', 'qwen3_0_6b', 'qwen3_1_7b',
  'qwen3_4b')."""
  if name not in _PRESETS:
    raise ValueError(f'unknown model preset {name!r}; known: {", ".join(PRESET_NAMES)}')
  return _PRESETS[name].replace(**overrides) if overrides else _PRESETS[name]
