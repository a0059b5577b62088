"""AC2 (and Prefix GRPO): one training step, from the controller's plan to the three updates.

  plan -> one batched sampler call -> routing (critic or judge) -> critic reads with the weights from
  before the update -> observe -> entropy control -> advantages on the whole batch -> actor
  minibatch 1 -> critic update -> actor minibatch 2 -> critic learning-rate control.

Prefix GRPO is the same machinery with the critic switched off: every prefix gets g full
continuations scored by the judge and GRPO advantages (mean-centred terminal rewards); since no
critic value is ever read, no problem becomes ready.
"""

from __future__ import annotations

import jax
import numpy as np

from ac2_jax import controller as ctl
from ac2_jax import sampling
from ac2_jax.algorithms import rollouts
from ac2_jax.algorithms import timing
from ac2_jax.controller.steps import RequestKind, ValueSource
from ac2_jax.rl import advantages as adv_lib
from ac2_jax.train.runtime import Runtime


class AC2:
  """Holds the host-side controller; `step` runs one training step."""

  def __init__(self, rt: Runtime, settings: ctl.ControllerSettings, seed: int, *,
               use_critic: bool = True):
    self.settings = settings
    self.use_critic = use_critic
    self.controller = ctl.Controller(settings, seed, [r.id for r in rt.train_records])
    self._index = {r.id: i for i, r in enumerate(rt.train_records)}

  def state_dict(self) -> dict:
    return self.controller.state_dict()

  def load_state_dict(self, data: dict) -> None:
    self.controller.load_state_dict(data)

  @property
  def critic_lr(self) -> float:
    return self.controller.critic_lr.lr

  def _reference(self, problem_id) -> str | None:
    return None if self.settings.no_reference else self.controller.reference(problem_id)

  def step(self, rt: Runtime, state, step: int, key: jax.Array):
    timer = timing.PhaseTimer()
    with timer('controller'):
      plan = self.controller.plan(step)
    requests = plan.requests
    owner, contexts, prefix_lens, pidx, caps, budgets = [], [], [], [], [], []
    for r, req in enumerate(requests):
      p = self._index[req.problem_id]
      context = np.concatenate([rt.train_prompts[p], req.prefix_tokens_P]).astype(np.int32)
      for _ in range(req.num_continuations):
        owner.append(r)
        contexts.append(context)
        prefix_lens.append(req.cut)
        pidx.append(p)
        caps.append(req.max_new_tokens)
        budgets.append(req.remaining_budget)
    with timer('generate'):
      rows, flops = rollouts.generate_rows(rt, state.params, contexts, prefix_lens, pidx, caps,
                                           budgets, key, rt.train_sampling)
    texts = rollouts.response_texts(rt, rows)

    # Routing (ALGORITHMS.md AC2 item 3).
    to_critic = [self.use_critic and requests[owner[i]].critic_may_score
                 and row.stop_reason == 'chunk_cap' and not rt.task.has_complete_answer(texts[i])
                 for i, row in enumerate(rows)]
    judged = [i for i in range(len(rows)) if not to_critic[i]]
    with timer('judge'):
      grades = dict(zip(judged, rt.task.score_batch(
          [rt.train_records[rows[i].problem_index] for i in judged], [texts[i] for i in judged])))

    # Critic reads, all with the pre-update weights: endpoints, then V(s) at the prefixes.
    read_prompts, read_responses, read_refs = [], [], []
    endpoint_rows = [i for i in range(len(rows)) if to_critic[i]]
    prefix_reqs = ([r for r, req in enumerate(requests) if req.needs_prefix_value]
                   if self.use_critic else [])
    for i in endpoint_rows:
      row = rows[i]
      read_prompts.append(rt.train_prompts[row.problem_index])
      read_responses.append(np.concatenate([row.context_P[row.prompt_len:], row.new_N]))
      read_refs.append(self._reference(requests[owner[i]].problem_id))
    for r in prefix_reqs:
      req = requests[r]
      read_prompts.append(rt.train_prompts[self._index[req.problem_id]])
      read_responses.append(req.prefix_tokens_P)
      read_refs.append(self._reference(req.problem_id))
    with timer('critic_reads'):
      values = rollouts.critic_reader(rt.critic_readout)(rt, state.params, read_prompts,
                                                         read_responses, read_refs)
    endpoint_value = dict(zip(endpoint_rows, values[:len(endpoint_rows)]))
    prefix_value = dict(zip(prefix_reqs, values[len(endpoint_rows):]))

    # Scored results for the controller; actor values alongside.
    actor_value = np.zeros(len(rows), np.float32)
    actor_valid = np.ones(len(rows), bool)
    per_request = [[] for _ in requests]
    for i, row in enumerate(rows):
      if to_critic[i]:
        v = endpoint_value[i]
        actor_valid[i] = v is not None
        actor_value[i] = 0.0 if v is None else v
        c = ctl.Continuation(v, ValueSource.CRITIC, tokens_N=row.new_N)
      else:
        g = grades[i]
        complete = rt.task.has_complete_answer(texts[i])
        actor_value[i] = g.reward  # a failed judge call is reward 0 in the actor loss
        passing = g.valid and g.points >= self.settings.pass_points and complete
        c = ctl.Continuation(g.reward if g.valid else None, ValueSource.JUDGE,
                             points=g.points if g.valid else None, complete_answer=complete,
                             tokens_N=row.new_N,
                             reference=rt.task.reference_from_response(texts[i]) if passing else None)
      per_request[owner[i]].append(c)
    results = [ctl.RequestResult(tuple(cs), prefix_value.get(r)) for r, cs in enumerate(per_request)]
    with timer('controller'):
      outcome = self.controller.observe(step, results)

    # Adaptive entropy control over rows with an empty prefix, before the actor update.
    empty = [r for r in rows if r.prefix_len == 0 and len(r.entropies_N)]
    entropy = (float(np.mean(np.concatenate([r.entropies_N for r in empty]))) if empty else None)
    eps_high = self.controller.entropy.update(entropy)

    self._assign_advantages(rows, owner, requests, actor_value, actor_valid, prefix_value)

    with timer('actor_updates'):
      state, m1 = rollouts.train_actor(rt, state, rows, eps_high, 0)
    critic_metrics = {}
    if self.use_critic:
      with timer('critic_update'):
        state, critic_metrics = self._critic_update(rt, state, step)
    with timer('actor_updates'):
      state, m2 = rollouts.train_actor(rt, state, rows, eps_high, 1)
    if self.use_critic and 'update_norm' in critic_metrics:
      self.controller.critic_lr.observe(critic_metrics['update_norm'], m1.get('update_norm', 0.0),
                                        m2.get('update_norm', 0.0),
                                        finite=critic_metrics['skipped'] == 0.0)

    trained = [r for r in rows if r.weight > 0]
    groups = {}
    for i, r in enumerate(owner):
      if requests[r].kind != RequestKind.REFILL:
        groups.setdefault(r, []).append(actor_value[i])
    refills = [i for i in range(len(rows)) if requests[owner[i]].kind == RequestKind.REFILL]
    metrics = {
        **{k: v for k, v in outcome.stats.as_dict().items()
           if self.use_critic or 'critic' not in k},
        'entropy': entropy, 'eps_high': eps_high,
        'reward/judged_mean': _mean([grades[i].reward for i in judged]),
        'replay/zero_variance_groups': adv_lib.zero_variance_share(list(groups.values())),
        'reward/refill_mean': _mean([grades[i].reward for i in refills if i in grades]),
        'judge_failures': sum(not g.valid for g in grades.values()),
        'routed_to_critic': len(endpoint_rows),
        'critic_reads_invalid': sum(v is None for v in values),
        'adv/mean': _mean([r.advantage for r in trained]),
        'adv/abs_mean': _mean([abs(r.advantage) for r in trained]),
        'rows_trained': len(trained),
        'tokens_generated': int(sum(len(r.new_N) for r in rows)),
        'decoding_flops': flops,
        **{f'actor1/{k}': v for k, v in m1.items()}, **{f'actor2/{k}': v for k, v in m2.items()},
        **{f'critic/{k}': v for k, v in critic_metrics.items()},
        **timer.metrics(),
    }
    if self.use_critic:
      metrics['critic_lr'] = self.controller.critic_lr.lr
    return state, metrics

  def _assign_advantages(self, rows, owner, requests, actor_value, actor_valid, prefix_value):
    """A_i = v_i - mean_j v_j per group (invalid reads: weight 0, filled); group-1 singles v - V(s)."""
    by_request = {}
    for i, r in enumerate(owner):
      by_request.setdefault(r, []).append(i)
    for r, members in by_request.items():
      req = requests[r]
      if req.kind == RequestKind.REFILL:
        continue  # refills fill the replay buffer and are never trained on
      if req.num_continuations == 1 and req.kind == RequestKind.READY_CHUNK:
        baseline = prefix_value.get(r)
        a, w, _, _ = adv_lib.ac2_single_advantages(
            actor_value[members], actor_valid[members],
            np.array([0.0 if baseline is None else baseline]), np.array([baseline is not None]))
      else:
        a, w, _ = adv_lib.ac2_chunk_advantages(actor_value[members][None],
                                               actor_valid[members][None])
        a, w = a[0], w[0]
      for k, i in enumerate(members):
        rows[i].advantage = float(a[k])
        rows[i].weight = float(w[k])

  def _critic_update(self, rt: Runtime, state, step: int):
    limit = rt.max_total_len

    def fits(record) -> bool:
      context = rt.critic_context(rt.prompt_ids_by_id[record.problem_id], record.prefix_tokens_P,
                                  record.reference)
      return len(context) + sampling.MAX_VALUE_TOKENS <= limit

    batch = self.controller.critic_batch(step, fits)
    device_batch = rollouts.critic_records_batch(rt, batch.records)
    if device_batch is None:
      return state, {'pairs': 0, 'skipped_context': batch.num_skipped}
    state, metrics = rt.critic_step(state, device_batch, np.float32(self.controller.critic_lr.lr))
    return state, {**{k: float(v) for k, v in metrics.items()}, 'pairs': batch.num_pairs,
                   'skipped_context': batch.num_skipped}


def _mean(xs) -> float | None:
  return float(np.mean(xs)) if len(xs) else None
