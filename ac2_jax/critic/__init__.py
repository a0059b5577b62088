"""ac2_jax.critic: the critic prompt at token level, the value grid, parsing the critic's reply."""

from ac2_jax.critic.prompt import (CriticInstructions, PROOF_INSTRUCTIONS, critic_context_ids,
                                   two_hot_target_ids, value_target_ids, verdict_rationale,
                                   with_rationale)
from ac2_jax.critic.values import (GRID, TARGETS, format_value, parse_value, round_to_grid,
                                   round_to_grid_array, two_hot)

__all__ = [
    'CriticInstructions', 'GRID', 'PROOF_INSTRUCTIONS', 'TARGETS', 'critic_context_ids',
    'format_value', 'parse_value', 'round_to_grid', 'round_to_grid_array', 'two_hot',
    'two_hot_target_ids', 'value_target_ids', 'verdict_rationale', 'with_rationale',
]
