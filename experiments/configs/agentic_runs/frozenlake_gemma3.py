"""FrozenLake 4x4 with the real Gemma 3 270M: maps drawn from the task seed (holes with
probability 0.2, a path always exists), word actions after the cue `Your move:`, 8 turns of
at most 4 sampled tokens; GRPO 2 maps x 8 episodes per iteration, PPO 16 maps x 1.

Command:
  python -m experiments.agentic --config=experiments/configs/agentic.py:frozenlake_gemma3 \
    --config.train.steps=30 --config.eval.every=15 --config.train.compute_dtype=float32 \
    --workdir=DIR        # ,ppo for PPO (--config.eval.every=10)

Result (greedy, 100 held-out maps; experiments/results/frozenlake_gemma3.md): base model
0 / 100; GRPO 37 / 100 after 30 iterations; PPO with these defaults (session 33) 37 / 100
at 20 and 30, its critic explaining 0.37 of the returns' variance. 37 is the map-blind
down/right staircase (experiments/results/frozenlake_ppo.md).
"""

import ml_collections

from experiments.configs import agentic


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  return agentic.frozenlake("frozenlake_gemma3", algo)
