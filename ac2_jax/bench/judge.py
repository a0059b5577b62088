"""HTTP judge throughput: grades/s against a local OpenAI-compatible server with fixed latency.

  python launch/bench.py judge [--requests 1280] [--concurrency 32] [--latency_ms 50]

The server (`judges.local_server`, a real ThreadingHTTPServer on 127.0.0.1) sleeps `latency_ms`
per request, like a remote judge model, then answers with points. Goal: at least 200 grades/s at
concurrency 32 and 50 ms. Printed beside it: the ideal rate (concurrency / latency), the share of
it reached, and the speed-up over one request at a time.
"""

from __future__ import annotations

import argparse
import time

from ac2_jax.judges import local_server
from ac2_jax.judges.http import HttpJudge, HttpJudgeSettings
from ac2_jax.judges.templates import JudgeRequest

GOAL_GRADES_PER_S = 200.0


def _rate(base_url: str, concurrency: int, n: int) -> tuple[float, int]:
  """(grades/s, number of valid grades) for `n` requests at `concurrency`."""
  settings = HttpJudgeSettings(base_url, 'bench-judge', max_concurrency=concurrency,
                               timeout_s=30.0, backoff_base_s=0.05)
  requests = [JudgeRequest(f'Problem {i}: prove it.', f'Proof {i}.') for i in range(n)]
  with HttpJudge(settings) as judge:
    judge.grade_batch(requests[:concurrency])  # warm-up: threads and keep-alive connections
    start = time.perf_counter()
    grades = judge.grade_batch(requests)
    elapsed = time.perf_counter() - start
  return n / elapsed, sum(g.valid for g in grades)


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py judge', description=__doc__.split('\n')[0])
  parser.add_argument('--requests', type=int, default=1280)
  parser.add_argument('--concurrency', type=int, default=32)
  parser.add_argument('--latency_ms', type=float, default=50.0)
  parser.add_argument('--serial_requests', type=int, default=20,
                      help='requests for the one-at-a-time baseline')
  args = parser.parse_args(argv)
  latency_s = args.latency_ms / 1000.0

  def reply(_):
    return local_server.Reply(
        200, local_server.completion_body('Sound argument.\n<points>6 out of 7</points>'),
        delay_s=latency_s)

  with local_server.LocalChatServer(reply) as server:
    rate, valid = _rate(server.base_url, args.concurrency, args.requests)
    serial, _ = _rate(server.base_url, 1, args.serial_requests)
  ideal = args.concurrency / latency_s if latency_s > 0 else float('inf')
  print(f'judge: {args.requests} requests, concurrency {args.concurrency}, '
        f'server latency {args.latency_ms:g} ms')
  print(f'  grades/s            {rate:8.1f}   ({valid}/{args.requests} valid)')
  print(f'  ideal grades/s      {ideal:8.1f}   (concurrency / latency); reached {rate / ideal:.2f}')
  print(f'  serial grades/s     {serial:8.1f}   speed-up x{rate / serial:.1f}')
  status = 'met' if rate >= GOAL_GRADES_PER_S else 'MISSED'
  print(f'  goal >= {GOAL_GRADES_PER_S:.0f} grades/s: {status}')
