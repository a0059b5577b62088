"""Time of the AC2 controller's host work in a paper-sized step (goal: plan + observe under 50 ms).

  python launch/bench.py controller [--steps N] [--problems P]

Paper settings (192 refills + 192 replay slots, group 16, budget 50k tokens). Warm-up steps with
scripted results fill the replay buffer (256 trajectories of 5k-50k tokens) and the critic buffer
(1,920 pairs) and make part of the problems ready, so timed steps contain refills, unready groups,
ready chunks and audits. Building the scripted results is not timed.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ac2_jax.controller import (Continuation, Controller, ControllerSettings, RequestKind,
                                RequestResult, StepPlan, ValueSource)


def _results(plan: StepPlan, pool: np.ndarray, rng: np.random.Generator) -> list[RequestResult]:
  """Even problems are solved (value 1), odd ones half-solved; the critic predicts the target."""
  results = []
  for request in plan.requests:
    solved = int(request.problem_id) % 2 == 0
    value = 1.0 if solved else 0.5
    continuations = []
    for _ in range(request.num_continuations):
      if request.kind == RequestKind.READY_CHUNK:
        continuations.append(Continuation(value, ValueSource.CRITIC))
        continue
      points = 7 if solved else 4
      tokens = None
      if request.kind == RequestKind.REFILL:
        tokens = pool[:int(rng.integers(5_000, 50_000))]
      continuations.append(Continuation(value, ValueSource.JUDGE, points, True, tokens,
                                        'reference' if solved else None))
    prefix_value = value if request.needs_prefix_value else None
    results.append(RequestResult(tuple(continuations), prefix_value))
  return results


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py controller')
  parser.add_argument('--steps', type=int, default=5, help='timed steps')
  parser.add_argument('--problems', type=int, default=5_200,
                      help='training problems (FineProofs-RL has about 5,200)')
  args = parser.parse_args(argv)

  settings = ControllerSettings()
  controller = Controller(settings, seed=0, problem_ids=range(args.problems))
  pool = np.arange(settings.response_budget, dtype=np.int32)
  rng = np.random.default_rng(0)
  step = 0
  while (len(controller.critic_buffer) < settings.critic_buffer_capacity or step < 12
         or len(controller.replay) < settings.buffer_capacity):
    plan = controller.plan(step)
    controller.observe(step, _results(plan, pool, rng))
    step += 1
  print(f'warm-up: {step} steps; replay buffer {len(controller.replay)}/'
        f'{settings.buffer_capacity}, critic buffer {len(controller.critic_buffer)}/'
        f'{settings.critic_buffer_capacity}, ready problems {controller.readiness.num_ready}, '
        f'bank {len(controller.bank)}')

  plan_ms, observe_ms, batch_ms = [], [], []
  for _ in range(args.steps):
    start = time.perf_counter()
    plan = controller.plan(step)
    plan_ms.append(1e3 * (time.perf_counter() - start))
    results = _results(plan, pool, rng)
    start = time.perf_counter()
    controller.observe(step, results)
    observe_ms.append(1e3 * (time.perf_counter() - start))
    start = time.perf_counter()
    batch = controller.critic_batch(step)
    batch_ms.append(1e3 * (time.perf_counter() - start))
    kinds = {k.value: plan.count(k) for k in RequestKind}
    print(f'step {step}: requests {kinds}, continuations {plan.num_continuations}, '
          f'critic records {len(batch.records)}')
    step += 1
  start = time.perf_counter()
  text = json.dumps(controller.state_dict())
  save_ms = 1e3 * (time.perf_counter() - start)

  total = np.add(plan_ms, observe_ms)
  print(f'plan          median {np.median(plan_ms):7.2f} ms   max {np.max(plan_ms):7.2f} ms')
  print(f'observe       median {np.median(observe_ms):7.2f} ms   max {np.max(observe_ms):7.2f} ms')
  print(f'plan+observe  median {np.median(total):7.2f} ms   max {np.max(total):7.2f} ms   '
        f'(goal < 50 ms: {"met" if np.max(total) < 50 else "MISSED"})')
  print(f'critic_batch  median {np.median(batch_ms):7.2f} ms   '
        f'({settings.critic_pairs_per_update} pairs)')
  print(f'state_dict + json.dumps {save_ms:7.1f} ms, {len(text) / 1e6:.1f} MB')
