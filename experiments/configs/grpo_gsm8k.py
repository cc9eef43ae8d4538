"""GRPO on GSM8K: `--config=experiments/configs/grpo_gsm8k.py:VARIANT`.

VARIANT is `MODEL[,ALGORITHM]`:
  MODEL      gemma3_270m (real weights, GSM8K) | tiny (random tiny model, "answer 7" task)
  ALGORITHM  grpo (default) | drgrpo | dapo | gspo
e.g. `:gemma3_270m`, `:tiny,dapo`, `:gspo` (= gemma3_270m,gspo).
"""

import ml_collections
from ml_collections.config_dict import placeholder

from experiments.configs import common

ALGORITHMS = ("grpo", "drgrpo", "dapo", "gspo")


def algorithm(name: str) -> ml_collections.ConfigDict:
  """The `algo` block: exactly the fields of rlpost.rl.objectives.GRPOConfig.

  The variants differ only here (and DAPO in the `rollout` block).
  """
  algo = ml_collections.ConfigDict(
    {
      "num_generations": 4,  # G completions per prompt
      "num_iterations": 1,  # mu: optimisation passes per rollout batch
      # rows per optimizer step (None: the whole batch; advantages over the whole batch)
      "mini_batch_size": placeholder(int),
      "advantage_estimator": "grpo",  # grpo | drgrpo | rloo | reinforce_pp
      "policy_loss": "clipped",  # clipped | gspo (rlpost.rl.losses.POLICY_LOSSES)
      "beta": 0.08,  # KL(policy || reference) coefficient
      "kl_method": "k3",  # k1 | k2 | k3
      "kl_clamp": placeholder(float),  # None: no clamp
      "epsilon_low": 0.2,
      "epsilon_high": 0.2,
      "epsilon_c": placeholder(float),  # dual-clip constant (> 1); None: off
      "loss_agg_mode": "seq-mean-token-mean",
      "entropy_coef": 0.0,
      "tis_cap": placeholder(float),  # truncated importance sampling cap; None: off
      # episode: one advantage per row; turn / state: per turn of a multi-turn episode,
      # against the group's at that turn / in that state (agentic, per_turn_rewards=True)
      "credit": "episode",
    }
  )
  if name == "drgrpo":
    algo.advantage_estimator = "drgrpo"
    algo.loss_agg_mode = "seq-mean-token-sum-norm"
  elif name == "dapo":
    algo.beta = 0.0
    algo.epsilon_high = 0.28
    algo.loss_agg_mode = "token-mean"
  elif name == "gspo":
    algo.policy_loss = "gspo"
    algo.epsilon_low = 3e-4
    algo.epsilon_high = 4e-4
    algo.beta = 0.0
  return algo


def _rollout(name: str) -> ml_collections.ConfigDict:
  """The `rollout` block (rlpost.recipes.rollout.RolloutConfig): one turn of
  sampling.max_new_tokens per prompt; DAPO drops zero-signal groups and resamples."""
  return common.rollout(dynamic_sampling=name == "dapo")


def get_config(variant: str = "gemma3_270m") -> ml_collections.ConfigDict:
  parts = variant.split(",")
  model = parts[0] if parts[0] in common.MODELS else "gemma3_270m"
  algo = parts[-1] if parts[-1] in ALGORITHMS else "grpo"
  unknown = [p for p in parts if p not in common.MODELS and p not in ALGORITHMS]
  if unknown:
    raise ValueError(
      f"Unknown variant part(s) {unknown}; models: {sorted(common.MODELS)}, "
      f"algorithms: {list(ALGORITHMS)}"
    )
  tiny = model == "tiny"
  c = ml_collections.ConfigDict()
  c.name = algo  # the run's label (progress bar, curves)
  c.seed = 0
  c.model = common.model_config(model)
  c.lora = common.lora_config(enabled=not tiny, rank=32)
  c.algo = algorithm(algo)
  c.rollout = _rollout(algo)
  c.env = common.prompt_env(tiny)  # the prompt dataset: an environment of one-turn episodes
  c.sampling = ml_collections.ConfigDict(
    {
      "temperature": 1.0 if tiny else 0.9,
      "max_new_tokens": 8 if tiny else 192,
      "prompt_bucket": 16 if tiny else 64,
      # what the sampler reads: the policy's weights ("model"), or an int8 copy made at
      # each weight sync ("int8": faster rollouts; needs algo.tis_cap)
      "weights": "model",
      "int8_paths": "auto",  # int8 dots: auto (calibrated per machine) | LAYOUT:ROWS, e.g. io:8
      "int4_matmul": "auto",  # int4 decode steps: auto (native where it builds) | native | xla
    }
  )
  c.train = ml_collections.ConfigDict(
    {
      "steps": 40 if tiny else 200,
      "batch_tasks": 4 if tiny else 2,  # prompts per step (x G completions)
      "micro_batch_size": 8,  # rows per micro-batch on each trainer device
      "learning_rate": 3e-2 if tiny else 3e-6,
      "warmup_fraction": 0.1,
      "weight_decay": 0.1,
      "adam_b1": 0.9,
      "adam_b2": 0.99,
      "optimizer": "adamw",  # adamw | sgd (plain SGD: its update is the scheduled gradient)
      "max_grad_norm": 0.1,
      "max_bad_steps": 3,  # stop after this many consecutive non-finite steps
      "logprob_chunk": 256,
      # trainer matmul inputs: float32 | bfloat16 | auto (the faster on this machine)
      "compute_dtype": "float32" if tiny else "auto",
      "remat": "dots",  # none | dots | full (activation memory policy)
    }
  )
  c.reward_model = common.learned_reward_config()
  c.alarms = common.alarms_config()
  c.mesh = common.mesh_config()
  c.checkpoint = ml_collections.ConfigDict({"every": 10 if tiny else 25, "keep": 3})
  c.eval = common.gsm8k_eval_config()
  c.lock()
  return c
