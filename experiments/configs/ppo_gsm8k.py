"""PPO with a learned critic on GSM8K: `--config=experiments/configs/ppo_gsm8k.py:VARIANT`.

VARIANT is `gemma3_270m` (real weights, GSM8K; LoRA actor, `lora` critic) or
`tiny` (random tiny model, "answer 7" task; full-parameter actor and critic).
The `algo` block is exactly the fields of rlpost.rl.objectives.PPOConfig (Tunix's
PPOConfig names), the `critic` block those of rlpost.recipes.learners.CriticConfig.
"""

import ml_collections
from ml_collections.config_dict import placeholder

from experiments.configs import common


def algorithm(tiny: bool) -> ml_collections.ConfigDict:
  """The `algo` block: exactly the fields of rlpost.rl.objectives.PPOConfig."""
  return ml_collections.ConfigDict(
    {
      "num_iterations": 1,  # epochs over each rollout batch
      # rows per optimizer step; None: the whole batch
      "mini_batch_size": 8 if tiny else placeholder(int),
      "num_generations": 1,  # samples per prompt (episodes per task); the critic is the baseline
      "gamma": 1.0,
      "gae_lambda": 0.95,  # the actor's advantages
      "critic_lambda": 1.0,  # the critic's targets (VC-PPO: decoupled from gae_lambda)
      "epsilon": 0.2,  # ratio clip; epsilon_low / epsilon_high default to it
      "epsilon_low": placeholder(float),
      "epsilon_high": placeholder(float),
      "epsilon_c": placeholder(float),  # dual-clip constant (> 1); None: off
      "entropy_coef": 0.0,
      "clip_range_value": 0.2 if not tiny else 1.0,  # value clip around the rollout values
      "vf_coef": 0.1,
      "beta": 0.05 if not tiny else 0.01,  # KL(policy || reference) coefficient
      "kl_method": "k1",  # k1 | k2 | k3
      "kl_in_reward": True,  # True: -beta*KL per token in the rewards; False: in the loss
      "kl_clamp": placeholder(float),
      "critic_warmup_steps": 2 if tiny else 5,  # critic-only iterations first
      "whiten_advantages": True,
      # token: GAE over sampled tokens; turn: over an episode's turns (one value per turn)
      "credit": "token",
      # credit=turn: a turn's value at its last sampled token (end) or its first (start: V(s))
      "turn_value": "end",
      "policy_loss": "clipped",  # clipped | gspo | cispo
      "loss_agg_mode": "token-mean",
      "tis_cap": placeholder(float),
    }
  )


def critic(tiny: bool) -> ml_collections.ConfigDict:
  """The `critic` block: the fields of rlpost.recipes.learners.CriticConfig."""
  return ml_collections.ConfigDict(
    {
      "mode": placeholder(str),  # lora | full | shared; None: lora with a LoRA actor, else full
      # None: 10x train.learning_rate (Tunix, verl); the tiny model's full trunk wants 1x
      "learning_rate": 3e-2 if tiny else placeholder(float),
      # the value head's own rate (its own AdamW); None: the critic's learning_rate
      "head_learning_rate": placeholder(float),
      # values normalised with running return statistics, each batch's at this weight
      # (PopArt-style); None: values in return units
      "value_norm_decay": placeholder(float),
    }
  )


def get_config(variant: str = "gemma3_270m") -> ml_collections.ConfigDict:
  if variant not in common.MODELS:
    raise ValueError(f"Unknown variant {variant!r}; models: {sorted(common.MODELS)}")
  tiny = variant == "tiny"
  c = ml_collections.ConfigDict()
  c.name = "ppo"  # the run's label (progress bar, curves)
  c.seed = 0
  c.model = common.model_config(variant)
  c.lora = common.lora_config(enabled=not tiny, rank=32)  # the actor's (and a lora critic's)
  c.algo = algorithm(tiny)
  c.critic = critic(tiny)
  c.rollout = common.rollout()  # one turn of sampling.max_new_tokens per prompt
  c.env = common.prompt_env(tiny)  # the prompt dataset: an environment of one-turn episodes
  c.sampling = ml_collections.ConfigDict(
    {
      "temperature": 1.0 if tiny else 0.9,
      "max_new_tokens": 8 if tiny else 192,
      "prompt_bucket": 16 if tiny else 64,
      "weights": "model",  # model | int8 (an int8 copy per weight sync; needs algo.tis_cap)
      "int8_paths": "auto",  # int8 dots: auto (calibrated per machine) | LAYOUT:ROWS, e.g. io:8
      "int4_matmul": "auto",  # int4 decode steps: auto (native where it builds) | native | xla
    }
  )
  c.train = ml_collections.ConfigDict(
    {
      "steps": 40 if tiny else 200,  # iterations (each: one rollout batch)
      "batch_tasks": 16 if tiny else 8,  # prompts per iteration, one completion each
      "micro_batch_size": 8,
      "learning_rate": 3e-2 if tiny else 3e-6,  # the actor's (critic.learning_rate: the critic's)
      "warmup_fraction": 0.1,
      "weight_decay": 0.1,
      "adam_b1": 0.9,
      "adam_b2": 0.99,
      "optimizer": "adamw",  # adamw | sgd (plain SGD: its update is the scheduled gradient)
      "max_grad_norm": 0.1,  # each of actor and critic clipped on its own
      "max_bad_steps": 3,
      "logprob_chunk": 256,
      "compute_dtype": "float32" if tiny else "auto",  # float32 | bfloat16 | auto (per machine)
      "remat": "dots",
    }
  )
  c.reward_model = common.learned_reward_config()
  c.alarms = common.alarms_config()
  c.mesh = common.mesh_config()
  c.checkpoint = ml_collections.ConfigDict({"every": 10 if tiny else 25, "keep": 3})
  c.eval = common.gsm8k_eval_config()
  c.lock()
  return c
