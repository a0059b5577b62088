"""Worker process of `bench.py sampler` for Hugging Face transformers `generate`: see spawn.py.

  python -m ac2_jax.bench.sampler_hf '{"task": "throughput", ...}' RESULT.json

The same tasks as `sampler_jax` (logits, throughput) on the same exported checkpoint, with
`Qwen3ForCausalLM` in float32 on the CPU, at the faster of the given torch thread counts: on a
machine shared with other jobs, torch's OpenMP threads wait for each other at every small matmul
(measured on 2 busy cores: one thread decoded 1.8x faster than two, and two with the default
OpenMP wait policy 10x slower still), so the driver runs this worker with OMP_WAIT_POLICY=PASSIVE
and lets it choose the thread count by a warm-up call at each. torch and transformers are
imported inside the tasks: ac2_jax itself never needs them, only this worker does.
"""

from __future__ import annotations

import numpy as np

from ac2_jax.bench import spawn, stopwatch


def _model(checkpoint: str):
  import torch
  import transformers
  model = transformers.Qwen3ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
  return model.eval()


def logits(checkpoint: str, prompts: str, new_tokens: int, out: str) -> dict:
  import torch
  model = _model(checkpoint)
  with torch.inference_mode():
    logits_NxPxV = model(input_ids=torch.from_numpy(np.load(prompts).astype(np.int64))).logits
  np.save(out, logits_NxPxV[:, -1].float().numpy())
  return {'path': out}


def throughput(checkpoint: str, prompts: str, batches: list[int], new_tokens: int,
               temperature: float, repeats: int, threads: list[int]) -> dict:
  """Per batch size: a warm-up call at each torch thread count, then `repeats` timed `generate`
  calls at the faster, sampling at `temperature` with no top-k/top-p cut and no stop token
  (min_new_tokens), so every row draws `new_tokens`."""
  import torch
  import transformers
  model = _model(checkpoint)
  prompts_NxP = np.load(prompts).astype(np.int64)
  runs = {}
  for batch in batches:
    ids = torch.from_numpy(prompts_NxP[:batch])

    def call():
      out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                           temperature=temperature, top_k=0, top_p=1.0,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
                           eos_token_id=None)
      assert out.shape == (batch, ids.shape[1] + new_tokens), out.shape

    with torch.inference_mode():
      # Each thread count's warm-up call picks the faster; only that one is timed.
      warmups = {}
      for n in threads:
        torch.set_num_threads(n)
        warmups[n], _ = stopwatch.median_seconds(call, 1)
      best = min(warmups, key=warmups.get)
      torch.set_num_threads(best)
      median, seconds = stopwatch.median_seconds(call, repeats)
    runs[str(batch)] = {'median': median, 'seconds': seconds, 'warmup': warmups[best],
                        'threads': best, 'warmups': {str(n): w for n, w in warmups.items()}}
  return {'engine': f'transformers {transformers.__version__} generate (torch {torch.__version__})',
          'runs': runs}


if __name__ == '__main__':
  spawn.serve({'logits': logits, 'throughput': throughput})
