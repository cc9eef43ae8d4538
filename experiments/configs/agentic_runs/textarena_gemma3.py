"""textarena games (rlpost.envs.textarena_games) on the real Gemma 3 270M: TicTacToe-v0 as
player 0 (O, moving first) against the scripted random opponent; each observation ends
with the cue "Your move:" and the reply's first line is the move (at most 6 sampled
tokens); GRPO 2 games x 8 episodes per iteration (PPO 16 x 1), the 8 of a game facing
the same opponent's draws (seeded by the game's seed and the turn).

Command (issue 67 part 7):
  python -m experiments.agentic \
    --config=experiments/configs/agentic_runs/textarena_gemma3.py:grpo \
    --config.train.compute_dtype=float32 --workdir=DIR      # :ppo for PPO

Yardsticks on the 200 held-out games (seeds 1,000,000 on, the same opponent's draws;
`python -m experiments.textarena_baselines`): always the first listed move (the lowest
free cell) wins 162, draws 8, loses 30; a random listed move wins 116.4 on average (10
draws a game). `--outcomes=WORKDIR/eval_outcomes.jsonl` counts a run's greedy games that
are the first-listed policy's.

Result: not measured yet (issue 67 part 7 reports it here).
"""

import ml_collections

from experiments.configs import agentic


def env_block() -> ml_collections.ConfigDict:
  """The `env` block of textarena (fields: rlpost/envs/textarena_games.py)."""
  return ml_collections.ConfigDict(
    {
      "name": "textarena",
      "game": "TicTacToe-v0",  # SINGLE_PLAYER or TWO_PLAYER of textarena_games
      "max_turns": 5,  # the policy's moves (TicTacToe's first player makes at most 5)
      "cue": "Your move:",  # after every observation: a base model continues after it
      "opponent": "random",  # or MODULE:FUNCTION (e.g. experiments.examples.endpoint_opponent:move)
    }
  )


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  c = agentic.base("frozenlake_gemma3", algo, env_block(), total_tokens=768)
  c.name = f"textarena_gemma3,{algo}"
  c.rollout.max_turn_tokens = 6
  c.sampling.prompt_bucket = 64
  c.train.steps = 40
  c.train.batch_tasks = 16 if algo == "ppo" else 2
  c.eval.every, c.eval.num_tasks, c.eval.batch_tasks = 20, 200, 50
  return c
