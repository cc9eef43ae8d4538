"""reasoning-gym tasks (rlpost.envs.reasoning_gym) on the real Gemma 3 270M: the question, then
the cue "Answer:"; the reply's first line (at most 16 tokens) is scored by the task's own
score_answer; GRPO 8 items x 8 answers per iteration, 200 held-out items deduplicated
against a pool of 2000.

Command (issue 67 part 7; pick tasks where the base model is neither at 0 nor near 100%):
  python -m experiments.agentic \
    --config=experiments/configs/agentic_runs/reasoning_gym_gemma3.py:grpo \
    --config.env.task=chain_sum --config.env.task_config='{"min_terms": 2, "max_terms": 3}' \
    --config.train.compute_dtype=float32 --workdir=DIR      # :ppo for PPO

Result (GRPO, basic_arithmetic with 2 one-digit terms, 40 iterations, 3 seeds): greedy
success on 200 held-out items 0.025 -> 0.218 (95% interval 0.177-0.258; the best constant
answer 0.120, copying the question's first number 0.105: most successes are computed);
number_sequence at its defaults, 0.090 -> 0.263 (0.225-0.297), below repeating the
sequence's last term (0.285; nearly every success is such a copy): not learned;
number_format at its defaults, 0.050 -> 0.282 (0.243-0.322), below copying one of the
question's numbers at random (0.310): it learned to reply with a listed number, not to
compare them: not learned. Yardsticks:
`python -m experiments.reasoning_gym_baselines --workdir=SEED_DIR`. Commands and per-item
outcomes: experiments/results/INDEX.md.
"""

import ml_collections

from experiments.configs import agentic


def env_block() -> ml_collections.ConfigDict:
  """The `env` block of reasoning_gym (fields: rlpost/envs/reasoning_gym.py)."""
  return ml_collections.ConfigDict(
    {
      "name": "reasoning_gym",
      "task": "chain_sum",  # a generator, or name:weight,name:weight for a mixture
      "task_config": "",  # its own config fields as a JSON object ("": its defaults)
      "pool": 2000,  # training items (held-out items repeating one are dropped)
      "seed": 0,
      "checker": "score_answer",  # score_answer (the package's) | exact | math_verify
      "retries": 0,  # answers after a wrong one, each told "not correct"
      # cue: the prompt ends with "Answer:" and the reply's first line is scored (the base
      # model never writes <answer> tags: 0 of 64 chain_sum items); tags: <answer>...</answer>
      "answer_format": "cue",
    }
  )


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  c = agentic.base("frozenlake_gemma3", algo, env_block(), total_tokens=16)
  c.name = f"reasoning_gym_gemma3,{algo}"
  c.rollout.max_turn_tokens = 16
  c.rollout.stop_strings = ()  # the environment stops at the newline after the answer
  c.sampling.prompt_bucket = 64
  c.train.steps = 60
  c.train.batch_tasks = 16 if algo == "ppo" else 8
  c.eval.every, c.eval.num_tasks, c.eval.batch_tasks = 10, 200, 50
  return c
