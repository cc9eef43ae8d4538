"""FrozenLake 4x4 as frozenlake_gemma3 on slippery ice (a move goes to either side of the
one asked for 2 times in 3), 12 turns, 512 completion slots.

Command:
  python -m experiments.agentic \
    --config=experiments/configs/agentic.py:frozenlake_slippery_gemma3 --workdir=DIR

Result: not run yet (`tests/test_agentic.py` checks its longest episode fits its window).
"""

import ml_collections

from experiments.configs import agentic


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  return agentic.frozenlake(
    "frozenlake_slippery_gemma3", algo, total_tokens=512, slippery=True, max_turns=12
  )
