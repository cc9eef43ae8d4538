"""Multi-turn agentic RL: `--config=experiments/configs/agentic.py:ENV_MODEL[,ALGORITHM]`.

ENV_MODEL names a module of `experiments/configs/agentic_runs/` (one per reproduced
experiment, its command and result in its docstring; each is also a config file of its own,
`--config=experiments/configs/agentic_runs/ENV_MODEL.py:ALGORITHM`):
  frozenlake_tiny, frozenlake_gemma3, frozenlake_smollm2, frozenlake_slippery_gemma3,
  frozenlake6x6_gemma3, frozenlake_near_gemma3, frozenlake_near_shaped_gemma3,
  frozenlake_matched_gemma3, frozenlake_matched_slippery_gemma3, frozenlake_matched6x6_gemma3,
  gsm8k_calc_gemma3
ALGORITHM: grpo (default) | drgrpo | dapo | gspo: the GRPO family over trajectories
(the `algo` block of configs/grpo_gsm8k.py); ppo: PPO with a learned critic (the `algo`
and `critic` blocks of configs/ppo_gsm8k.py), algo.num_generations episodes per task (1).

This module holds what the runs share: `base` (every block, real-model sizes), the `env`
blocks (`frozenlake_env`, `gsm8k_calc_env`) and `frozenlake` (the real-model FrozenLake
runs, with the PPO settings tuned for its maps).
"""

import importlib

import ml_collections
from ml_collections.config_dict import placeholder

from experiments.configs import common
from experiments.configs import grpo_gsm8k
from experiments.configs import ppo_gsm8k

# ENV_MODEL -> the model variant its module runs (common.MODELS)
VARIANTS = {
  "frozenlake_tiny": "tiny",
  "frozenlake_gemma3": "gemma3_270m",
  "frozenlake_smollm2": "smollm2_135m",
  "frozenlake_slippery_gemma3": "gemma3_270m",
  "frozenlake6x6_gemma3": "gemma3_270m",
  "frozenlake_near_gemma3": "gemma3_270m",
  "frozenlake_near_shaped_gemma3": "gemma3_270m",
  "frozenlake_matched_gemma3": "gemma3_270m",
  "frozenlake_matched_slippery_gemma3": "gemma3_270m",
  "frozenlake_matched6x6_gemma3": "gemma3_270m",
  "gsm8k_calc_gemma3": "gemma3_270m",
}
ALGORITHMS = grpo_gsm8k.ALGORITHMS + ("ppo",)


def get_config(variant: str = "frozenlake_gemma3") -> ml_collections.ConfigDict:
  """`ENV_MODEL[,ALGORITHM]` -> that run module's config."""
  env_model, _, algo = variant.partition(",")
  if env_model not in VARIANTS or (algo or "grpo") not in ALGORITHMS:
    raise ValueError(
      f"Unknown variant {variant!r}; use ENV_MODEL[,ALGORITHM] with ENV_MODEL in "
      f"{sorted(VARIANTS)} and ALGORITHM in {list(ALGORITHMS)}"
    )
  run = importlib.import_module(f"experiments.configs.agentic_runs.{env_model}")
  return run.get_config(algo or "grpo")


def check_algorithm(name: str, algo: str) -> None:
  """Refuses an ALGORITHM a run module was given, naming the valid ones."""
  if algo not in ALGORITHMS:
    raise ValueError(f"Unknown algorithm {algo!r} for {name}; use one of {list(ALGORITHMS)}")


def base(
  name: str, algo: str, env: ml_collections.ConfigDict, *, total_tokens: int
) -> ml_collections.ConfigDict:
  """Every block of an agentic run on a real model: the `algo` (and `critic`) of ALGORITHM,
  `env` as given, `total_tokens` completion slots (turns + observations). Locked: a run
  module changes values, never adds fields."""
  check_algorithm(name, algo)
  model = VARIANTS[name]
  tiny = model == "tiny"  # the tiny model's sizes of the shared algorithm blocks
  c = ml_collections.ConfigDict()
  c.name = f"{name},{algo}"  # the run's label (progress bar, curves)
  c.seed = 0
  c.model = common.model_config(model)
  c.lora = common.lora_config(enabled=not tiny, rank=32)
  c.learner = "ppo" if algo == "ppo" else "grpo"  # which update trains on the episodes
  if algo == "ppo":
    c.algo = ppo_gsm8k.algorithm(tiny)
    # one optimizer step per iteration, as GRPO (a typed None: --config.algo.mini_batch_size=N)
    c.algo.mini_batch_size = placeholder(int)
    c.critic = ppo_gsm8k.critic(tiny)
  else:
    c.algo = grpo_gsm8k.algorithm(algo)
    c.algo.num_generations = 8
  # True: each turn's reward on that turn's last sampled token (PPO, GRPO with turn or
  # state credit); False: the episode's sum on its last sampled token
  c.per_turn_rewards = False
  c.env = env
  c.tools = ml_collections.ConfigDict(
    {"enabled": False, "max_result_chars": 200, "format": "library"}
  )
  c.rollout = common.rollout(
    # scaffold around observations: chat | plain (the base Gemma 3 270M does not
    # follow the chat format; it answers plain-text cues such as "Your move:")
    template="plain",
    max_turn_tokens=4,  # sampled tokens per turn
    # texts that also end a turn (the environment adds its own, e.g. </tool>)
    stop_strings=("\n",),
    max_total_tokens=total_tokens,  # completion slots: turns + observations
    # the longest first prompt accepted (a longer reset text is an error naming it)
    max_prompt_tokens=2048,
  )  # rollout.max_staleness None: play, then train; s >= 0: a producer thread plays the
  # next iterations' episodes with the policy exactly s updates old (s > 0: algo.tis_cap)
  c.rollout_threads = 8  # env.step calls of a turn run concurrently on this many threads
  c.sampling = ml_collections.ConfigDict(
    {
      "temperature": 1.0,
      # a FrozenLake map's first prompt has one length (the 4x4 one 141 Gemma tokens):
      # a fine bucket pads it to 144 context slots, where 128 would pad it to 256
      "prompt_bucket": 16,
      "weights": "model",  # model | int8 (an int8 copy per weight sync; needs algo.tis_cap)
      "int8_paths": "auto",  # int8 dots: auto (calibrated per machine) | LAYOUT:ROWS, e.g. io:8
      "int4_matmul": "auto",  # int4 decode steps: auto (native where it builds) | native | xla
    }
  )
  c.train = ml_collections.ConfigDict(
    {
      "steps": 60,
      # task seeds per step, x algo.num_generations episodes each (PPO: 1 by default)
      "batch_tasks": 16 if algo == "ppo" else 2,
      "micro_batch_size": 8,
      "learning_rate": 2e-5,
      "warmup_fraction": 0.1,
      "weight_decay": 0.1,
      "adam_b1": 0.9,
      "adam_b2": 0.99,
      "optimizer": "adamw",  # adamw | sgd (plain SGD: its update is the scheduled gradient)
      "max_grad_norm": 0.1,
      "max_bad_steps": 3,
      "logprob_chunk": 256,
      "compute_dtype": "auto",  # float32 | bfloat16 | auto (per machine)
      "remat": "dots",
    }
  )
  c.eval = ml_collections.ConfigDict(
    {
      "every": 10,  # greedy episodes on held-out seeds every N iterations (0: off)
      "num_tasks": 100,
      "batch_tasks": 0,  # held-out episodes per rollout call (0: all at once)
      "seed_offset": 1_000_000,  # held-out seeds: seed_offset, seed_offset + 1, ...
    }
  )
  # transcripts to trajectories.jsonl every N iterations (0: never), the first M episodes
  c.log = ml_collections.ConfigDict({"trajectories_every": 5, "trajectories_logged": 4})
  c.reward_model = common.learned_reward_config()
  c.alarms = common.alarms_config()
  c.mesh = common.mesh_config()
  c.checkpoint = ml_collections.ConfigDict({"every": 10, "keep": 3})
  c.lock()
  return c


def frozenlake(
  name: str, algo: str, *, total_tokens: int = 384, **env
) -> ml_collections.ConfigDict:
  """A real-model FrozenLake run: `base` with the FrozenLake `env` block (fields in `env`
  changed) and, for PPO, issue 38's settings for the real maps.

  Gemma's tokens per later turn: ~29 (4x4 board) or ~38 (6x6), and 4 sampled, so 8 turns
  fit 384 slots. PPO: the best of the runs in experiments/results/frozenlake_ppo.md
  (session 33's; its critic the first to explain >= 0.3 of the returns' variance): GAE over
  turns with a value per turn read at the turn's first sampled token (V(s): the
  observation, not the move), each turn's reward on that turn, two epochs of two
  mini-batches of 8 episodes per iteration, 3 critic-only iterations first, the value head
  on its own AdamW at 1e-3, values normalised by running return statistics, the actor's
  rate 1e-4.
  """
  block = frozenlake_env(tiny=False)
  for field, value in env.items():
    block[field] = value
  c = base(name, algo, block, total_tokens=total_tokens)
  if algo == "ppo":
    c.algo.credit = "turn"
    c.algo.turn_value = "start"
    c.algo.mini_batch_size = 8
    c.algo.num_iterations = 2
    c.algo.critic_warmup_steps = 3
    c.critic.head_learning_rate = 1e-3
    c.critic.value_norm_decay = 0.1
    c.per_turn_rewards = True
    c.train.learning_rate = 1e-4
  return c


def frozenlake_env(tiny: bool) -> ml_collections.ConfigDict:
  """The `env` block of FrozenLake (rlpost.envs.frozenlake)."""
  return ml_collections.ConfigDict(
    {
      "name": "frozenlake",
      "size": 4,  # maps drawn from the task seed are size x size
      "slippery": False,
      "hole_prob": 0.2,
      "max_turns": 3 if tiny else 8,
      "style": "char" if tiny else "word",  # char: L/D/R/U; word: left/down/right/up
      "invalid_penalty": 0.1,
      "hole_penalty": 0.0,  # subtracted when a walk ends in a hole (0: as running out of turns)
      "progress_reward": 0.0,  # paid per cell a move brings the agent closer to G
      "edge_penalty": 0.0,  # subtracted for a move off the map (the agent stays in place)
      # word style: each observation also says what every move leads to ("Around you:
      # left edge, down hole, ..."): ~16 more tokens per turn
      "neighbours": False,
      "fixed_map": "SF,HG" if tiny else "",  # rows, comma-separated; "" = from the seed
    }
  )


def gsm8k_calc_env() -> ml_collections.ConfigDict:
  """The `env` block of GSM8K with a calculator (rlpost.envs.gsm8k_calc)."""
  return ml_collections.ConfigDict(
    {
      "name": "gsm8k_calc",
      "data_dir": "",  # GSM8K jsonl dir (train.jsonl, test.jsonl); "" = Hugging Face hub
      "fewshot": 2,  # solved tool-call examples in the prompt (0 after the tool-trace SFT)
      "max_turns": 6,  # model turns per episode, the answer's included
      "tool_bonus": 0.0,  # reward for the first error-free calculator call (0: off)
      # library (the calculator in the library's syntax, solved examples) | hermes |
      # llama3_json | mistral (a native format: fewshot 0, rollout.template=template)
      "tool_format": "library",
    }
  )
