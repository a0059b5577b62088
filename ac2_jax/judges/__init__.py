"""Judges: grade parsing, the proof judge's templates, and the HTTP (OpenAI-compatible) judge.

Deterministic verifiers for the built-in task live beside these (see that task's module).
"""

from ac2_jax.judges.grading import MAX_POINTS, Grade, parse_points
from ac2_jax.judges.http import HttpJudge, HttpJudgeSettings
from ac2_jax.judges.templates import JudgeRequest
