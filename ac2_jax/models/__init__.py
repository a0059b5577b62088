"""Qwen3-architecture decoder: configs and presets, the Flax model, Hugging Face checkpoints."""

from ac2_jax.models.config import ModelConfig, get_config, PRESET_NAMES
from ac2_jax.models.qwen3 import forward, head_logits, init_cache, init_params, logits
from ac2_jax.models.checkpoint import check_vocabulary, load_hf_checkpoint, save_hf_checkpoint

__all__ = ['ModelConfig', 'get_config', 'PRESET_NAMES', 'forward', 'head_logits', 'init_cache',
           'init_params', 'logits', 'check_vocabulary', 'load_hf_checkpoint',
           'save_hf_checkpoint']
