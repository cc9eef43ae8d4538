"""FrozenLake 4x4 with the neighbours line and shaped rewards (frozenlake_near_shaped_gemma3),
PPO and GRPO matched for issue 69's comparison: the same 16 episodes per iteration, the same
4 optimizer steps on them (2 passes x 2 mini-batches of 8), the same KL (k3, 0.05, in the
loss), the same token-mean aggregation, the same actor rate (1e-4), each turn's reward on
that turn, 30 iterations, greedy evaluation every 5 on 356 maps none of the run's training
seeds draws (356: telling 60% from 70% at alpha 0.05, power 0.8).

What still differs (the learners themselves): PPO's baseline is a learned critic (values at
the turn's start, GAE over turns, 3 critic-only iterations first: its actor trains 27
iterations) and it plays 16 maps x 1 episode; GRPO's baseline is the mean reward-to-go of
the group's turns in the same state (credit=state), which needs several episodes of one
map: 2 maps x 8. PPO whitens its advantages over the batch, GRPO over the state's group.
Tried configs: one each (this one), after the single-seed history in
experiments/results/frozenlake_near_shaped.md (PPO's 71 there had KL in the reward).

Command (3 seeds each, then the paired report):
  python -m experiments.seeds run \
    --config=experiments/configs/agentic_runs/frozenlake_matched_gemma3.py:ppo \
    --seeds=0,1,2 --workdir_root=DIR_PPO --config.train.compute_dtype=float32 \
    --config.checkpoint.every=1           # :grpo and DIR_GRPO for GRPO
  python -m experiments.seeds report DIR_PPO DIR_GRPO

Result: not run yet (issue 69 part 3 reports it here).
"""

import ml_collections

from experiments.configs import agentic
from experiments.configs.agentic_runs import frozenlake_near_shaped_gemma3 as near_shaped


def matched(name: str, algo: str, **env) -> ml_collections.ConfigDict:
  """The matched pair's config on the shaped, neighbours-line maps with `env`'s fields
  changed (the window as `total_tokens`): the harder pairs (slippery, 6x6) use it too."""
  c = agentic.frozenlake(name, algo, **{**near_shaped.SHAPED, **env})
  c.per_turn_rewards = True
  c.train.steps = 30
  c.train.learning_rate = 1e-4
  c.algo.beta, c.algo.kl_method, c.algo.loss_agg_mode = 0.05, "k3", "token-mean"
  c.algo.num_iterations, c.algo.mini_batch_size = 2, 8
  if algo == "ppo":
    c.algo.kl_in_reward = False
  else:
    c.algo.credit = "state"
  c.eval.every, c.eval.num_tasks, c.eval.batch_tasks = 5, 356, 50
  c.checkpoint.every = 1
  return c


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  return matched("frozenlake_matched_gemma3", algo)
