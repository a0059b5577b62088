"""The sizes a run works at, derived from its config in one place (train/experiment.py).

A run measures its longest prompt; a dry run assumes one (dry_run.PROMPT_TOKENS). Everything else
follows from the config the same way for both.
"""

from __future__ import annotations

import dataclasses

from ac2_jax.learner import runtime


@dataclasses.dataclass(frozen=True)
class RunSizes:
  prompt_tokens: int            # longest prompt: measured in a run, assumed in a dry run
  response_budget: int          # prefix + new tokens of a response
  cut_grid: int
  max_cut: int                  # the largest cut position a replayed prefix can have
  critic_context: int           # critic prompt tokens
  rows_per_step: int            # sampled rows of one training step
  max_sample_batch: int         # rows per sampler device call
  actor_minibatches: int
  micro_batch: int              # actor.micro_batch (0: the whole minibatch at once)
  logits_chunk: int             # model.logits_chunk (0: every position at once)
  critic_pairs_per_update: int
  critic_reads_per_step: int    # at most (AC2); 0 without a critic

  @property
  def max_total_len(self) -> int:
    return runtime.max_total_len(self.prompt_tokens, self.response_budget, self.critic_context)

  @property
  def update_rows(self) -> int:
    """Rows of one gradient micro-batch, actor or critic."""
    minibatch = -(-self.rows_per_step // self.actor_minibatches)
    return self.micro_batch or max(minibatch, self.critic_pairs_per_update)
