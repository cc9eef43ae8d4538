"""FrozenLake 4x4 as frozenlake_gemma3 whose observations also say what each move leads to
(`Around you: left edge, down hole, right frozen, up start.`; env.neighbours): ~16 more
tokens per observation, 512 completion slots.

Command:
  python -m experiments.agentic --config=experiments/configs/agentic.py:frozenlake_near_gemma3 \
    --workdir=DIR        # ,ppo for PPO

Result (greedy, 100 held-out maps; experiments/results/frozenlake_shaping.md): GRPO 0 / 100
at 10 iterations (the base model answers `right` everywhere); PPO 1 success in 80 sampled
episodes (stopped at 5). A policy reading only this line solves 91 of the maps
(`python -m experiments.frozenlake_baselines`).
"""

import ml_collections

from experiments.configs import agentic


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  return agentic.frozenlake("frozenlake_near_gemma3", algo, total_tokens=512, neighbours=True)
