"""FrozenLake on a random tiny model: the fixed non-slippery 2x2 map "SF,HG" (right, then
down), one-letter actions (L, D, R, U), 3 turns, 16 episodes per iteration.

Command (the CI test `tests/test_agentic.py` runs shortened versions):
  python -m experiments.agentic --config=experiments/configs/agentic.py:frozenlake_tiny \
    --workdir=DIR        # ,ppo for PPO

Result (AMD EPYC, 2 cores; experiments/results/frozenlake_tiny.md): GRPO greedy success on
the held-out seed 1.0 from iteration 69 of 80 (~70 s of rollout + training); PPO 1.0 over
iterations 61-80 (~117 s).
"""

import ml_collections

from experiments.configs import agentic


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  c = agentic.base("frozenlake_tiny", algo, agentic.frozenlake_env(tiny=True), total_tokens=128)
  if algo != "ppo":
    c.algo.num_generations = 16
  c.algo.beta = 0.0  # no reference pass: the tiny task has nothing to stay close to
  c.rollout.max_turn_tokens = 1
  c.rollout.stop_strings = ()
  c.rollout.max_prompt_tokens = 256
  c.rollout.fixed_shapes = True
  c.sampling.prompt_bucket = 32
  c.train.steps = 80
  c.train.batch_tasks = 16 if algo == "ppo" else 1
  c.train.learning_rate = 1e-2
  c.train.compute_dtype = "float32"
  c.eval.every, c.eval.num_tasks = 1, 1
  return c
