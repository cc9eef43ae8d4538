"""The packages' environments on the random tiny model (byte tokenizer): smoke runs and the
benchmark's workload, not learning results. KIND: reasoning_gym | frozenlake | taxi |
cliffwalking | blackjack | textarena | custom (an env block of `name` and max_turns, for your own
`MODULE:FUNCTION`, e.g. experiments/examples/my_env.py).

Command:
  python -m experiments.agentic --config=experiments/configs/agentic_runs/envs_tiny.py:KIND \
    --workdir=DIR       # KIND,ppo for PPO; --config.env.FIELD=... for the env block
"""

import ml_collections

from experiments.configs import agentic


def env_block(kind: str) -> ml_collections.ConfigDict:
  """The `env` block of KIND (fields: rlpost/envs/{reasoning_gym,toy_text,textarena_games}.py)."""
  gym = lambda id_, kwargs="": {"name": "gymnasium", "id": id_, "kwargs": kwargs, "max_turns": 3}
  blocks = {
    "reasoning_gym": {
      "name": "reasoning_gym",
      "task": "chain_sum",  # a generator, or name:weight,name:weight for a mixture
      # the generator's own config fields, as a JSON object (a mixture: keyed by name)
      "task_config": '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}',
      "pool": 200,  # training items; held-out items repeating one are dropped
      "seed": 0,
      "checker": "score_answer",  # score_answer | exact | math_verify
      "retries": 0,  # answers after a wrong one (multi-turn with feedback)
    },
    "frozenlake": {**gym("FrozenLake-v1", '{"is_slippery": false}'), "random_map_size": 0},
    "taxi": gym("Taxi-v4"),
    "cliffwalking": gym("CliffWalking-v1"),
    "blackjack": gym("Blackjack-v1"),
    # opponent: a two-player game's player 1, "random" or your MODULE:FUNCTION
    "textarena": {
      "name": "textarena",
      "game": "GuessTheNumber-v0",
      "max_turns": 3,
      "cue": "",
      "opponent": "random",
    },
    # your own MODULE:FUNCTION; its block holds the fields your config takes (the example: max_turns)
    "custom": {"name": "experiments.examples.my_env:make", "max_turns": 1},
  }
  if kind not in blocks:
    raise ValueError(f"Unknown kind {kind!r}; use one of {sorted(blocks)}")
  return ml_collections.ConfigDict(blocks[kind])


def get_config(variant: str = "reasoning_gym") -> ml_collections.ConfigDict:
  kind, _, algo = variant.partition(",")
  algo = algo or "grpo"
  c = agentic.base("frozenlake_tiny", algo, env_block(kind), total_tokens=192)
  c.name = f"envs_tiny:{kind},{algo}"
  c.algo.num_generations = 4
  c.algo.beta = 0.0
  c.rollout.max_turn_tokens = 16
  c.rollout.stop_strings = ()
  c.rollout.max_prompt_tokens = 768
  c.sampling.prompt_bucket = 64
  c.train.steps = 4
  c.train.batch_tasks = 2
  c.train.compute_dtype = "float32"
  c.eval.every, c.eval.num_tasks = 2, 2
  c.log.trajectories_every = 0
  c.checkpoint.every = 1000
  return c
