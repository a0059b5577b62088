"""The walk task end to end: `configs/ac2.py:walk` from its own SFT warm start (the walk's solver
corpus and critic examples) through one AC2 step."""

import json
import os

import pytest

from ac2_jax.tasks import walk
from ac2_jax.train import loop
from train_fixtures import SMALL, apply, compile_cache, load_config, read_records  # noqa: F401

pytestmark = pytest.mark.usefixtures('compile_cache')


def test_ac2_walk_one_step_from_its_own_warm_start(tmp_path):
  c = load_config('ac2', 'walk')
  assert c.task.name == 'walk'
  apply(c, {**SMALL, 'sft.steps': 4, 'sft.clean_steps': 1, 'sft.critic_every': 2,
            'sft.batch_size': 4, 'sft.critic_batch_size': 4})
  summary = loop.train(c, str(tmp_path), log=lambda *_: None)
  records = read_records(str(tmp_path))
  assert sorted(records) == [0, 1] and summary.last_step == 1
  assert 0.0 <= summary.start_score <= 1.0 and 0.0 <= summary.final_score <= 1.0
  record = records[1]
  assert record['tokens_generated'] > 0 and record['rows_trained'] > 0
  assert record['critic/pairs'] > 0 and record['critic/skipped_context'] == 0
  # The walk's own data set and warm start, not the chain's.
  assert os.path.isdir(tmp_path / 'data' / 'builtin_walk')
  assert not os.path.exists(tmp_path / 'data' / 'builtin_chain')
  with open(tmp_path / 'sft' / 'sft_done.json') as f:
    assert json.load(f)['steps'] == 4
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['task']['name'] == 'walk'
  assert walk.WalkSettings().goal == c.task.walk_goal
