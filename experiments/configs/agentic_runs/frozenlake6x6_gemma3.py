"""FrozenLake as frozenlake_gemma3 on 6x6 maps (the shortest path: 10 moves), 16 turns,
768 completion slots (~38 Gemma tokens per later turn).

Command:
  python -m experiments.agentic --config=experiments/configs/agentic.py:frozenlake6x6_gemma3 \
    --workdir=DIR

Result: not run yet (`tests/test_agentic.py` checks its longest episode fits its window).
"""

import ml_collections

from experiments.configs import agentic


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  return agentic.frozenlake("frozenlake6x6_gemma3", algo, total_tokens=768, size=6, max_turns=16)
