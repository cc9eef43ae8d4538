"""FrozenLake 4x4 with the neighbours line (frozenlake_near_gemma3) and shaped rewards: 0.1
per cell a move brings the agent closer to G (taken per cell further), 0.5 off for the step
into a hole, 0.2 off for a move off the map (success is still reaching G).

A step into a hole ends below a walk that stops short at the same distance, each turn's
move is paid for its own progress, and a move into the edge the neighbours line names
costs more than a step back: the base model repeats its last move (P(down) 0.006 after
`right` x 3 at the right edge). GRPO credits each turn with its reward-to-go against the
group's turns in the same state (algo.credit=state, session 37; turn credit chosen before
session 35's run, after episode credit's 39 / 100), two whole-batch passes per batch
(session 36: every episode trained on twice, as PPO's two epochs), PPO's actor rate 1e-4.

Command:
  python -m experiments.agentic \
    --config=experiments/configs/agentic.py:frozenlake_near_shaped_gemma3,ppo \
    --config.train.steps=30 --config.eval.every=10 --config.train.compute_dtype=float32 \
    --workdir=DIR        # without ,ppo for GRPO

Result (greedy, 100 held-out maps, 480 sampled episodes each; experiments/results/
frozenlake_near_shaped.md): PPO 71 / 100 at 30 iterations; GRPO with these defaults
43 / 100, and 60 / 100 with `--config.algo.mini_batch_size=8`. Any fixed move sequence
solves at most 43 of these maps.
"""

import ml_collections

from experiments.configs import agentic


# the window and the env fields of the shaped runs (frozenlake_matched_gemma3 too)
SHAPED = dict(
  total_tokens=512, neighbours=True, hole_penalty=0.5, progress_reward=0.1, edge_penalty=0.2
)


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  c = agentic.frozenlake("frozenlake_near_shaped_gemma3", algo, **SHAPED)
  if algo == "grpo":
    c.algo.credit = "state"
    c.algo.num_iterations = 2
    c.per_turn_rewards = True
    c.train.learning_rate = 1e-4
  return c
