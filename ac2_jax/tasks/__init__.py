"""Tasks: the Task protocol (base.py), the built-in chain and walk tasks, proof data sets."""

from ac2_jax.tasks.base import ProblemRecord, SPLITS, Task, answer_block, render_prompt
from ac2_jax.tasks.builtin import BuiltinTask, ChainSettings
from ac2_jax.tasks.builtin_sft import sft_examples
from ac2_jax.tasks.builtin_tfds import build_builtin
from ac2_jax.tasks.walk import WalkSettings, WalkTask

__all__ = ['ProblemRecord', 'SPLITS', 'Task', 'answer_block', 'render_prompt', 'BuiltinTask',
           'ChainSettings', 'sft_examples', 'build_builtin', 'WalkSettings', 'WalkTask']
