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


def _gym(id_: str, kwargs: str = "") -> dict:
  return {
    "name": "gymnasium",
    "id": id_,
    "kwargs": kwargs,  # the gymnasium constructor's arguments, a JSON object
    "random_map_size": 0,  # FrozenLake: n > 0 plays a random n x n map per seed
    "random_map_p": 0.8,  # a random map's frozen-cell probability
    "max_turns": 3,
    "invalid_penalty": 0.1,  # a reply naming no move (or several)
  }


# KIND -> its `env` block (fields: rlpost/envs/{reasoning_gym,toy_text,textarena_games}.py)
BLOCKS = {
  "reasoning_gym": {
    "name": "reasoning_gym",
    "task": "chain_sum",  # a generator, or name:weight,name:weight for a mixture
    # the generator's own config fields, as a JSON object (a mixture: keyed by name)
    "task_config": '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}',
    "pool": 200,  # training items; held-out items repeating one are dropped
    "seed": 0,
    "checker": "score_answer",  # score_answer | exact | math_verify
    "retries": 0,  # answers after a wrong one (multi-turn with feedback)
    "answer_format": "tags",  # tags: <answer>...</answer> | cue: the reply's first line
  },
  "frozenlake": _gym("FrozenLake-v1", '{"is_slippery": false}'),
  "taxi": _gym("Taxi-v4"),
  "cliffwalking": _gym("CliffWalking-v1"),
  "blackjack": _gym("Blackjack-v1"),
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


def env_block(kind: str) -> ml_collections.ConfigDict:
  """The `env` block of KIND (`BLOCKS`)."""
  if kind not in BLOCKS:
    raise ValueError(f"Unknown kind {kind!r}; use one of {sorted(BLOCKS)}")
  return ml_collections.ConfigDict(BLOCKS[kind])


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
