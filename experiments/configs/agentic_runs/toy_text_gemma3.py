"""gymnasium's FrozenLake-v1 (rlpost.envs.toy_text, gymnasium's own transitions) on the real
Gemma 3 270M: the 4x4 map, not slippery, word moves, 8 turns of at most 4 sampled tokens;
GRPO 2 seeds x 8 episodes per iteration. `--config.env.id=Taxi-v4` (more turns and tokens:
--config.env.max_turns=20 --config.rollout.max_total_tokens=1024) or `Blackjack-v1` for the
others.

Command (issue 67 part 7):
  python -m experiments.agentic \
    --config=experiments/configs/agentic_runs/toy_text_gemma3.py:grpo \
    --config.train.compute_dtype=float32 --workdir=DIR      # :ppo for PPO

Result: not measured yet (issue 67 part 7 reports it here).
"""

import ml_collections

from experiments.configs import agentic


def env_block() -> ml_collections.ConfigDict:
  """The `env` block of gymnasium (fields: rlpost/envs/toy_text.py)."""
  return ml_collections.ConfigDict(
    {
      "name": "gymnasium",
      "id": "FrozenLake-v1",  # FrozenLake-v1 | FrozenLake8x8-v1 | Taxi-v4 | CliffWalking-v1 | ...
      "kwargs": '{"is_slippery": false}',  # the env's own arguments, a JSON object
      "random_map_size": 0,  # n > 0: FrozenLake plays gymnasium's random n x n map per seed
      "random_map_p": 0.8,  # a random map's frozen-cell probability
      "max_turns": 8,
      "invalid_penalty": 0.1,  # subtracted for a reply naming no move
    }
  )


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  c = agentic.base("frozenlake_gemma3", algo, env_block(), total_tokens=448)
  c.name = f"toy_text_gemma3,{algo}"
  c.eval.num_tasks = 50
  return c
