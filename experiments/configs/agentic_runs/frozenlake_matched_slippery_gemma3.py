"""issue 69's matched PPO/GRPO pair (frozenlake_matched_gemma3: the same episodes, optimizer
steps, KL and aggregation; its docstring lists what still differs) on slippery 4x4 ice: a
move goes to either side of the one asked for 2 times in 3, so a map's best policy fails
often and greedy evaluation is a draw of the ice as well; 12 turns (49 Gemma tokens each
with the neighbours line: 588 of 640 slots).

Evaluated at 0, 15 and 30 iterations (`eval.every=15`, not the 4x4 pair's 5): an
evaluation of 356 maps costs one core a quarter of an hour on 4x4 ice and more with longer
episodes, so seven of them would cost about as much as the training.

Command (3 seeds each, then the paired report):
  python -m experiments.seeds run \
    --config=experiments/configs/agentic_runs/frozenlake_matched_slippery_gemma3.py:ppo \
    --seeds=0,1,2 --workdir_root=DIR_PPO --config.train.compute_dtype=float32
                                              # :grpo and DIR_GRPO for GRPO
  python -m experiments.seeds report DIR_PPO DIR_GRPO

Result: not run yet (issue 69 part 3 reports it here).
"""

import ml_collections

from experiments.configs.agentic_runs import frozenlake_matched_gemma3 as matched_4x4


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  c = matched_4x4.matched(
    "frozenlake_matched_slippery_gemma3", algo, slippery=True, max_turns=12, total_tokens=640
  )
  c.eval.every = 15
  return c
