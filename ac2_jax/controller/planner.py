"""The AC2 controller: plans each step's generation requests and observes their scored results.

The trainer's side of one step is `ac2_jax/algorithms/ac2.py` (its stages plan, generate, route,
score, observe, advantages, update); this class is called by three of them:
  plan      PLAN(step): refills and replay slots (cold start / unready / ready chunk / audit).
  observe   OBSERVE(step, results): readiness errors and flips, replay buffer, bank, critic buffer;
            before the critic update, so that this step's pairs and new references are eligible.
  update    UPDATE_ENTROPY(H) gives eps_high for the actor minibatches; CRITIC_BATCH(step, fits)
            the critic update's records; OBSERVE_UPDATE_NORMS(|dV|, |dPPO1|, |dPPO2|, finite)
            runs the critic learning-rate rule; `critic_lr` is the rate of the next critic update.
The checkpoint saves state_dict() (JSON data) beside the parameters.

Every draw uses rng.generator(seed, purpose, step): plan(step) is a pure function of the state after
the previous observe, so a restored controller plans exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import math
from typing import Any, Hashable, Sequence

import numpy as np

from ac2_jax.controller import rng as rng_lib
from ac2_jax.controller import sampling
from ac2_jax.controller import state as state_lib
from ac2_jax.controller.audit_gate import AuditGate, audit_advantages
from ac2_jax.controller.bank import ReferenceBank
from ac2_jax.controller.critic_buffer import (ChunkEnd, ContextLimit, CriticBatch, CriticBuffer,
                                             CriticPair, chunk_end_records)
from ac2_jax.controller.readiness import Readiness
from ac2_jax.controller.replay import ReplayBuffer, Trajectory, freeze_tokens
from ac2_jax.controller.schedules import CriticLRController, EntropyController
from ac2_jax.controller.settings import ControllerSettings
from ac2_jax.controller.steps import (Continuation, GenerationRequest, RequestKind, RequestResult,
                                      StepOutcome, StepPlan, StepStats, ValueSource, check_result,
                                      passes)
from ac2_jax.controller.targets import group_mean
from ac2_jax.critic.values import round_to_grid

_EMPTY = np.zeros((0,), np.int32)
_EMPTY.flags.writeable = False
_STATE_VERSION = 1


class Controller:
  """Host state of an AC2 run: replay buffer, readiness, bank, critic buffer, schedules."""

  def __init__(self, settings: ControllerSettings, seed: int, problem_ids: Sequence[Hashable]):
    if not isinstance(settings, ControllerSettings):
      raise TypeError(f'settings must be a ControllerSettings, got {type(settings).__name__}')
    self.settings = settings
    self.seed = int(seed)
    self.problem_ids = tuple(problem_ids)
    if not self.problem_ids:
      raise ValueError('problem_ids is empty: the controller needs the training problems')
    self._index = {pid: i for i, pid in enumerate(self.problem_ids)}
    if len(self._index) != len(self.problem_ids):
      raise ValueError('problem_ids contains duplicates')
    if settings.stale_buffer:
      self.replay = ReplayBuffer(max(1, settings.refills_per_collection))
    else:
      self.replay = ReplayBuffer(settings.buffer_capacity)
    self.critic_buffer = CriticBuffer(settings.critic_buffer_capacity)
    self.bank = ReferenceBank(len(self.problem_ids))
    self.readiness = Readiness(len(self.problem_ids), settings)
    # Fed by every run's audits (the correlation is a metric); it gates only with audit_gate.
    self.audit_gate = AuditGate(settings.readiness_window, settings.audit_gate_corr,
                                settings.audit_gate_rows)
    self.critic_lr_schedule = CriticLRController(settings)
    self.entropy_schedule = EntropyController(settings)
    self.last_step: int | None = None
    self._stale_collection_step: int | None = None
    self._next_trajectory_id = 0
    self._pending: StepPlan | None = None

  # --- lookups ------------------------------------------------------------------------------------

  def problem_index(self, problem_id: Hashable) -> int:
    try:
      return self._index[problem_id]
    except KeyError:
      raise KeyError(f'unknown problem id {problem_id!r}') from None

  def is_ready(self, problem_id: Hashable) -> bool:
    return bool(self.readiness.ready_P[self.problem_index(problem_id)])

  def reference(self, problem_id: Hashable) -> Any:
    """The bank's reference for a problem, or None."""
    return self.bank.get(self.problem_index(problem_id))

  def _generator(self, purpose: str, step: int) -> np.random.Generator:
    return rng_lib.generator(self.seed, purpose, step)

  def _collects_refills(self, step: int) -> bool:
    if not self.settings.stale_buffer:
      return True
    last = self._stale_collection_step
    return last is None or step - last >= self.settings.stale_period

  # --- plan ---------------------------------------------------------------------------------------

  def plan(self, step: int) -> StepPlan:
    """The generation requests of `step` (refills first, then replay slots in slot order)."""
    step = int(step)
    if self.last_step is not None and step <= self.last_step:
      raise ValueError(f'step {step} was already observed (last observed: {self.last_step})')
    if self._pending is not None and self._pending.step == step:
      return self._pending
    s = self.settings
    budget = s.response_budget
    requests: list[GenerationRequest] = []
    num_refills = s.refills_per_collection if self._collects_refills(step) else 0
    all_problems = np.arange(len(self.problem_ids))
    # train_refills: a refill is trained, against V(s0), where a ready chunk would be critic-scored.
    critic_scores = s.train_refills and (not s.audit_gate or self.audit_gate.trusted())
    for p in sampling.cycle_draw(self._generator('refill', step), all_problems, num_refills):
      requests.append(GenerationRequest(
          kind=RequestKind.REFILL, problem_id=self.problem_ids[p], slot=-1,
          source_trajectory_id=-1, prefix_tokens_P=_EMPTY, cut=0, num_continuations=1,
          max_new_tokens=budget, remaining_budget=budget, critic_may_score=False,
          needs_prefix_value=bool(critic_scores and self.readiness.ready_P[p])))

    num_ready_slots = 0
    if len(self.replay) == 0:
      cold = sampling.cycle_draw(self._generator('cold_start', step), all_problems, s.n_batch)
      for slot, p in enumerate(cold):
        requests.append(GenerationRequest(
            kind=RequestKind.COLD_START, problem_id=self.problem_ids[p], slot=slot,
            source_trajectory_id=-1, prefix_tokens_P=_EMPTY, cut=0,
            num_continuations=s.group_size, max_new_tokens=budget, remaining_budget=budget,
            critic_may_score=False, needs_prefix_value=True))
    else:
      groups = self.replay.by_problem()
      slot_problems = sampling.cycle_draw(self._generator('replay_problems', step),
                                          np.fromiter(groups, np.int64), s.n_batch)
      counts = np.array([len(groups[p]) for p in slot_problems], np.int64)
      picks = self._generator('replay_trajectories', step).integers(0, counts)
      trajectories = [groups[p][k] for p, k in zip(slot_problems.tolist(), picks.tolist())]
      cuts = sampling.sample_cuts(self._generator('cuts', step),
                                  np.array([t.length for t in trajectories], np.int64),
                                  s.cut_grid, s.max_cut_fraction,
                                  sampling.cut_ends(trajectories))
      if s.cut_at_uncredited:  # drawn all the same, so the step's other draws do not move
        cuts = sampling.cuts_at_ends(cuts, trajectories)
      ready = self.readiness.ready_P[slot_problems]
      ready_slots = np.flatnonzero(ready)
      num_ready_slots = int(ready_slots.size)
      alpha = s.audit_fraction_now(self.audit_gate.trusted())
      audited = set(ready_slots[sampling.select_audits(
          self._generator('audit', step), num_ready_slots, alpha)].tolist())
      singles_rng = self._generator('group_one', step)
      for slot, (trajectory, cut) in enumerate(zip(trajectories, cuts.tolist())):
        if not ready[slot] or slot in audited:
          kind = RequestKind.AUDIT if ready[slot] else RequestKind.UNREADY
          requests.append(self._replay_request(kind, slot, trajectory, cut, s.group_size))
        elif s.group_size_one:
          singles = sampling.distinct_prefixes(singles_rng, groups[trajectory.problem],
                                               s.group_size, s.cut_grid, s.max_cut_fraction)
          for single, single_cut in singles:
            requests.append(self._replay_request(RequestKind.READY_CHUNK, slot, single, single_cut,
                                                 1))
        else:
          requests.append(self._replay_request(RequestKind.READY_CHUNK, slot, trajectory, cut,
                                               s.group_size))
    plan = StepPlan(step, tuple(requests), num_ready_slots, s.n_batch)
    self._pending = plan
    return plan

  def _replay_request(self, kind: RequestKind, slot: int, trajectory: Trajectory, cut: int,
                      num_continuations: int) -> GenerationRequest:
    remaining = self.settings.response_budget - cut
    chunk = kind == RequestKind.READY_CHUNK  # an audit's g full runs stand in for the chunks
    chunk_tokens = (self.chunk_length(trajectory, cut)
                    if kind in (RequestKind.READY_CHUNK, RequestKind.AUDIT) else 0)
    return GenerationRequest(
        kind=kind, problem_id=self.problem_ids[trajectory.problem], slot=slot,
        source_trajectory_id=trajectory.trajectory_id, prefix_tokens_P=trajectory.tokens_L[:cut],
        cut=cut, num_continuations=num_continuations,
        max_new_tokens=min(chunk_tokens, remaining) if chunk else remaining,
        remaining_budget=remaining, critic_may_score=chunk, needs_prefix_value=True,
        chunk_tokens=chunk_tokens)

  def chunk_length(self, trajectory: Trajectory, cut: int) -> int:
    """New tokens of a ready chunk from `trajectory` cut at `cut`, before the budget's cap: b, or
    (`chunk_through_uncredited`) as far as the trajectory's chunk_end when that is further."""
    b = self.settings.chunk_size
    if self.settings.chunk_through_uncredited and trajectory.chunk_end is not None:
      return max(b, trajectory.chunk_end - cut)
    return b

  # --- observe ------------------------------------------------------------------------------------

  def observe(self, step: int, results: Sequence[RequestResult]) -> StepOutcome:
    """Takes the scored results of plan(step), one per request in plan order; updates the state."""
    step = int(step)
    plan = self._pending
    if plan is None or plan.step != step:
      raise ValueError(f'observe({step}) without a pending plan for that step: '
                       f'call plan({step}) first')
    if len(results) != len(plan.requests):
      raise ValueError(f'step {step}: got {len(results)} results for {len(plan.requests)} requests')
    for i, (request, result) in enumerate(zip(plan.requests, results)):
      check_result(i, request, result, self.settings)
    s = self.settings
    num_requests = len(plan.requests)
    targets_R = np.full((num_requests,), np.nan)
    errors_R = np.full((num_requests,), np.nan)
    counted_R = np.zeros((num_requests,), bool)  # errors readiness sees
    error_problems: list[int] = []
    nonzero: list[int] = []
    pairs: list[CriticPair] = []
    candidates: list[tuple[int, Any]] = []
    new_trajectories: list[Trajectory] = []
    dropped = invalid_predictions = 0
    trajectories_by_id = {t.trajectory_id: t for t in self.replay.trajectories}

    for i, (request, result) in enumerate(zip(plan.requests, results)):
      problem = self._index[request.problem_id]
      for c in result.continuations:
        if self._passes(c):
          candidates.append((problem, c.reference))
      if request.kind == RequestKind.REFILL:
        c = result.continuations[0]
        passed = self._passes(c)
        trajectory = Trajectory(self._next_trajectory_id, problem, freeze_tokens(c.tokens_N),
                                c.points, passed, c.reference if passed else None, step,
                                c.cut_end, c.chunk_end)
        self._next_trajectory_id += 1
        if not s.correct_only or trajectory.passed:
          new_trajectories.append(trajectory)
        continue
      prediction = result.prefix_value
      if prediction is not None and prediction > 0.0:
        nonzero.append(problem)
      single = s.group_size_one and request.kind == RequestKind.READY_CHUNK
      if single and prediction is None:
        dropped += 1
      values = [c.value for c in result.continuations]
      mean = group_mean(values, 1 if single else s.min_valid_per_target)
      if mean is None:
        continue
      target = round_to_grid(mean)
      targets_R[i] = target
      errors_R[i] = 1.0 if prediction is None else abs(prediction - target)
      invalid_predictions += prediction is None
      judged = all(c.source == ValueSource.JUDGE for c in result.continuations)
      if judged or not s.readiness_judged_only:
        error_problems.append(problem)
        counted_R[i] = True
      if not (single and prediction is None) and (judged or not s.critic_judged_only):
        source = trajectories_by_id.get(request.source_trajectory_id)  # None: empty by design
        pairs.append(CriticPair(problem, source, request.cut, target, step, mean))

    self.audit_gate.record_step(_audited_advantages(plan.requests, results))
    has_error = ~np.isnan(errors_R)
    self.readiness.record_step(np.array(error_problems, np.int64), errors_R[counted_R],
                               np.array(nonzero, np.int64))
    # Readiness reads the bank as it was before this step's additions.
    newly_ready = self.readiness.update(self.bank.mask())
    revoked = np.zeros((0,), np.int64)
    if s.readiness_revocable:
      # After the flips, so that one step's ready groups cannot re-validate a problem whose
      # judged audit the critic just missed.
      failed = [self._index[r.problem_id] for r, e in zip(plan.requests, errors_R)
                if r.kind == RequestKind.AUDIT and e >= s.tau_local]
      revoked = self.readiness.revoke(np.array(failed, np.int64))
    bank_added = self.bank.add_candidates(self._generator('bank', step), candidates)
    for pair in pairs:
      self.critic_buffer.add(pair)
    if s.stale_buffer:
      if self._collects_refills(step):
        self.replay.replace_all(new_trajectories)
        self._stale_collection_step = step
    else:
      for trajectory in new_trajectories:
        self.replay.add(trajectory)
    self.last_step = step
    self._pending = None

    kinds = [r.kind for r in plan.requests]
    audited = np.array([k == RequestKind.AUDIT for k in kinds], bool) & has_error
    slots = plan.num_replay_slots
    stats = StepStats(
        ready_fraction=plan.num_ready_slots / slots if slots else math.nan,
        critic_error=float(errors_R[has_error].mean()) if has_error.any() else math.nan,
        critic_error_audited=float(errors_R[audited].mean()) if audited.any() else math.nan,
        global_window_error=self.readiness.window_error(),
        global_ready=self.readiness.global_ok(),
        num_ready_problems=self.readiness.num_ready,
        num_newly_ready=int(newly_ready.size),
        num_targets=int(has_error.sum()),
        num_invalid_predictions=int(invalid_predictions),
        num_pairs_added=len(pairs),
        num_dropped_rows=dropped,
        num_bank_added=len(bank_added),
        bank_size=len(self.bank),
        buffer_size=len(self.replay),
        critic_buffer_size=len(self.critic_buffer),
        num_refills=kinds.count(RequestKind.REFILL),
        num_cold_start=kinds.count(RequestKind.COLD_START),
        num_unready=kinds.count(RequestKind.UNREADY),
        num_ready_chunk=kinds.count(RequestKind.READY_CHUNK),
        num_audit=kinds.count(RequestKind.AUDIT),
        num_revoked=int(revoked.size),
        critic_audit_corr=self.audit_gate.correlation(),
        critic_trusted=self.audit_gate_open,
        chunk_advantage_scale=self.chunk_advantage_scale,
    )
    return StepOutcome(step, targets_R, errors_R,
                       tuple(self.problem_ids[p] for p in newly_ready.tolist()), stats)

  def _passes(self, c: Continuation) -> bool:
    return passes(c, self.settings)

  @property
  def audit_gate_open(self) -> bool:
    """Whether the next plan critic-scores its unaudited ready slots' chunks."""
    return not self.settings.audit_gate or self.audit_gate.trusted()

  @property
  def chunk_advantage_scale(self) -> float:
    """The factor on ready chunks' critic advantages: the audit window's slope clipped to
    [1, audit_scale_max] with `audit_scale`, else (or while the window cannot estimate it) 1."""
    slope = self.audit_gate.slope() if self.settings.audit_scale else math.nan
    return 1.0 if slope != slope else min(max(slope, 1.0), self.settings.audit_scale_max)

  # --- schedules ----------------------------------------------------------------------------------

  def update_entropy(self, entropy: float | None) -> float:
    """Adaptive entropy control from this step's H (None: no empty-prefix token); eps_high."""
    return self.entropy_schedule.update(entropy)

  @property
  def critic_lr(self) -> float:
    """The learning rate of the next critic update."""
    return self.critic_lr_schedule.lr

  def observe_update_norms(self, critic_norm: float, actor_norm_1: float, actor_norm_2: float,
                           finite: bool = True) -> float:
    """The critic learning-rate rule on one step's update norms; returns the next rate."""
    return self.critic_lr_schedule.observe(critic_norm, actor_norm_1, actor_norm_2, finite=finite)

  # --- critic -------------------------------------------------------------------------------------

  def critic_batch(self, step: int, context_limit: ContextLimit = None, draw: int = 0
                   ) -> CriticBatch:
    """Records of this step's critic update: up to critic_pairs_per_update pairs drawn without
    replacement from the critic buffer, skipping those whose context does not fit. `draw` k > 0 is
    the step's k-th further update (`critic_updates`), with its own seeded draw.

    A pair's reference is its source trajectory's own solution if that trajectory passed, else the
    bank's current reference for its problem (None in the no-reference variant).
    """
    purpose = 'critic_batch' if draw == 0 else f'critic_batch_{int(draw)}'
    return self.critic_buffer.sample(self._generator(purpose, int(step)),
                                     self.settings.critic_pairs_per_update, self._pair_reference,
                                     lambda p: self.problem_ids[p], context_limit,
                                     self.settings.critic_plain_twin)

  def chunk_end_batch(self, step: int, chunk_ends: Sequence[ChunkEnd],
                      context_limit: ContextLimit = None) -> CriticBatch:
    """This step's extra critic records (`chunk_end_pairs`; none when 0): that many of its judged
    chunk ends at most, each with the bank's reference (none in the no-reference variant)."""
    no_reference = self.settings.no_reference
    return chunk_end_records(self._generator('chunk_end', int(step)), list(chunk_ends),
                             self.settings.chunk_end_pairs,
                             lambda p: None if no_reference else self.bank.get(p),
                             lambda p: self.problem_ids[p], context_limit,
                             self.settings.critic_plain_twin)

  def _pair_reference(self, pair: CriticPair) -> Any:
    if self.settings.no_reference:
      return None
    if pair.source is not None and pair.source.passed:
      return pair.source.reference
    return self.bank.get(pair.problem)

  # --- checkpoint ---------------------------------------------------------------------------------

  def state_dict(self) -> dict:
    """Everything kept between steps, as JSON data (call after observe(), before next plan())."""
    if self._pending is not None:
      raise ValueError(f'step {self._pending.step} is planned but not observed: '
                       'save after observe()')
    replay = self.replay.trajectories
    pairs = self.critic_buffer.pairs
    stored = {t.trajectory_id: t for t in replay}
    stored.update({p.source.trajectory_id: p.source for p in pairs if p.source is not None})
    # A trajectory that left the replay buffer is only read up to its pairs' cuts: save just that.
    kept = {t.trajectory_id: t.length for t in replay}
    for pair in pairs:
      if pair.source is not None:
        key = pair.source.trajectory_id
        kept[key] = max(kept.get(key, 0), pair.cut)
    readiness = self.readiness.state_dict()
    return {
        'version': _STATE_VERSION,
        'seed': self.seed,
        'problem_ids_digest': state_lib.ids_digest(self.problem_ids),
        'num_problems': len(self.problem_ids),
        'settings': self.settings.to_dict(),
        'last_step': self.last_step,
        'stale_collection_step': self._stale_collection_step,
        'next_trajectory_id': self._next_trajectory_id,
        'trajectories': state_lib.pack_trajectories([stored[k] for k in sorted(stored)], kept),
        'replay_ids': [t.trajectory_id for t in replay],
        'critic_pairs': state_lib.pack_pairs(pairs),
        'bank': [[p, state_lib.pack_value(r)] for p, r in self.bank.items()],
        'readiness': {
            'ready': state_lib.pack_array(readiness['ready']),
            'latest_error': state_lib.pack_array(readiness['latest_error']),
            'nonzero_prediction': state_lib.pack_array(readiness['nonzero_prediction']),
            'window': [state_lib.pack_array(w) for w in readiness['window']],
        },
        'audit_gate': [state_lib.pack_array(w) for w in self.audit_gate.state_dict()],
        'critic_lr': self.critic_lr_schedule.state_dict(),
        'entropy': self.entropy_schedule.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    """Restores state_dict() output.

    The problem ids must match. Settings may differ (a variant branched from a checkpoint): the
    buffers and the readiness window then keep their newest entries up to the new sizes.
    """
    if state.get('version') != _STATE_VERSION:
      raise ValueError(f'controller state version {state.get("version")!r}, '
                       f'expected {_STATE_VERSION}')
    if (state['num_problems'] != len(self.problem_ids)
        or state['problem_ids_digest'] != state_lib.ids_digest(self.problem_ids)):
      raise ValueError(f'the checkpoint was written for other problem ids '
                       f'({state["num_problems"]} problems); this controller has '
                       f'{len(self.problem_ids)}')
    by_id = state_lib.unpack_trajectories(state['trajectories'])
    self.replay.replace_all(by_id[k] for k in state['replay_ids'])
    self.critic_buffer = CriticBuffer(self.settings.critic_buffer_capacity)
    for pair in state_lib.unpack_pairs(state['critic_pairs'], by_id):
      self.critic_buffer.add(pair)
    self.bank.load_items([(int(p), state_lib.unpack_value(r)) for p, r in state['bank']])
    r = state['readiness']
    self.readiness.load_state_dict({
        'ready': state_lib.unpack_array(r['ready']),
        'latest_error': state_lib.unpack_array(r['latest_error']),
        'nonzero_prediction': state_lib.unpack_array(r['nonzero_prediction']),
        'window': [state_lib.unpack_array(w) for w in r['window']],
    })
    # A state saved before the gate existed restores an empty window: a gate switched on from
    # such a checkpoint audits every ready slot until its audits speak.
    self.audit_gate.load_state_dict([state_lib.unpack_array(w)
                                     for w in state.get('audit_gate', [])])
    self.critic_lr_schedule.load_state_dict(state['critic_lr'])
    self.entropy_schedule.load_state_dict(state['entropy'])
    self.last_step = state['last_step']
    self._stale_collection_step = state['stale_collection_step']
    self._next_trajectory_id = int(state['next_trajectory_id'])
    self._pending = None


def _audited_advantages(requests: Sequence[GenerationRequest], results: Sequence[RequestResult]):
  """The audit gate's view of a step: each audited group with a chunk-end read and no failed
  judge call, as critic and Monte Carlo advantages."""
  out = []
  for request, result in zip(requests, results):
    cs = result.continuations
    if request.kind != RequestKind.AUDIT or not any(c.chunk_end_read for c in cs):
      continue
    a = audit_advantages([c.value for c in cs], [c.chunk_end_read for c in cs],
                         [c.chunk_end_value for c in cs])
    if a is not None and a.critic_A.size:
      out.append(a)
  return out
