"""AC2 (and Prefix GRPO): one training step as named stages over typed row records.

  plan        the controller's requests: refills, cold starts, unready groups, ready chunks, audits
  generate    every request's continuations in one batched sampler call -> one `ChunkRow` each
  route       a chunk that hit its cap with budget left and no complete answer goes to the critic,
              everything else to the judge (ALGORITHMS.md AC2 item 3)
  score       judge grades; critic reads of routed endpoints and of V(s) at the prefixes, all with
              the weights from before this step's update
  audit       the audited groups' diagnostics (`audit_records`, written to audits.jsonl): V(s)
              also read without the reference, and the critic at each full continuation's
              chunk end (the value AC2 would have used had the slot not been audited)
  observe     the controller takes the scored results (readiness, buffers, bank, critic pairs)
  advantages  A_i = v_i - mean_j v_j per group (invalid reads: weight 0), group-1 singles v - V(s)
  update      entropy control -> actor minibatch 1 -> critic update -> actor minibatch 2 -> critic
              learning-rate rule; the update metrics are read from the device once

Prefix GRPO is the same machinery with the critic switched off: every prefix gets g full
continuations scored by the judge and GRPO advantages (mean-centred terminal rewards); since no
critic value is ever read, no problem becomes ready.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from ac2_jax import controller as ctl
from ac2_jax import device_reads
from ac2_jax import tokenization
from ac2_jax.algorithms import base
from ac2_jax.algorithms import timing
from ac2_jax.controller.steps import RequestKind, ValueSource
from ac2_jax.judges.grading import Grade
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner.runtime import Runtime
from ac2_jax.rl import advantages as adv_lib


@dataclasses.dataclass
class ChunkRow:
  """One continuation of a planned request, carried through the stages of a step."""

  request_index: int
  request: ctl.GenerationRequest
  rollout: rows_lib.Row          # tokens, log-probs, entropies; advantage and weight once assigned
  text: str = ''                 # the whole response so far (replayed prefix + new tokens)
  to_critic: bool = False        # route: the critic scores the endpoint, else the judge
  grade: Grade | None = None     # score of a judged row
  critic_value: float | None = None  # score of a routed row (None: invalid read)
  # An audited row that ran past its slot's chunk: the critic's read at the chunk end
  # (`audit_records`; None: invalid), for the audit gate and the critic panels.
  chunk_end_read: bool = False
  chunk_end_value: float | None = None
  decoding_flops: float = 0.0    # F(p, g) of this row's generation

  @property
  def actor_value(self) -> float:
    """The endpoint value in the actor loss: a failed judge call is reward 0, an invalid read 0
    (its row then has weight 0)."""
    if self.to_critic:
      return 0.0 if self.critic_value is None else self.critic_value
    return self.grade.reward

  @property
  def actor_valid(self) -> bool:
    return not self.to_critic or self.critic_value is not None


@dataclasses.dataclass
class StepData:
  """What the stages of one step produce, in plan order."""

  plan: ctl.StepPlan
  rows: list[ChunkRow]
  decoding_flops: float
  prefix_values: dict[int, float | None] = dataclasses.field(default_factory=dict)
  reads: list[float | None] = dataclasses.field(default_factory=list)  # every critic read
  audits: list[dict] = dataclasses.field(default_factory=list)  # `audit_records`

  def rows_of(self, kind: RequestKind) -> list[ChunkRow]:
    return [r for r in self.rows if r.request.kind == kind]


class AC2(base.Algorithm):
  """Holds the host-side controller; `step` runs one training step."""

  def __init__(self, rt: Runtime, settings: ctl.ControllerSettings, seed: int, *,
               use_critic: bool = True):
    self.settings = settings
    self.use_critic = use_critic
    self.controller = ctl.Controller(settings, seed, [r.id for r in rt.train_records])
    self._audits: list[dict] | None = [] if use_critic else None
    self._index = {r.id: i for i, r in enumerate(rt.train_records)}
    if settings.bank_from_data:
      self.controller.bank.load_items([(i, r.reference_solution)
                                       for i, r in enumerate(rt.train_records)
                                       if r.reference_solution])

  def state_dict(self) -> dict:
    return self.controller.state_dict()

  def load_state_dict(self, data: dict) -> None:
    self.controller.load_state_dict(data)

  @property
  def critic_lr(self) -> float:
    return self.controller.critic_lr

  def step(self, rt: Runtime, state, step: int, key: jax.Array):
    timer = timing.PhaseTimer()
    with timer('controller'):
      plan = self.controller.plan(step)
    with timer('generate'):
      data = self.generate(rt, state.params, plan, key)
    self.route(rt, data)
    critic_params = rt.critic_params(state)
    self.score(rt, critic_params, data, timer, policy_params=state.params)
    if self.use_critic:
      with timer('audit_reads'):
        data.audits = self.audit_records(rt, critic_params, data, policy_params=state.params)
      self._audits = data.audits
    with timer('controller'):
      outcome = self.observe(rt, step, data)
      self.assign_advantages(data)
    state, updates = self.update(rt, state, step, data, timer)
    return state, {**self.metrics(data, outcome, updates), **timer.metrics()}

  # --- stages -------------------------------------------------------------------------------------

  def generate(self, rt: Runtime, params, plan: ctl.StepPlan, key: jax.Array) -> StepData:
    """One sampler call for every continuation of every request, in plan order."""
    owners, contexts, prefix_lens, problems, caps, budgets = [], [], [], [], [], []
    for r, req in enumerate(plan.requests):
      p = self._index[req.problem_id]
      context = np.concatenate([rt.train_prompts[p], req.prefix_tokens_P]).astype(np.int32)
      for _ in range(req.num_continuations):
        owners.append(r)
        contexts.append(context)
        prefix_lens.append(req.cut)
        problems.append(p)
        caps.append(req.max_new_tokens)
        budgets.append(req.remaining_budget)
    # Every ready chunk in the chunk calls: b, or the longest chunk through an uncredited line.
    short_cap = (max([self.settings.chunk_size] + [r.max_new_tokens for r in plan.requests
                                                   if r.kind == RequestKind.READY_CHUNK])
                 if self.settings.chunk_calls else 0)
    rollouts, flops_N = rows_lib.generate_rows(rt, params, contexts, prefix_lens, problems, caps,
                                               budgets, key, rt.train_sampling, short_cap)
    texts = rows_lib.response_texts(rt, rollouts)
    rows = [ChunkRow(r, plan.requests[r], rollout, text, decoding_flops=float(f))
            for r, rollout, text, f in zip(owners, rollouts, texts, flops_N)]
    return StepData(plan, rows, float(np.sum(flops_N)))

  def route(self, rt: Runtime, data: StepData) -> None:
    for row in data.rows:
      row.to_critic = (self.use_critic and row.request.critic_may_score
                       and row.rollout.stop_reason == 'chunk_cap'
                       and not rt.task.has_complete_answer(row.text))

  def score(self, rt: Runtime, params, data: StepData,
            timer: timing.PhaseTimer | None = None, policy_params=None) -> None:
    """Judge grades of the judged rows; one batch of critic reads (routed endpoints, then V(s) of
    the requests that need it) with the weights from before the update (`policy_params`: the
    actor's, for a self-checking critic's check; default `params`)."""
    timer = timer or timing.PhaseTimer()
    judged = [r for r in data.rows if not r.to_critic]
    with timer('judge'):
      grades = rt.task.score_batch([rt.train_records[r.rollout.problem_index] for r in judged],
                                   [r.text for r in judged])
    for row, grade in zip(judged, grades):
      row.grade = grade
    endpoints = [r for r in data.rows if r.to_critic]
    prefix_requests = ([i for i, req in enumerate(data.plan.requests) if req.needs_prefix_value]
                       if self.use_critic else [])
    prompts, responses, references = [], [], []
    for row in endpoints:
      rollout = row.rollout
      prompts.append(rt.train_prompts[rollout.problem_index])
      responses.append(np.concatenate([rollout.context_P[rollout.prompt_len:], rollout.new_N]))
      references.append(self._reference(row.request.problem_id))
    for i in prefix_requests:
      req = data.plan.requests[i]
      prompts.append(rt.train_prompts[self._index[req.problem_id]])
      responses.append(req.prefix_tokens_P)
      references.append(self._reference(req.problem_id))
    with timer('critic_reads'):
      data.reads = rows_lib.critic_reader(rt.critic_readout)(rt, params, prompts, responses,
                                                            references, policy_params)
    for row, value in zip(endpoints, data.reads):
      row.critic_value = value
    data.prefix_values = dict(zip(prefix_requests, data.reads[len(endpoints):]))

  def audit_records(self, rt: Runtime, params, data: StepData, policy_params=None
                    ) -> list[dict]:
    """One record per audited group (numbers only), for the critic panels (train/critic_panels).

    problem, slot, cut; reference: the prefix read AC2 used had the bank's reference;
    v_prefix_ref / v_prefix_noref: V(s) with and without it (the read AC2 used, and one more read
    of the same prefix; v_prefix_ref is None without a reference); rewards: the judge's reward of
    each full continuation (None: the judge failed); new_tokens: their lengths; chunk_end_read:
    the continuation ran past the slot's chunk b (`chunk_tokens`: b, or further with
    `chunk_through_uncredited`), so the critic is read at s . c_i[:b] (chunk_end_value);
    else the chunk would have been the whole continuation and its value is its reward (AC2 paper,
    Section A.4; a chunk that holds a complete answer is not singled out). Invalid reads are None.
    The extra reads use the weights from before the update, in one batch of their own, so the
    step's other reads are unchanged; there are at most a third as many as chunk-end reads (an
    audit per 3 unaudited ready slots at alpha = 1/4), plus one per audited prefix.
    """
    audited = [i for i, req in enumerate(data.plan.requests) if req.kind == RequestKind.AUDIT]
    if not audited:
      return []
    members: dict[int, list[ChunkRow]] = {i: [] for i in audited}
    for row in data.rows:
      if row.request_index in members:
        members[row.request_index].append(row)
    prompts, responses, references = [], [], []

    def ask(prompt, response, reference) -> int:
      prompts.append(prompt)
      responses.append(response)
      references.append(reference)
      return len(prompts) - 1

    asked = []
    for i in audited:
      req = data.plan.requests[i]
      prompt = rt.train_prompts[self._index[req.problem_id]]
      reference = self._reference(req.problem_id)
      noref = None if reference is None else ask(prompt, req.prefix_tokens_P, None)
      b = req.chunk_tokens
      ends = [ask(prompt, np.concatenate([req.prefix_tokens_P, row.rollout.new_N[:b]]), reference)
              if len(row.rollout.new_N) > b else None for row in members[i]]
      asked.append((i, reference is not None, noref, ends))
    reads = rows_lib.critic_reader(rt.critic_readout)(rt, params, prompts, responses, references,
                                                      policy_params)
    records = []
    for i, has_reference, noref, ends in asked:
      req, used = data.plan.requests[i], data.prefix_values.get(i)
      for row, k in zip(members[i], ends):
        row.chunk_end_read = k is not None
        row.chunk_end_value = None if k is None else reads[k]
      records.append({
          'problem': req.problem_id, 'slot': req.slot, 'cut': req.cut,
          'reference': has_reference,
          'v_prefix_ref': used if has_reference else None,
          'v_prefix_noref': reads[noref] if has_reference else used,
          'rewards': [r.grade.reward if r.grade.valid else None for r in members[i]],
          'new_tokens': [len(r.rollout.new_N) for r in members[i]],
          'chunk_end_read': [r.chunk_end_read for r in members[i]],
          'chunk_end_value': [r.chunk_end_value for r in members[i]],
      })
    return records

  def audited_groups(self) -> list[dict] | None:
    return self._audits

  def observe(self, rt: Runtime, step: int, data: StepData) -> ctl.StepOutcome:
    per_request = [[] for _ in data.plan.requests]
    for row in data.rows:
      per_request[row.request_index].append(self._continuation(rt, row))
    results = [ctl.RequestResult(tuple(cs), data.prefix_values.get(r))
               for r, cs in enumerate(per_request)]
    return self.controller.observe(step, results)

  def assign_advantages(self, data: StepData) -> None:
    """A_i = v_i - mean_j v_j per group (invalid reads: weight 0, filled); group-1 singles v - V(s).
    A ready group's chunk advantages times the controller's `chunk_advantage_scale` (1 unless
    audit_scale). Refills fill the replay buffer and are not trained on (weight 0), except those the
    controller asked V(s0) for (train_refills): single, r - V(s0). Every group's advantages are
    computed on the device and read back together, in one read."""
    groups: dict[int, list[ChunkRow]] = {}
    for row in data.rows:
      groups.setdefault(row.request_index, []).append(row)
    scale = self.controller.chunk_advantage_scale
    pending = []
    for r, members in groups.items():
      req = data.plan.requests[r]
      if not req.trained:
        continue
      values = np.array([m.actor_value for m in members], np.float32)
      valid = np.array([m.actor_valid for m in members], bool)
      if req.num_continuations == 1 and req.kind in (RequestKind.READY_CHUNK, RequestKind.REFILL):
        baseline = data.prefix_values.get(r)
        inputs = (values, valid, np.array([0.0 if baseline is None else baseline], np.float32),
                  np.array([baseline is not None]))
        pending.append((members, 1.0, _single_advantages(*jax.device_put(inputs))))
      else:
        critic_scored = req.kind == RequestKind.READY_CHUNK and any(m.to_critic for m in members)
        pending.append((members, scale if critic_scored else 1.0,
                        _chunk_advantages(*jax.device_put((values, valid)))))
    host = device_reads.read('advantages', [aw for _, _, aw in pending])
    for (members, factor, _), (a, w) in zip(pending, host):
      for k, m in enumerate(members):
        m.rollout.advantage = float(a[k]) * factor
        m.rollout.weight = float(w[k])

  def update(self, rt: Runtime, state, step: int, data: StepData,
             timer: timing.PhaseTimer | None = None):
    """Entropy control, actor minibatch 1, critic update, actor minibatch 2, critic lr rule."""
    timer = timer or timing.PhaseTimer()
    rollouts = [r.rollout for r in data.rows]
    empty = [r for r in rollouts if r.prefix_len == 0 and len(r.entropies_N)]
    entropy = float(np.mean(np.concatenate([r.entropies_N for r in empty]))) if empty else None
    eps_high = self.controller.update_entropy(entropy)
    with timer('actor_updates'):
      state, m1 = timing.ready(rows_lib.train_actor(rt, state, rollouts, eps_high, 0))
    critic_counts, critic_device = {}, {}
    if self.use_critic:
      with timer('critic_update'):
        state, critic_device, critic_counts = timing.ready(
            self._critic_update(rt, state, step, data))
    with timer('actor_updates'):
      state, m2 = timing.ready(rows_lib.train_actor(rt, state, rollouts, eps_high, 1))
    host = base.host_metrics({'actor1': m1, 'critic': critic_device, 'actor2': m2})
    critic = {**host['critic'], **critic_counts}
    if self.use_critic and 'update_norm' in critic:
      self.controller.observe_update_norms(
          critic['update_norm'], host['actor1'].get('update_norm', 0.0),
          host['actor2'].get('update_norm', 0.0), finite=critic['skipped'] == 0.0)
    return state, {'entropy': entropy, 'eps_high': eps_high, 'actor1': host['actor1'],
                   'actor2': host['actor2'], 'critic': critic}

  # --- pieces -------------------------------------------------------------------------------------

  def _reference(self, problem_id) -> str | None:
    return None if self.settings.no_reference else self.controller.reference(problem_id)

  def _continuation(self, rt: Runtime, row: ChunkRow) -> ctl.Continuation:
    tokens = row.rollout.new_N
    if row.to_critic:
      return ctl.Continuation(row.critic_value, ValueSource.CRITIC, tokens_N=tokens)
    g = row.grade
    complete = rt.task.has_complete_answer(row.text)
    passing = g.valid and g.points >= self.settings.pass_points and complete
    return ctl.Continuation(g.reward if g.valid else None, ValueSource.JUDGE,
                            points=g.points if g.valid else None, complete_answer=complete,
                            tokens_N=tokens,
                            reference=rt.task.reference_from_response(row.text)
                            if passing else None, cut_end=self._cut_end(rt, row),
                            chunk_end=self._chunk_end(rt, row),
                            chunk_end_read=row.chunk_end_read,
                            chunk_end_value=row.chunk_end_value)

  def _cut_end(self, rt: Runtime, row: ChunkRow) -> int | None:
    """A refill's latest replay cut in tokens (`cut_before_uncredited`), else None."""
    if not (self.settings.cut_before_uncredited and row.request.kind == RequestKind.REFILL):
      return None
    end = rt.task.replay_cut_end(rt.train_records[row.rollout.problem_index], row.text)
    return None if end is None else tokenization.tokens_within(rt.tokenizer, row.rollout.new_N,
                                                               end)

  def _chunk_end(self, rt: Runtime, row: ChunkRow) -> int | None:
    """A refill's chunk end in tokens, rounded up (`chunk_through_uncredited`), else None."""
    if not (self.settings.chunk_through_uncredited and row.request.kind == RequestKind.REFILL):
      return None
    end = rt.task.replay_chunk_end(rt.train_records[row.rollout.problem_index], row.text)
    return None if end is None else tokenization.tokens_reaching(rt.tokenizer,
                                                                 row.rollout.new_N, end)

  def _critic_update(self, rt: Runtime, state, step: int, data: StepData):
    """The critic update on this step's records (the buffer's, then this step's chunk ends when
    `chunk_end_pairs` > 0); each critic prompt is built once."""
    contexts = {}

    def fits(record) -> bool:
      context = rt.critic_context(rt.prompt_ids_by_id[record.problem_id], record.prefix_tokens_P,
                                  record.reference)
      contexts[id(record)] = context
      return context is not None

    lr = rt.put_batch(np.float32(self.controller.critic_lr))
    counts, updates = {'pairs': 0, 'skipped_context': 0}, []
    for draw in range(self.settings.critic_updates):
      batch = self.controller.critic_batch(step, fits, draw)
      counts['pairs'] += batch.num_pairs
      counts['skipped_context'] += batch.num_skipped
      records = list(batch.records)
      if self.settings.chunk_end_pairs and draw == 0:
        ends = self.controller.chunk_end_batch(step, self._chunk_ends(data), fits)
        records += ends.records
        counts['chunk_end_pairs'] = ends.num_pairs
      checked = rows_lib.self_checked(rt, state.params, [contexts[id(r)] for r in records])
      kept = [i for i, c in enumerate(checked) if c is not None]
      counts['skipped_context'] += len(records) - len(kept)
      device_batch = rows_lib.critic_records_batch(rt, [checked[i] for i in kept],
                                                   [records[i] for i in kept])
      if device_batch is not None:
        state, metrics = rt.critic_step(state, device_batch, lr)
        updates.append(metrics)
    if not updates:
      return state, {}, counts
    return state, _combined_critic_metrics(updates), counts

  def _chunk_ends(self, data: StepData) -> list[ctl.ChunkEnd]:
    """The step's judged continuations that ran past the chunk b, at their chunk-end state."""
    b = self.settings.chunk_size
    return [ctl.ChunkEnd(self.controller.problem_index(row.request.problem_id),
                         np.concatenate([row.request.prefix_tokens_P, row.rollout.new_N[:b]]),
                         row.grade.reward)
            for row in data.rows
            if not row.to_critic and row.grade.valid and len(row.rollout.new_N) > b]

  def metrics(self, data: StepData, outcome: ctl.StepOutcome, updates: dict) -> dict:
    judged = [r for r in data.rows if not r.to_critic]
    trained = [r.rollout for r in data.rows if r.rollout.weight > 0]
    out = {
        **{k: v for k, v in outcome.stats.as_dict().items()
           if self.use_critic or 'critic' not in k},
        'entropy': updates['entropy'], 'eps_high': updates['eps_high'],
        'reward/judged_mean': _mean([r.grade.reward for r in judged]),
        'replay/zero_variance_groups': adv_lib.zero_variance_share(self._replay_groups(data)),
        **_zero_variance_by_kind(self._replay_groups(data, by_kind=True)),
        'reward/refill_mean': _mean([r.grade.reward for r in data.rows_of(RequestKind.REFILL)
                                     if not r.to_critic]),
        'judge_failures': sum(not r.grade.valid for r in judged),
        'routed_to_critic': len(data.rows) - len(judged),
        'rows_generated': len(data.rows),
        'critic_reads_invalid': sum(v is None for v in data.reads),
        'adv/mean': _mean([r.advantage for r in trained]),
        'adv/abs_mean': _mean([abs(r.advantage) for r in trained]),
        'rows_trained': len(trained),
        'refills_trained': sum(r.rollout.weight > 0 for r in data.rows_of(RequestKind.REFILL)),
        'tokens_generated': int(sum(len(r.rollout.new_N) for r in data.rows)),
        'decoding_flops': data.decoding_flops,
        **_by_kind(data),
        **{f'actor1/{k}': v for k, v in updates['actor1'].items()},
        **{f'actor2/{k}': v for k, v in updates['actor2'].items()},
        **{f'critic/{k}': v for k, v in updates['critic'].items()},
    }
    if self.use_critic:
      out['critic_lr'] = self.controller.critic_lr
    return out


  def _replay_groups(self, data: StepData, by_kind: bool = False):
    """The endpoint values of each replayed group (refills are no groups); by_kind: a list of
    them per request kind."""
    groups: dict[int, list[float]] = {}
    kinds: dict[int, RequestKind] = {}
    for row in data.rows:
      if row.request.kind != RequestKind.REFILL:
        groups.setdefault(row.request_index, []).append(row.actor_value)
        kinds[row.request_index] = row.request.kind
    if not by_kind:
      return list(groups.values())
    out: dict[RequestKind, list[list[float]]] = {}
    for index, values in groups.items():
      out.setdefault(kinds[index], []).append(values)
    return out


def _zero_variance_by_kind(groups_by_kind) -> dict[str, float | None]:
  """The tied share per replayed request kind: ready chunks tie where their end states differ in
  nothing the critic reads, unready and audited groups where the judge scores every continuation
  alike. Every replayed kind has a key (None: no groups of it this step)."""
  return {f'replay/zero_variance_groups/{kind}':
          adv_lib.zero_variance_share(groups_by_kind.get(kind, []))
          for kind in RequestKind if kind != RequestKind.REFILL}


def _by_kind(data: StepData) -> dict[str, float]:
  """New tokens and decoding FLOPs per request kind: where a step's decoding goes (refills are
  never trained on; ready chunks are what AC2 saves against full continuations)."""
  out = {}
  for kind in RequestKind:
    rows = data.rows_of(kind)
    out[f'tokens/{kind}'] = int(sum(len(r.rollout.new_N) for r in rows))
    out[f'flops/{kind}'] = float(sum(r.decoding_flops for r in rows))
  return out


# Jitted, so the per-group arithmetic runs as one program on inputs uploaded explicitly (no
# implicit transfers), and read back with the step's other advantages.
@jax.jit
def _chunk_advantages(values_G, valid_G):
  a_1xG, w_1xG, _ = adv_lib.ac2_chunk_advantages(values_G[None], valid_G[None])
  return a_1xG[0], w_1xG[0]


@jax.jit
def _single_advantages(values_1, valid_1, baselines_1, baseline_valid_1):
  a_1, w_1, _, _ = adv_lib.ac2_single_advantages(values_1, valid_1, baselines_1, baseline_valid_1)
  return a_1, w_1


def _mean(xs) -> float | None:
  return float(np.mean(xs)) if len(xs) else None


def _combined_critic_metrics(updates: list[dict]) -> dict:
  """One step's critic metrics from its updates (device arrays, read with the step's others): the
  mean loss, the records summed, the last gradient norm, the update norms summed (a bound on the
  step's critic displacement, which the learning-rate rule reads), skipped if any was."""
  if len(updates) == 1:
    return updates[0]
  return {'loss': sum(m['loss'] for m in updates) / len(updates),
          'records': sum(m['records'] for m in updates),
          'grad_norm': updates[-1]['grad_norm'],
          'update_norm': sum(m['update_norm'] for m in updates),
          'skipped': functools.reduce(jax.numpy.maximum, [m['skipped'] for m in updates])}
