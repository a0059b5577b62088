"""What a workdir remembers of its run: the accepted config, and which of its keys a resume may change.

`loop.train` writes the accepted config to WORKDIR/config.json (and into every checkpoint's host
state). A later run in the same workdir resumes that run, so a config that differs in anything
that changes what the run computes (algorithm, model, task, seed, batch sizes, ...) is refused
with the list of differing keys, unless the caller allows it explicitly
(`launch/tpu_run.py --allow_config_change`). Only the keys in `RESUMABLE_KEYS` may change freely:
how long the run goes and how often it evaluates, logs and saves.
"""

from __future__ import annotations

import json
import os
from typing import Any

CONFIG_FILE = 'config.json'

# Keys that change when and how much a run reports or saves, or how it reaches its judge, never
# what a step computes. Everything else is part of the run's identity.
RESUMABLE_KEYS = frozenset({
    'num_steps',          # extend (or shorten) a run
    'checkpoint_every',
    'checkpoints_kept',
    'log_every',
    'eval.every',
    'dry_run',
    'compilation_cache_dir',  # where compiled programs are kept, not what they compute
    'judge.max_concurrency',
    'judge.timeout_s',
    'judge.api_key_env',
    # How the sampler groups a step's rows into calls; the tokens are the same either way.
    'controller.chunk_calls',
})


class ResumeRefused(ValueError):
  """The workdir holds a run of another config (one line naming the differing keys)."""


def flatten(tree: Any, prefix: str = '') -> dict[str, Any]:
  """{'a': {'b': 1}} -> {'a.b': 1}."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  out = {}
  for key, value in tree.items():
    out.update(flatten(value, f'{prefix}.{key}' if prefix else str(key)))
  return out


# Keys added after runs were first written, with the value that reproduces a run stored without
# them: such a run resumes unchanged when the key still has that value, and is refused otherwise.
ADDED_KEYS = {'task.rl_problems': 0, 'controller.bank_from_data': False,
              'value_critic.init_checkpoint': '', 'rollout.mode': 'sync',
              'rollout.devices': 0, 'critic.adapter_rank': 0,
              'controller.readiness_judged_only': False, 'sft.critic_from': -1,
              'controller.readiness_revocable': False, 'controller.chunk_end_pairs': 0,
              'controller.critic_updates': 1, 'sft.clean_loss_target': 0.0,
              'sft.clean_steps_max': 0, 'sft.noisy_tail_steps': 0,
              'sft.noisy_tail_learning_rate': 6e-4, 'critic.warmup': '',
              'critic.warmup_learning_rate': 3e-4, 'critic.warmup_pairs_per_update': 64,
              'critic.warmup_mistake_rate': -1.0, 'critic.target': 'rounded',
              'critic.self_check': False, 'critic.reference_check': False, 'task.builtin_labels': False,
              'controller.cut_before_uncredited': False,
              'controller.chunk_through_uncredited': False,
              'controller.cut_at_uncredited': False, 'controller.audit_gate': False,
              'controller.audit_gate_corr': 0.3, 'controller.audit_gate_rows': 32,
              'controller.critic_judged_only': False, 'controller.audit_scale': False,
              'controller.audit_scale_max': 3.0, 'controller.train_refills': False,
              'controller.critic_plain_twin': True}
# Sections added with algorithms that a stored run without them cannot have used (ADDED_KEYS
# first: a key added to a section later is held to its old value).
ADDED_SECTIONS = ('ppo.', 'pact.', 'value_critic.', 'lisao.', 'li2sao.', 'rollout.')


def differences(old: dict, new: dict) -> list[str]:
  """'key (old -> new)' for every key outside RESUMABLE_KEYS whose value differs."""
  a, b = flatten(old), flatten(new)
  for k in set(b) - set(a):
    if k in ADDED_KEYS:
      a[k] = ADDED_KEYS[k]
    elif k.startswith(ADDED_SECTIONS):
      a[k] = b[k]
  missing = '(absent)'
  return [f'{k} ({a.get(k, missing)!r} -> {b.get(k, missing)!r})'
          for k in sorted(set(a) | set(b))
          if k not in RESUMABLE_KEYS and a.get(k, missing) != b.get(k, missing)]


def has_checkpoints(workdir: str) -> bool:
  directory = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(directory) and any(n.isdigit() for n in os.listdir(directory))


def check_resume(workdir: str, config_json: str, *, allow_change: bool = False,
                 log=print) -> None:
  """Raises ResumeRefused when `workdir` holds checkpoints of a config that differs from
  `config_json` in a key outside RESUMABLE_KEYS (unless `allow_change`). Writes nothing."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not has_checkpoints(workdir) or not os.path.exists(path):
    return
  try:
    with open(path) as f:
      stored = json.load(f)
  except (OSError, ValueError) as e:
    raise ResumeRefused(f'{path}: the config of the run in this workdir does not read '
                        f'({type(e).__name__}: {e}); restore it, or use another workdir') from None
  diff = differences(stored, json.loads(config_json))
  if not diff:
    return
  if allow_change:
    log(f'resuming with a changed config (--allow_config_change): {"; ".join(diff)}')
    return
  raise ResumeRefused(
      f'{workdir} holds a run of another config; these keys differ: {"; ".join(diff)}. Resume '
      'with the same config, pass --allow_config_change to resume anyway, or use another '
      f'workdir (keys that may change on resume: {", ".join(sorted(RESUMABLE_KEYS))})')


def write_config(workdir: str, config_json: str) -> None:
  """WORKDIR/config.json, written whole (a temporary file renamed over it)."""
  path = os.path.join(workdir, CONFIG_FILE)
  with open(path + '.tmp', 'w') as f:
    f.write(config_json)
  os.replace(path + '.tmp', path)
