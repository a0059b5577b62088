"""AC2 host controller (plain Python and numpy, no JAX): what to generate each step, what to keep.

Start at planner.Controller; the exchanged data types live in steps.py.
"""

from ac2_jax.controller.critic_buffer import ChunkEnd, CriticBatch, CriticRecord
from ac2_jax.controller.planner import Controller
from ac2_jax.controller.schedules import CriticLRController, EntropyController
from ac2_jax.controller.settings import ControllerSettings
from ac2_jax.controller.steps import (Continuation, GenerationRequest, RequestKind, RequestResult,
                                      StepOutcome, StepPlan, StepStats, ValueSource)

__all__ = [
    'ChunkEnd', 'Continuation', 'Controller', 'ControllerSettings', 'CriticBatch',
    'CriticLRController', 'CriticRecord', 'EntropyController', 'GenerationRequest', 'RequestKind',
    'RequestResult', 'StepOutcome', 'StepPlan', 'StepStats', 'ValueSource',
]
