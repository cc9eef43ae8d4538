"""issue 69's matched PPO/GRPO pair (frozenlake_matched_gemma3: the same episodes, optimizer
steps, KL and aggregation; its docstring lists what still differs) on 6x6 maps (the
shortest path: 10 moves); 16 turns (60 Gemma tokens each with the neighbours line: 960 of
1024 slots).

Evaluated at 0, 15 and 30 iterations (`eval.every=15`, not the 4x4 pair's 5): an
evaluation of 356 maps costs one core a quarter of an hour on 4x4 ice and more with longer
episodes, so seven of them would cost about as much as the training.

Command (3 seeds each, then the paired report):
  python -m experiments.seeds run \
    --config=experiments/configs/agentic_runs/frozenlake_matched6x6_gemma3.py:ppo \
    --seeds=0,1,2 --workdir_root=DIR_PPO --config.train.compute_dtype=float32
                                              # :grpo and DIR_GRPO for GRPO
  python -m experiments.seeds report DIR_PPO DIR_GRPO

Result: not run yet (issue 69 part 3 reports it here).
"""

import ml_collections

from experiments.configs.agentic_runs import frozenlake_matched_gemma3 as matched_4x4


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  c = matched_4x4.matched(
    "frozenlake_matched6x6_gemma3", algo, size=6, max_turns=16, total_tokens=1024
  )
  c.eval.every = 15
  return c
