"""Hugging Face Qwen3 checkpoints <-> parameter pytree (placeholder until the checkpoint work lands)."""


def load_hf_checkpoint(path, mesh=None):
  raise NotImplementedError('load_hf_checkpoint: being written')


def save_hf_checkpoint(config, params, path):
  raise NotImplementedError('save_hf_checkpoint: being written')
