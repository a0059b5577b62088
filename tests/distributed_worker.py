"""One process of the small multi-process checks in test_distributed.py (not a test module).

  python tests/distributed_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID SHARED_DIR JUDGE_URL

Starts JAX's runtime, then exercises what train/distributed.py promises, printing one JSON line:
files prepared under `main_process_first`, the process-0 judge with broadcast grades, a stop flag
raised on one process only (`any_process`), a host batch placed with `sharding.put_batch`
(each device must hold its own rows of the global batch), and how `experiment.validate` judges
asynchronous Li2SAO configs on 2 processes.
"""

import importlib.util
import json
import os
import sys

from ac2_jax.train import distributed


def main(coordinator: str, num_processes: str, process_id: str, shared_dir: str, judge_url: str):
  started = distributed.start(coordinator, int(num_processes), int(process_id))

  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  from ac2_jax import judges, sharding

  path = os.path.join(shared_dir, 'prepared.txt')
  with distributed.main_process_first('prepare'):
    if not os.path.exists(path):
      with open(path, 'w') as f:
        f.write(f'prepared by process {jax.process_index()}')
    with open(path) as f:
      prepared = f.read()

  judge = distributed.MainProcessJudge(judges.HttpJudge(judges.HttpJudgeSettings(
      base_url=judge_url, model='local', max_retries=0)))
  grades = judge.grade_batch([judges.JudgeRequest(problem=f'problem {i}', proof=f'proof {i}')
                              for i in range(5)])
  judge.close()

  # Only the last process asks to stop; all must agree to.
  stop = distributed.any_process(jax.process_index() == jax.process_count() - 1)

  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=-1, tensor=1))
  rows_BxT = np.arange(16 * 3, dtype=np.int32).reshape(16, 3)
  batch = sharding.put_batch({'rows_BxT': rows_BxT, 'scale': np.float32(2.0)}, mesh)
  shards_ok = all(np.array_equal(np.asarray(s.data), rows_BxT[s.index])
                  for s in batch['rows_BxT'].addressable_shards)
  replicated = jax.sharding.NamedSharding(mesh, P())
  total = jax.jit(lambda b: b['scale'] * b['rows_BxT'].sum(), out_shardings=replicated)(batch)

  # In-flight rollouts on several processes: a process-local rollout sub-mesh is required, and a
  # batch must split over the processes.
  from ac2_jax.train import experiment
  spec = importlib.util.spec_from_file_location('configs_li2sao', os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'li2sao.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  async_configs = []
  for devices, problems in ((0, 16), (1, 3), (1, 16)):
    c = module.get_config('async')
    c.rollout.devices, c.li2sao.problems_per_step, c.actor.minibatches = devices, problems, 1
    try:
      async_configs.append(f'training mesh {experiment.validate(c).mesh_shape}')
    except experiment.ConfigError as e:
      async_configs.append(str(e))

  print(json.dumps({
      'started': started, 'process': jax.process_index(), 'prepared': prepared,
      'points': [g.points for g in grades], 'global_shape': list(batch['rows_BxT'].shape),
      'fully_addressable': batch['rows_BxT'].is_fully_addressable, 'shards_ok': shards_ok,
      'sum': float(total), 'stop': stop, 'async_configs': async_configs}), flush=True)


if __name__ == '__main__':
  main(*sys.argv[1:])
