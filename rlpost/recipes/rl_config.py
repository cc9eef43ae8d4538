"""The RL recipe's config, typed: `parse(ConfigDict) -> RLConfig`, once, at the entry.

Every block becomes the frozen dataclass that owns its fields, each checking its own
fields on construction (`common.from_block`: errors name `config.block.field`, the value
and the fix); the rules between blocks are all in `check_rules`, each checked once. Below
`rl.run` and `rl.build` nothing reads the ConfigDict (tests/test_rl_config.py poisons it
to show so): the recipe, the learners' settings and builders, the sampler and the loop
read an RLConfig.

  block         dataclass                                     owner
  model         ModelBlock (preset, weights, path, dtype, init_from, chat_template,
                date_string)                                  here
  lora          LoraBlock (enabled, rank, alpha, targets)     here
  algo          GRPOConfig | PPOConfig                        rl/objectives.py
  critic        CriticConfig (PPO; None for GRPO)             recipes/learners.py
  env           the environment's config                      envs/table.py
  rollout       RolloutConfig                                 recipes/rollout.py
  sampling      SamplingBlock                                 recipes/blocks.py
  train         TrainConfig                                   recipes/common.py
  checkpoint    CheckpointConfig                              recipes/common.py
  eval          EvalConfig (every 0 when the block is eval_gsm8k's)   recipes/blocks.py
  log / tools   LogConfig / ToolsConfig                       recipes/blocks.py
  mesh          MeshConfig                                    train/sharding.py
  alarms        AlarmConfig                                   recipes/alarms.py
  reward_model  LearnedRewardConfig                           recipes/blocks.py

Plain frozen dataclasses rather than equinox or chex ones: the blocks hold no arrays (so
no pytree registration is needed), they must stay hashable as static arguments, and
`dataclasses.replace` / `fields` are all the tree needs (BUILD.md, design decisions).
"""

import dataclasses
import pathlib
from typing import Any

from rlpost import config_moves
from rlpost import errors
from rlpost.envs import table as env_table
from rlpost.recipes import alarms as alarms_lib
from rlpost.recipes import blocks
from rlpost.recipes import common
from rlpost.recipes import learners as learners_lib
from rlpost.recipes import rollout as rollout_lib
from rlpost.rl import credit as credit_lib
from rlpost.text import chat_template as chat_template_lib
from rlpost.train import sharding

BATCH_FIELD = "train.batch_tasks"
MODEL_WEIGHTS = ("gguf", "hf", "random")


@dataclasses.dataclass(frozen=True)
class ModelBlock:
  """The `model` block: `preset` (a `families.PRESETS` name), `weights` (gguf | hf |
  random), `path` ("": the packaged GGUF), `dtype` (float32 | bfloat16), `init_from` (an
  earlier run's workdir: its newest weights; "": none), `chat_template` (a .jinja file
  rendered instead of the model file's own template; "": the file's, else the family's
  layout), `date_string` (the day templates print, fixed so prompts do not change daily),
  `base_bits` (32: the base as `dtype` says; 4: QLoRA's frozen NF4 base,
  `quant4.quantize_layers`)."""

  preset: str = "tiny"
  weights: str = "random"
  path: str = ""
  dtype: str = "float32"
  init_from: str = ""
  chat_template: str = ""
  date_string: str = chat_template_lib.DEFAULT_DATE
  base_bits: int = 32

  def __post_init__(self):
    common.check_one_of(ModelBlock, "weights", self.weights, MODEL_WEIGHTS)
    common.check_one_of(ModelBlock, "dtype", self.dtype, ("float32", "bfloat16"))
    chat_template_lib.parse_date(self.date_string, "ModelBlock.date_string")
    if self.chat_template and not pathlib.Path(self.chat_template).exists():
      raise ValueError(
        f"ModelBlock.chat_template={self.chat_template!r}: no such file; give a .jinja chat "
        "template file (or a Hugging Face directory), or '' for the model file's own template"
      )
    common.check_one_of(ModelBlock, "base_bits", self.base_bits, (32, 4))


@dataclasses.dataclass(frozen=True)
class LoraBlock:
  """The `lora` block: `enabled`, `rank`, `alpha`, `targets` (comma-separated names in
  params["layers"]); `models.lora.LoraConfig` checks them (`common.lora_config`)."""

  enabled: bool = False
  rank: int = 8
  alpha: float = 16.0
  targets: str = "q,k,v,o,gate,up,down"


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Every block of an RL run, typed and checked (module docstring); `learner` is the
  LEARNERS name, `settings` its frozen settings (made from these blocks), `env_name` the
  environment's table name (`env` its typed block)."""

  name: str
  seed: int
  learner: str
  model: ModelBlock
  lora: LoraBlock
  algo: Any
  critic: learners_lib.CriticConfig | None
  env_name: str
  env: Any
  rollout: rollout_lib.RolloutConfig
  sampling: blocks.SamplingBlock
  train: common.TrainConfig
  checkpoint: common.CheckpointConfig
  eval: blocks.EvalConfig
  log: blocks.LogConfig
  tools: blocks.ToolsConfig
  mesh: sharding.MeshConfig
  alarms: alarms_lib.AlarmConfig
  reward_model: blocks.LearnedRewardConfig
  rollout_threads: int = 1
  per_turn_rewards: bool = False
  settings: Any = None

  @property
  def spec(self) -> learners_lib.LearnerSpec:
    return learners_lib.LEARNERS[self.learner]


def migrated(cfg):
  """`cfg` with old field names at their new places (`rlpost.config_moves`); a field set
  at both is a ConfigError."""
  try:
    return config_moves.migrate(cfg)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None


def parse(cfg, learner: str | None = None) -> RLConfig:
  """The RLConfig of a ConfigDict (old field names read at their new places), every block
  checked, then every rule between blocks (`check_rules`), then the learner's settings.
  `learner`: the default when the config names none (`learners.name_of`). Nothing is
  loaded."""
  cfg = migrated(cfg)
  name = learners_lib.name_of(cfg, learner)
  spec = learners_lib.spec(name)

  def block(cls, key: str, default=None, renamed=None):
    if key not in cfg:
      return default if default is not None else cls()
    return common.from_block(cls, cfg[key], key, renamed)

  c = RLConfig(
    name=cfg.get("name", name),
    seed=cfg.get("seed", 0),
    learner=name,
    model=block(ModelBlock, "model"),
    lora=block(LoraBlock, "lora"),
    algo=block(spec.algo_config, "algo", renamed=learners_lib.RENAMED),
    critic=block(learners_lib.CriticConfig, "critic") if name == "ppo" else None,
    env_name=cfg.env.name,
    env=env_table.env_config(cfg.env),  # a dataset's file and reward functions, checked now
    rollout=block(rollout_lib.RolloutConfig, "rollout", renamed=learners_lib.RENAMED),
    sampling=block(blocks.SamplingBlock, "sampling"),
    train=block(common.TrainConfig, "train"),
    checkpoint=block(common.CheckpointConfig, "checkpoint"),
    eval=_eval_block(cfg),
    log=block(blocks.LogConfig, "log", blocks.NO_LOG),
    tools=block(blocks.ToolsConfig, "tools"),
    mesh=block(sharding.MeshConfig, "mesh"),
    alarms=block(alarms_lib.AlarmConfig, "alarms"),
    reward_model=block(blocks.LearnedRewardConfig, "reward_model"),
    rollout_threads=cfg.get("rollout_threads", 1),
    per_turn_rewards=bool(cfg.get("per_turn_rewards", False)),
  )
  check_rules(c)
  return dataclasses.replace(c, settings=spec.settings(c))


def _eval_block(cfg) -> blocks.EvalConfig:
  """The greedy held-out evaluation (`eval.every` > 0); a GSM8K config's `eval` block is
  experiments.eval_gsm8k's instead (no `every`): off here."""
  if "eval" not in cfg or "every" not in cfg.eval:
    return blocks.EvalConfig(every=0)
  return common.from_block(blocks.EvalConfig, cfg.eval, "eval")


def check_rules(c: RLConfig) -> None:
  """Every rule between blocks, each once (errors name the field, the value and the fix)."""
  if c.rollout.dynamic_sampling and not c.spec.groups:
    common.fail(
      "rollout.dynamic_sampling",
      True,
      f"{c.learner} samples one completion per task and its critic gives every sample a "
      "baseline: there are no tied groups to drop; use False",
    )
  rollout_lib.check_training_sampling(
    c.sampling,
    _greedy_why(c),
    "use e.g. 1.0. Greedy evaluation is eval.every's (an environment's held-out episodes) "
    "or experiments.eval_gsm8k's job.",
  )
  turns = turn_layout(c)
  if c.rollout_threads < 1:
    common.fail("rollout_threads", c.rollout_threads, "must be >= 1 thread")
  _check_context(c, turns)
  if c.rollout.overlong_buffer and c.rollout.overlong_buffer > turns.max_total_tokens:
    common.fail(
      "rollout.overlong_buffer",
      c.rollout.overlong_buffer,
      f"must be <= the {turns.max_total_tokens} tokens a row samples at most "
      "(rollout.max_total_tokens, else sampling.max_new_tokens)",
    )
  if c.env_name == "agent" and c.rollout.dynamic_sampling:
    common.fail(
      "rollout.dynamic_sampling",
      True,
      "env.name='agent' adds groups mirroring split episodes, which dynamic sampling would "
      "drop as tied groups; use False",
    )
  if c.tools.format != "library" and c.rollout.template != "template":
    common.fail(
      "tools.format",
      c.tools.format,
      "a native format's results are `tool` messages the model's chat template renders: "
      "set rollout.template=template, or use tools.format=library",
    )
  _check_batch(c)
  _check_credit(c)
  rollout_lib.check_off_policy(c.sampling, c.rollout.max_staleness, c.algo.tis_cap)
  common.check_base_bits(c.model.base_bits, c.lora.enabled)
  if c.model.base_bits == 4 and c.sampling.weights != "int4":
    common.fail(
      "sampling.weights",
      c.sampling.weights,
      "model.base_bits=4 keeps the base in 4 bits: the sampler reads the adapters merged "
      "into it, NF4 again; set sampling.weights=int4 (with algo.tis_cap)",
    )
  _check_eval_and_loop(c)
  if c.reward_model.path and c.rollout.dynamic_sampling:
    common.fail(
      "reward_model.path",
      c.reward_model.path,
      "dynamic sampling keeps groups by their rule-based rewards, before the reward model "
      "scores them: set rollout.dynamic_sampling=False, or leave the reward model out",
    )


def turn_layout(c: RLConfig, scaffold: str | None = None):
  """The turn layout (`multiturn.TurnConfig`) the rollout and sampling blocks give with the
  environment's own `scaffold` (None before it is built)."""
  r, s = c.rollout, c.sampling
  if r.max_turn_tokens is None and s.max_new_tokens is None:
    common.fail(
      "sampling.max_new_tokens", None, "must be >= 1 token (or set rollout.max_turn_tokens)"
    )
  if r.max_turn_tokens and s.max_new_tokens and r.max_turn_tokens != s.max_new_tokens:
    common.fail(
      "rollout.max_turn_tokens",
      r.max_turn_tokens,
      f"differs from sampling.max_new_tokens={s.max_new_tokens}: both cap a turn; set one",
    )
  if r.template and scaffold and r.template != scaffold:
    common.fail(
      "rollout.template",
      r.template,
      f"this environment's scaffold is {scaffold!r} (a dataset's follows its env.template): "
      "leave rollout.template None",
    )
  try:
    turns = r.turns(r.max_turn_tokens or s.max_new_tokens, scaffold)
  except ValueError as e:
    raise errors.ConfigError(str(e).replace("RolloutConfig.", "config.rollout.")) from None
  if turns.max_total_tokens < turns.max_turn_tokens:
    common.fail(
      "rollout.max_total_tokens",
      turns.max_total_tokens,
      f"is below rollout.max_turn_tokens={turns.max_turn_tokens}: every episode would be cut "
      "inside its first turn; give room for env.max_turns turns and their observations",
    )
  return turns


def _check_context(c: RLConfig, turns) -> None:
  """A first prompt at its cap plus a row's completion slots fit the model's context: the
  cap is rollout.max_prompt_tokens, else a dataset's own env.max_prompt_tokens."""
  prompt_cap = c.rollout.max_prompt_tokens
  if prompt_cap is not None:
    field, cap = "rollout.max_total_tokens", turns.max_total_tokens
    what = f"with rollout.max_prompt_tokens={prompt_cap} an episode holds"
    common.check_context(c, prompt_cap + cap, field, cap, what)
  elif hasattr(c.env, "max_prompt_tokens"):
    what = f"with sampling.max_new_tokens={turns.max_total_tokens} a sequence holds"
    total = c.env.max_prompt_tokens + turns.max_total_tokens
    common.check_context(c, total, "env.max_prompt_tokens", c.env.max_prompt_tokens, what)


def _check_batch(c: RLConfig) -> None:
  """train.batch_tasks x algo.num_generations rows split over the trainer's devices, in
  mini-batches that divide them; PPO's critic warm-up shorter than the run."""
  tasks = c.train.batch_tasks
  if tasks is None or tasks < 1:
    common.fail(BATCH_FIELD, tasks, "must be >= 1")
  rows = tasks * c.algo.num_generations
  if c.learner == "grpo":
    common.check_rows_per_device(c, rows, f"{BATCH_FIELD} * algo.num_generations")
  mini = c.algo.mini_batch_size or rows
  if rows % mini:
    common.fail(
      "algo.mini_batch_size",
      mini,
      f"{BATCH_FIELD} * algo.num_generations = {rows} rows are not divisible "
      f"by it; choose a divisor of {rows}, or None for the whole batch",
    )
  common.check_rows_per_device(c, mini, f"a mini-batch (algo.mini_batch_size or {BATCH_FIELD})")
  warmup = getattr(c.algo, "critic_warmup_steps", 0)
  if warmup >= c.train.steps and c.learner == "ppo":
    common.fail(
      "algo.critic_warmup_steps",
      warmup,
      f"must be < train.steps={c.train.steps} (the actor trains only after the warm-up)",
    )


def _check_credit(c: RLConfig) -> None:
  """A credit rule reading each turn's reward (`credit.RULES`: GRPO's turn and state
  credit) needs `per_turn_rewards`; one reading the episode's sum refuses them."""
  rewards = credit_lib.of(c.algo).rewards  # episode: [N]; turn: [N, T]; either
  if c.per_turn_rewards and rewards == "episode":
    common.fail(
      "per_turn_rewards",
      True,
      "GRPO with algo.credit='episode' scores each episode by its summed reward: use False, "
      "algo.credit='turn' or 'state' (each turn's reward-to-go), or learner ppo (',ppo')",
    )
  if rewards == "turn" and not c.per_turn_rewards:
    common.fail(
      "algo.credit",
      c.algo.credit,
      f"{c.algo.credit} credit reads each turn's reward where the turn ends: set "
      "per_turn_rewards=True (a prompt's completion is one turn: use 'episode')",
    )


def _check_eval_and_loop(c: RLConfig) -> None:
  """Held-out seeds above every training seed; the steps (0 only for greedy evaluation)
  and the seed."""
  ev, t = c.eval, c.train
  if ev.every and t.steps * t.batch_tasks > ev.seed_offset:
    common.fail(
      "eval.seed_offset",
      ev.seed_offset,
      f"training uses seeds up to train.steps * train.batch_tasks = {t.steps * t.batch_tasks}; "
      "held-out seeds must start above them",
    )
  if t.steps < (0 if ev.every else 1):
    common.fail(
      "train.steps", t.steps, "must be >= 1, or 0 with eval.every > 0 (greedy evaluation only)"
    )
  if c.seed is not None and c.seed < 0:
    common.fail("seed", c.seed, "must be >= 0")


def _greedy_why(c: RLConfig) -> str:
  """Why the learner cannot train on greedy samples (the sampling.temperature error's
  reason)."""
  estimator = getattr(c.algo, "advantage_estimator", None)
  if c.learner == "grpo" and credit_lib.compares_groups(estimator):
    return (
      f"greedy decoding gives the {c.algo.num_generations} samples of a prompt identical "
      f"completions, so {estimator}'s group-relative advantages are all 0"
    )
  return "the trainer's logprobs divide the logits by the temperature"
