"""Sampling: jitted prefill + decode loop that continues (replayed) prefixes for a chunk of tokens.

  generate(...)            -> SampleOutput   tokens, log-probs, entropies, stop reasons per request
  greedy_decode(...)       -> list of arrays  short greedy decode for critic reads
  token_distribution(...)  -> [N, M] probs    one-forward readout over given value tokens
  token_distributions_at(...)                 the same at several positions of each context
  sampling_log_probs(...)                     the sampling distribution, for teacher-forced checks
"""

from ac2_jax.sampling.critic_reads import (MAX_VALUE_TOKENS, READ_ROWS, greedy_decode,
                                          token_distribution, token_distributions_at)
from ac2_jax.sampling.decode import trace_count
from ac2_jax.sampling.distribution import entropy, sampling_log_probs
from ac2_jax.sampling.sampler import generate
from ac2_jax.sampling.requests import (STOP_BUDGET, STOP_CHUNK_CAP, STOP_EOS, SampleOutput,
                                       bucket, train_bucket)
from ac2_jax.sampling.settings import SamplingSettings

__all__ = ['MAX_VALUE_TOKENS', 'READ_ROWS', 'STOP_BUDGET', 'STOP_CHUNK_CAP', 'STOP_EOS',
           'SampleOutput', 'SamplingSettings', 'bucket', 'entropy', 'generate', 'greedy_decode',
           'sampling_log_probs', 'token_distribution', 'token_distributions_at',
           'trace_count', 'train_bucket']
