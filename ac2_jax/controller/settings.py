"""Every knob and variant switch of the AC2 host controller, in one frozen dataclass.

Defaults are the paper's main run (AC2 paper, Table 4; ALGORITHMS.md, AC2 items 1-11). The
built-in CPU task scales the token counts (budget, chunk, cut grid) and the batch sizes down, never
the logic.

Variants of ALGORITHMS.md are switches here:
  no_audit            AC2 w/o audit (same as audit_fraction = 0).
  group_size_one      each ready, unaudited slot becomes g single continuations from distinct cuts;
                      targets = grid(v); rows whose prefix value V(s) is invalid are dropped.
  cut_before_uncredited  cuts end at or before a trajectory's first line without credit.
  chunk_through_uncredited  ready chunks from such cuts run at least through that line.
  cut_at_uncredited   cuts are that line's start itself, not a grid point below it.
  stale_buffer        every `stale_period` steps collect n_refill * stale_factor rollouts and make
                      them the whole replay buffer for the next `stale_period` steps; no refills in
                      between.
  correct_only        only passing rollouts (>= pass_points, complete answer) enter the buffer.
  chunk size          `with_chunk_size(b)` sets the chunk b and the cut grid together.
  no_local_readiness  every problem becomes ready once the global test passes.
  no_reference        the critic never sees a reference solution (the bank still gates readiness
                      condition (c): a solution was found).
  readiness_judged_only  readiness errors (global window and local) only from targets that the judge
                      valued whole (unready groups, audits); a departure from item 6, where a ready
                      group's target is the mean of the critic's own chunk-end values, so a critic that
                      answers one value validates itself (BENCHMARKS.md, session 10).
  critic_judged_only  the critic buffer takes only targets that the judge valued whole (unready
                      groups, audits); a departure from item 5, where a ready group's target, the
                      mean of the critic's own chunk-end values, also trains the critic: on one
                      seed a critic trained on them lost its ranking during RL (BENCHMARKS.md,
                      sessions 28-29).
  audit_scale         ready chunks' critic advantages are multiplied by the audits' slope of Monte
                      Carlo on critic advantages (audit_gate.py), in [1, audit_scale_max]; a
                      departure: a critic that ranks chunks can still move half as far as the
                      rewards (BENCHMARKS.md, session 29).
  readiness_revocable  an audit whose judged target the critic misses by tau_local or more makes
                      its problem unready again (it may become ready again by the usual test); a
                      departure from item 6 ("once ready, ready forever"), so that the audits
                      that measure a ready critic can also stop trusting a critic that has gone
                      stale while the policy moved on.
  audit_gate          ready chunks are critic-scored only while the audits' chunk advantages
                      correlate with their Monte Carlo ones (audit_gate.py); until then every ready
                      slot is audited; a departure: readiness tests accuracy only, which a critic
                      that answers one value per problem passes (BENCHMARKS.md, sessions 27-28).
"""

from __future__ import annotations

import dataclasses
import math

_SQRT2 = math.sqrt(2.0)


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
  """Settings of the AC2 controller; validated on construction."""

  # Sampling (AC2 items 1-2).
  group_size: int = 16              # g continuations per replay prefix
  audit_fraction: float = 0.25      # alpha: ceil(alpha * ready replay slots) get full rollouts
  n_batch: int = 192                # replay slots per step
  n_refill: int = 192               # fresh problems per step, one full rollout each
  buffer_capacity: int = 256        # replay buffer B, trajectories (FIFO)
  response_budget: int = 50_000     # prefix + new tokens
  chunk_size: int = 10_000          # b: new tokens of a ready chunk
  # Ready chunks are decoded in sampler calls of their own (`sampling.generate`'s short_cap): the
  # same tokens, in b decode steps instead of the step's longest continuation. A CPU's decode step
  # costs more with more rows, so it saves there; on an accelerator it adds b sequential steps.
  chunk_calls: bool = False
  cut_grid: int = 10_000            # cut positions are multiples of this
  max_cut_fraction: float = 0.9     # cut <= max_cut_fraction * L (and <= L - 1)
  # A departure, off in the paper: a cut of a stored trajectory also stays at or before its
  # `cut_end` (the task's `replay_cut_end`: under leading credit, the start of its first line
  # without credit), so no replayed prefix holds a mistake that fixes every continuation's value.
  # The algorithm fills cut_end only when this is on.
  cut_before_uncredited: bool = False
  # A departure, off in the paper: a ready chunk from a stored trajectory's prefix runs at least to
  # its `chunk_end` (the task's `replay_chunk_end`: just past the first line without credit, the
  # line its score turned on), so its end states differ where the reward does; chunk b is the
  # least. Needs cut_before_uncredited (the cut then stops at or before that line); the algorithm
  # fills chunk_end only when this is on.
  chunk_through_uncredited: bool = False
  # A departure, off in the paper: a replayed prefix ends exactly at its trajectory's cut_end
  # (the start of its first uncredited line, off the cut grid), not at a grid point drawn below
  # it, so every continuation's first new line is the one the stored response's score turned on
  # and none regenerates the right lines before it. Measured on one seed it unlearns the chains,
  # for AC2 and Prefix GRPO alike (0.356 -> 0.33 / 0.30 in 60 steps; BENCHMARKS.md, session 27).
  # Needs cut_before_uncredited; group-size-1 singles keep their distinct grid cuts.
  cut_at_uncredited: bool = False
  # Critic targets and buffer (items 5, 9); targets live on the critic's grid (critic/values.py).
  critic_buffer_capacity: int = 1_920
  critic_pairs_per_update: int = 768
  min_valid_per_target: int = 8
  # A departure, 0 (off) in the paper: per step, up to this many judged continuations that ran
  # past the chunk b add a critic record of their chunk-end state s . c[:b] to this step's critic
  # update, with their own grid-rounded reward as the target (one Monte Carlo sample; under the
  # NLL the critic's value distribution then fits the reward's, whose mean is V). Used once, never
  # stored: the buffer's group-mean targets are unchanged.
  chunk_end_pairs: int = 0
  # A departure where off, on in the paper: a pair with a reference trains two records, with it and
  # without it (weight 1/2 each), since the paper's bank starts empty and the critic is read without
  # one until a rollout passes. Off: the record with the reference alone (weight 1), for runs whose
  # every read has one (bank_from_data seeds the bank with each problem's solution); the update then
  # has half the rows, the longer half (issue 15 item 4): 0.60x its time, and on three seeds under
  # audit_gate higher peaks on every seed (BENCHMARKS.md, session 30).
  critic_plain_twin: bool = True
  # A departure, 1 in the paper: critic updates a step, each on its own draw of
  # critic_pairs_per_update pairs from the buffer. Late in a CPU run the policy sharpens and one
  # update a step stops keeping the critic's reads on its value grid (BENCHMARKS.md, "Session 13").
  critic_updates: int = 1
  # Readiness (item 6).
  readiness_window: int = 5         # complete steps pooled by the global test
  tau_global: float = 0.20
  tau_local: float = 0.18
  # Judge points: a rollout passes at >= pass_points of max_points with a complete answer (item 7).
  pass_points: int = 6
  max_points: int = 7
  # Variant switches.
  no_audit: bool = False
  group_size_one: bool = False
  stale_buffer: bool = False
  stale_period: int = 10
  stale_factor: int = 10
  correct_only: bool = False
  no_local_readiness: bool = False
  no_reference: bool = False
  readiness_judged_only: bool = False
  critic_judged_only: bool = False
  readiness_revocable: bool = False
  # A departure, off in the paper (audit_gate.py): every ready slot is audited (alpha = 1) until
  # the critic's chunk advantages over the audits of the last readiness_window steps with audits
  # correlate at audit_gate_corr or more with their Monte Carlo advantages, over audit_gate_rows
  # rows at least. 0.3 sits under the paper's main run (0.388) and far above a critic that does
  # not rank (0.18, BENCHMARKS.md, session 27); 32 rows: 4 audited groups of g = 8.
  audit_gate: bool = False
  audit_gate_corr: float = 0.3
  audit_gate_rows: int = 32
  # A departure, off in the paper (audit_gate.py): ready chunks' critic advantages (groups of g,
  # not group-1 singles) are multiplied by the slope of the audits' Monte Carlo advantages on their
  # critic ones over the gate's window, clipped to [1, audit_scale_max]; 1 under audit_gate_rows
  # rows. The floor keeps the paper's advantage where the critic overshoots; the cap bounds a flat
  # critic's slope (10-100 on a critic that answers one value per problem).
  audit_scale: bool = False
  audit_scale_max: float = 3.0
  # A departure, off in the paper (refills are never trained): a refill of a problem whose chunks
  # the critic would score now (locally ready, and the audit gate open under audit_gate) is also
  # trained, single, on A = r - V(s0), the critic's read of its empty prefix. A sixth of AC2's
  # decoded tokens on the CPU bench setting are refills (BENCHMARKS.md, session 29); this spends
  # them on the actor too, for one prompt-only critic read each. Measured on three seeds under
  # audit_gate (BENCHMARKS.md, session 30): it helps where the critic ranks chunks, not elsewhere.
  train_refills: bool = False
  # The bank starts with the data set's reference solutions, where the task has them (the paper
  # fills it from passing rollouts only; the algorithm seeds it, the controller never reads data).
  bank_from_data: bool = False
  # Critic learning-rate controller (item 10).
  critic_lr_init: float = 2.0 * _SQRT2 * 1e-6
  critic_lr_floor: float = 5.0 * _SQRT2 * 1e-7
  critic_lr_ratio_threshold: float = _SQRT2
  critic_lr_patience: int = 2       # consecutive high-ratio steps before halving
  # Adaptive entropy control (PPO surrogate section).
  entropy_target: float = 0.28
  entropy_step: float = 0.02
  entropy_k_min: float = -0.08
  entropy_k_max: float = 0.08
  entropy_k_init: float = 0.06
  eps_high_base: float = 0.28

  def __post_init__(self):
    def need(ok: bool, message: str) -> None:
      if not ok:
        raise ValueError(f'ControllerSettings: {message}')

    for name in ('group_size', 'buffer_capacity', 'response_budget', 'chunk_size', 'cut_grid',
                 'critic_buffer_capacity', 'critic_pairs_per_update', 'min_valid_per_target',
                 'readiness_window', 'max_points', 'stale_period', 'stale_factor',
                 'critic_lr_patience', 'critic_updates', 'audit_gate_rows'):
      value = getattr(self, name)
      need(isinstance(value, int) and value >= 1, f'{name} must be an integer >= 1, got {value!r}')
    for name in ('n_batch', 'n_refill', 'chunk_end_pairs'):
      value = getattr(self, name)
      need(isinstance(value, int) and value >= 0, f'{name} must be an integer >= 0, got {value!r}')
    need(0.0 <= self.audit_fraction <= 1.0,
         f'audit_fraction must lie in [0, 1], got {self.audit_fraction}')
    need(-1.0 <= self.audit_gate_corr <= 1.0,
         f'audit_gate_corr must lie in [-1, 1], got {self.audit_gate_corr}')
    need(not (self.audit_gate and self.effective_audit_fraction == 0.0),
         'audit_gate needs audits (audit_fraction > 0, no_audit off): once open, only audits '
         'can close it')
    need(not (self.audit_scale and self.effective_audit_fraction == 0.0),
         'audit_scale needs audits (audit_fraction > 0, no_audit off): its slope is theirs')
    need(self.audit_scale_max >= 1.0,
         f'audit_scale_max must be >= 1, got {self.audit_scale_max}')
    need(self.chunk_size <= self.response_budget,
         f'chunk_size ({self.chunk_size}) exceeds response_budget ({self.response_budget})')
    need(self.cut_before_uncredited or not self.chunk_through_uncredited,
         'chunk_through_uncredited needs cut_before_uncredited (a chunk runs through the line '
         'a cut stops before)')
    need(self.cut_before_uncredited or not self.cut_at_uncredited,
         'cut_at_uncredited needs cut_before_uncredited (the cut end it cuts at)')
    need(0.0 <= self.max_cut_fraction < 1.0,
         f'max_cut_fraction must lie in [0, 1), got {self.max_cut_fraction}')
    need(self.min_valid_per_target <= self.group_size,
         f'min_valid_per_target ({self.min_valid_per_target}) exceeds '
         f'group_size ({self.group_size})')
    for name in ('tau_global', 'tau_local'):
      value = getattr(self, name)
      need(0.0 < value <= 1.0, f'{name} must lie in (0, 1], got {value}')
    need(isinstance(self.pass_points, int) and 0 <= self.pass_points <= self.max_points,
         f'pass_points must be an integer in [0, max_points={self.max_points}], '
         f'got {self.pass_points!r}')
    need(0.0 < self.critic_lr_floor <= self.critic_lr_init,
         f'need 0 < critic_lr_floor ({self.critic_lr_floor}) '
         f'<= critic_lr_init ({self.critic_lr_init})')
    need(self.critic_lr_ratio_threshold > 0.0,
         f'critic_lr_ratio_threshold must be > 0, got {self.critic_lr_ratio_threshold}')
    need(self.entropy_step >= 0.0, f'entropy_step must be >= 0, got {self.entropy_step}')
    need(self.entropy_k_min <= self.entropy_k_init <= self.entropy_k_max,
         f'need entropy_k_min ({self.entropy_k_min}) <= entropy_k_init ({self.entropy_k_init}) '
         f'<= entropy_k_max ({self.entropy_k_max})')
    need(self.eps_high_base + self.entropy_k_min > 0.0,
         f'eps_high_base + entropy_k_min must be > 0, '
         f'got {self.eps_high_base + self.entropy_k_min}')

  @property
  def effective_audit_fraction(self) -> float:
    return 0.0 if self.no_audit else self.audit_fraction

  def audit_fraction_now(self, gate_trusted: bool) -> float:
    """alpha of the step being planned: 1 while an audit gate does not trust the critic."""
    return 1.0 if self.audit_gate and not gate_trusted else self.effective_audit_fraction

  @property
  def refills_per_collection(self) -> int:
    """Refill rollouts of a step that collects them (every step, or every stale_period steps)."""
    return self.n_refill * self.stale_factor if self.stale_buffer else self.n_refill

  def with_chunk_size(self, chunk_size: int) -> 'ControllerSettings':
    """The chunk-size variant: the chunk b and the cut grid move together."""
    return dataclasses.replace(self, chunk_size=chunk_size, cut_grid=chunk_size)

  def replace(self, **changes) -> 'ControllerSettings':
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)
