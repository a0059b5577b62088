"""Regenerates tests/fixtures/qwen3_tiny/: random tiny Qwen3 checkpoints with reference logits.

Needs torch and transformers (not dependencies of ac2_jax; the tests read the fixture without them):

  pip install torch==2.13.0 transformers
  python scripts/make_hf_fixture.py [--out tests/fixtures/qwen3_tiny]

Writes two checkpoints built with transformers' Qwen3ForCausalLM (fp32, eager attention):
  OUT/          the `tiny` preset's dimensions, untied lm_head, one model.safetensors
  OUT/tied/     a smaller tied-embedding model, saved in several shards with an index
each with `reference.npz`: tokens_BxT (int32), lengths_B (int32; the batch is right-padded) and
logits_BxTxV (float32; rows are only meaningful at t < lengths_B[b]).
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
import transformers

# Dimensions of ac2_jax's 'tiny' preset (ac2_jax/models/config.py), restated so the script does not
# depend on the package it checks.
TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=10_000.0,
            max_position_embeddings=4096, tie_word_embeddings=False)
TIED = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, rope_theta=1_000_000.0,
            max_position_embeddings=1024, tie_word_embeddings=True)


def build(dims: dict, seed: int) -> transformers.Qwen3ForCausalLM:
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(rms_norm_eps=1e-6, attention_bias=False, hidden_act='silu',
                                    initializer_range=0.02, **dims)
  config._attn_implementation = 'eager'
  model = transformers.Qwen3ForCausalLM(config).to(torch.float32).eval()
  # Random init leaves every RMSNorm at 1; perturb them so a wrong norm mapping shows up.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('norm.weight'):
        p.add_(0.1 * torch.randn_like(p))
  return model


def reference(model, vocab: int, seed: int, batch: int, length: int, lengths: list) -> dict:
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, size=(batch, length)).astype(np.int32)
  lengths = np.asarray(lengths, np.int32)
  mask = np.arange(length)[None, :] < lengths[:, None]
  tokens = np.where(mask, tokens, 0).astype(np.int32)  # pad id 0 after each row's end
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(tokens).long(),
                attention_mask=torch.from_numpy(mask.astype(np.int64)))
  return {'tokens_BxT': tokens, 'lengths_B': lengths,
          'logits_BxTxV': out.logits.float().numpy().astype(np.float32)}


def write(model, out: str, ref: dict, max_shard_size=None):
  if os.path.exists(out):
    for entry in os.listdir(out):
      full = os.path.join(out, entry)
      if os.path.isfile(full):
        os.remove(full)
  os.makedirs(out, exist_ok=True)
  kwargs = {'max_shard_size': max_shard_size} if max_shard_size else {}
  model.save_pretrained(out, safe_serialization=True, **kwargs)
  gen = os.path.join(out, 'generation_config.json')
  if os.path.exists(gen):
    os.remove(gen)
  np.savez_compressed(os.path.join(out, 'reference.npz'), **ref)
  with open(os.path.join(out, 'config.json')) as f:
    print(out, sorted(os.listdir(out)), 'tie:', json.load(f)['tie_word_embeddings'])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), '..', 'tests',
                                                    'fixtures', 'qwen3_tiny'))
  args = parser.parse_args()
  out = os.path.normpath(args.out)

  tiny = build(TINY, seed=0)
  write(tiny, out, reference(tiny, TINY['vocab_size'], seed=1, batch=3, length=16,
                             lengths=[16, 11, 5]))
  tied = build(TIED, seed=2)
  shutil.rmtree(os.path.join(out, 'tied'), ignore_errors=True)
  write(tied, os.path.join(out, 'tied'),
        reference(tied, TIED['vocab_size'], seed=3, batch=2, length=12, lengths=[9, 12]),
        max_shard_size='150KB')


if __name__ == '__main__':
  main()
