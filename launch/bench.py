"""Benchmarks, each printing ratios measured side by side in one run.

  python launch/bench.py sampler      # our sampler vs transformers.generate, each in its own
                                      # process, against the machine's measured peaks
  python launch/bench.py decode_profile   # where one decode step's time goes, by group
  python launch/bench.py decode_segments  # a long generation: cache grown in segments vs whole
  python launch/bench.py train        # actor and critic updates of tiny and small vs the matmul
                                      # peak, and what bounds them
  python launch/bench.py steps        # whole AC2, Prefix GRPO and GRPO steps by phase, in turn
  python launch/bench.py kernels      # Pallas attention vs XLA attention (needs a GPU)
  python launch/bench.py controller   # plan + observe of a paper-sized AC2 step
  python launch/bench.py judge        # HTTP judge grades/s against a local 50 ms server
  python launch/bench.py critic --workdir=DIR   # can the critic judge the policy's prefixes?
  python launch/bench.py critic_exact --workdir=DIR   # can it learn exact prefix values at all?
  python launch/bench.py critic_update --workdir=DIR  # a critic update split by length vs not
  python launch/bench.py critic_reads --workdir=DIR   # a step's critic reads sorted by length vs not
  python launch/bench.py critic_drift --checkpoint=RUN  # what moved a run's critic: its update,
                                      # or the actor's updates of the weights it reads
  python launch/bench.py chain_errors --checkpoint=RUN  # where a chain policy's lines go wrong
"""

import sys


def _run(name: str, argv: list[str]) -> None:
  # Explicit imports: each benchmark pulls in only what it measures.
  if name == 'sampler':
    from ac2_jax.bench import sampler as bench
  elif name == 'decode_profile':
    from ac2_jax.bench import decode_profile as bench
  elif name == 'decode_segments':
    from ac2_jax.bench import decode_segments as bench
  elif name == 'train':
    from ac2_jax.bench import train as bench
  elif name == 'steps':
    from ac2_jax.bench import steps as bench
  elif name == 'kernels':
    from ac2_jax.bench import kernels as bench
  elif name == 'controller':
    from ac2_jax.bench import controller as bench
  elif name == 'judge':
    from ac2_jax.bench import judge as bench
  elif name == 'critic':
    from ac2_jax.bench import critic as bench
  elif name == 'critic_exact':
    from ac2_jax.bench import critic_exact as bench
  elif name == 'critic_update':
    from ac2_jax.bench import critic_update as bench
  elif name == 'critic_reads':
    from ac2_jax.bench import critic_reads as bench
  elif name == 'critic_drift':
    from ac2_jax.bench import critic_drift as bench
  elif name == 'chain_errors':
    from ac2_jax.bench import chain_errors as bench
  else:
    raise SystemExit(f'unknown benchmark {name!r}; choose sampler, decode_profile, '
                     'decode_segments, train, steps, kernels, controller, judge, critic, '
                     'critic_exact, critic_update, critic_reads, critic_drift or chain_errors')
  bench.main(argv)


if __name__ == '__main__':
  if len(sys.argv) < 2:
    raise SystemExit(__doc__)
  _run(sys.argv[1], sys.argv[2:])
