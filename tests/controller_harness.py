"""Scripted stand-in for the sampler, judge and critic, to drive the AC2 controller in tests.

Each test says, per request, what the continuations score and what the critic predicts at the
prefix; the harness turns that into RequestResults exactly as the trainer would.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ac2_jax.controller import (Continuation, Controller, ControllerSettings, GenerationRequest,
                                RequestKind, RequestResult, StepPlan, ValueSource)

# Per request: the endpoint value of continuation j (None = invalid), or the prefix prediction.
ValueFn = Callable[[GenerationRequest, int], float | None]
PrefixFn = Callable[[GenerationRequest], float | None]


def tiny_settings(**changes) -> ControllerSettings:
  """Token counts of tens, groups of 4: every rule of the paper settings, small enough to script."""
  base = dict(group_size=4, n_batch=6, n_refill=6, buffer_capacity=12, response_budget=50,
              chunk_size=10, cut_grid=10, critic_buffer_capacity=40, critic_pairs_per_update=16,
              min_valid_per_target=2)
  base.update(changes)
  return ControllerSettings(**base)


def refill_length(request: GenerationRequest) -> int:
  """A response length that varies by problem (and stays within the budget of tiny_settings)."""
  return 20 + 7 * (int(str(request.problem_id)[1:]) % 5)


def make_results(plan: StepPlan, settings: ControllerSettings, *,
                 value: ValueFn = lambda r, j: 0.5, prefix: PrefixFn = lambda r: 0.5,
                 length: Callable[[GenerationRequest], int] = refill_length,
                 reference: Callable[[GenerationRequest, int], Any] | None = None,
                 cut_end: Callable[[GenerationRequest], int | None] = lambda r: None,
                 chunk_end: Callable[[GenerationRequest], int | None] = lambda r: None,
                 audit_read: Callable[[GenerationRequest, int], float | None] | None = None,
                 ) -> list[RequestResult]:
  """Results for every request: judged values become points = round(7 v) with a complete answer.
  `audit_read`: every audited continuation ran past its chunk, and the critic read this there."""
  results = []
  for request in plan.requests:
    continuations = []
    for j in range(request.num_continuations):
      v = value(request, j)
      critic = request.critic_may_score and request.kind == RequestKind.READY_CHUNK
      points = None if critic or v is None else int(round(v * settings.max_points))
      passed = points is not None and points >= settings.pass_points
      ref = None
      if passed:
        ref = reference(request, j) if reference else f'{request.problem_id}@{plan.step}.{j}'
      tokens = end = reach = None
      if request.kind == RequestKind.REFILL:
        tokens = (np.arange(length(request)) + 1000 * plan.step).astype(np.int32)
        end, reach = cut_end(request), chunk_end(request)
      source = ValueSource.CRITIC if critic else ValueSource.JUDGE
      read = audit_read is not None and request.kind == RequestKind.AUDIT
      continuations.append(Continuation(value=v, source=source, points=points,
                                        complete_answer=not critic, tokens_N=tokens, reference=ref,
                                        cut_end=end, chunk_end=reach, chunk_end_read=read,
                                        chunk_end_value=audit_read(request, j) if read else None))
    results.append(RequestResult(tuple(continuations),
                                 prefix(request) if request.needs_prefix_value else None))
  return results


def run_step(controller: Controller, step: int, **kwargs):
  plan = controller.plan(step)
  return plan, controller.observe(step, make_results(plan, controller.settings, **kwargs))


def problem_ids(n: int) -> list[str]:
  return [f'p{i}' for i in range(n)]
