"""Typed, frozen values of the RL recipe's config blocks that no library module owns
(`data`, `sampling`, `eval`, `log`, `tools`): each checks its own fields once, on
construction (`common.from_block` turns a `ValueError` "Cls.field=value: fix" into
"config.block.field=value: fix"). Blocks owned by the library are built the same way
from their own dataclasses: `algo` (`rl.objectives`), `rollout` (`rollout.RolloutConfig`,
`envs.multiturn.TurnConfig`), `env` (`envs.table`), `critic` (`learners.CriticConfig`),
`mesh` (`train.sharding.MeshConfig`), `lora` (`models.lora.LoraConfig`).
"""

import dataclasses
import math
import os

from rlpost import rewards as rewards_lib
from rlpost.data import limits
from rlpost.data import prompts as prompts_lib
from rlpost.data import tasks as tasks_lib
from rlpost.models import quant
from rlpost.recipes import common
from rlpost.text import tool_syntax

SAMPLER_WEIGHTS = ("model", "int8")  # `sampling.weights`: what the sampler reads


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """A prompt dataset (`data` block of the GRPO and PPO configs): `source` (one of
  `data.tasks.SOURCES`), `data_dir` (GSM8K jsonl dir; "": the hub), `template` (one of
  `data.prompts.TEMPLATES`), `fewshot` solved examples, `shuffle` each epoch, `digit`
  (the digit task's target), `path` (the jsonl source's prompt file) and `rewards` (its
  reward functions, comma-separated MODULE:FUNCTION), `max_prompt_tokens` (longer prompts
  never reach the device) and `on_too_long` (what happens to them: `data.limits`)."""

  source: str = "gsm8k"
  data_dir: str = ""
  template: str = "fewshot"
  fewshot: int = 2
  shuffle: bool = True
  digit: str = "7"
  path: str = ""
  rewards: str = ""
  max_prompt_tokens: int = 2048
  on_too_long: str = "skip"

  def __post_init__(self):
    if self.max_prompt_tokens < 1:
      common.field_error(
        DataConfig, "max_prompt_tokens", self.max_prompt_tokens, "must be >= 1 token"
      )
    common.check_one_of(DataConfig, "on_too_long", self.on_too_long, limits.ON_TOO_LONG)
    common.check_one_of(DataConfig, "source", self.source, tasks_lib.SOURCES)
    if self.source == "digit":
      tasks_lib.check_digit(self.digit)
    if self.source == "jsonl":
      self._check_prompt_file()
    else:
      for field in ("path", "rewards"):
        if getattr(self, field):
          common.field_error(
            DataConfig,
            field,
            getattr(self, field),
            f"is read only with data.source='jsonl' (source is {self.source!r}): set "
            f"source to 'jsonl' or clear {field}",
          )
    if self.fewshot < 0:
      common.field_error(
        DataConfig, "fewshot", self.fewshot, "must be >= 0 worked examples in the prompt"
      )
    common.check_one_of(DataConfig, "template", self.template, prompts_lib.TEMPLATES)

  def _check_prompt_file(self):
    """The jsonl source's prompt file and reward functions, before any model loads."""
    if not self.path:
      common.field_error(
        DataConfig, "path", "", "data.source='jsonl' needs a prompt file: --config.data.path=FILE"
      )
    if not os.path.isfile(self.path):
      common.field_error(DataConfig, "path", self.path, "no such file; check the path")
    try:
      rewards_lib.load_reward_fns(self.rewards)
    except ValueError as err:
      common.field_error(DataConfig, "rewards", self.rewards, str(err))
    if self.template == "fewshot":
      common.field_error(
        DataConfig,
        "template",
        self.template,
        "shows GSM8K's solved examples and instructions, which a prompt file does not "
        "have: use 'plain' (the prompt as written) or 'chat' (the prompt as a user turn)",
      )


@dataclasses.dataclass(frozen=True)
class SamplingBlock:
  """The `sampling` block of an RL run: `temperature` (finite, >= 0; training needs > 0,
  checked by the recipe, which knows why), `max_new_tokens` (a prompt dataset's cap;
  None: an environment's turns set it), `prompt_bucket` (>= 1 token), `weights` (one of
  SAMPLER_WEIGHTS), `int8_paths` ("auto" or LAYOUT:ROWS)."""

  temperature: float = 1.0
  max_new_tokens: int | None = None
  prompt_bucket: int = 64
  weights: str = "model"
  int8_paths: str = "auto"

  def __post_init__(self):
    if not math.isfinite(self.temperature):  # the sampler refuses it, after the model loads
      common.field_error(
        SamplingBlock, "temperature", self.temperature, "must be a finite number (e.g. 1.0)"
      )
    if self.prompt_bucket < 1:
      common.field_error(SamplingBlock, "prompt_bucket", self.prompt_bucket, "must be >= 1 token")
    if self.max_new_tokens is not None and self.max_new_tokens < 1:
      common.field_error(SamplingBlock, "max_new_tokens", self.max_new_tokens, "must be >= 1 token")
    common.check_one_of(SamplingBlock, "weights", self.weights, SAMPLER_WEIGHTS)
    if self.int8_paths != "auto":  # a typo fails even before it is used
      quant.parse_paths(self.int8_paths)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """An environment run's `eval` block: greedy episodes on held-out seeds every `every`
  iterations (0: off), `num_tasks` of them, `batch_tasks` per rollout call (0: all),
  held-out seed k = `seed_offset` + k."""

  every: int = 10
  num_tasks: int = 100
  batch_tasks: int = 0
  seed_offset: int = 1_000_000

  def __post_init__(self):
    if self.every < 0:
      common.field_error(
        EvalConfig, "every", self.every, "must be >= 0 iterations (0: no evaluation)"
      )
    if self.num_tasks < 1:
      common.field_error(EvalConfig, "num_tasks", self.num_tasks, "must be >= 1 held-out task")
    if self.batch_tasks < 0:
      common.field_error(
        EvalConfig, "batch_tasks", self.batch_tasks, "must be >= 0 (0: all tasks in one rollout)"
      )


@dataclasses.dataclass(frozen=True)
class LogConfig:
  """An environment run's `log` block: transcripts of the first `trajectories_logged`
  episodes to trajectories.jsonl every `trajectories_every` iterations (0: never)."""

  trajectories_every: int = 5
  trajectories_logged: int = 4

  def __post_init__(self):
    if self.trajectories_every < 0:  # -1 would write them every iteration
      common.field_error(
        LogConfig, "trajectories_every", self.trajectories_every, "must be >= 0 (0: never)"
      )
    if self.trajectories_logged < 0:  # -1 would keep all but the last
      common.field_error(
        LogConfig, "trajectories_logged", self.trajectories_logged, "must be >= 0 episodes"
      )


@dataclasses.dataclass(frozen=True)
class ToolsConfig:
  """An environment run's `tools` block: `enabled` wraps the environment with the tool
  registry; a tool result's text is clipped to `max_result_chars`."""

  enabled: bool = False
  max_result_chars: int = 200

  def __post_init__(self):
    marker = len(tool_syntax.TRUNCATION_MARKER)
    if self.max_result_chars < marker:
      common.field_error(
        ToolsConfig,
        "max_result_chars",
        self.max_result_chars,
        f"must be >= {marker} (the truncation marker's length)",
      )


@dataclasses.dataclass(frozen=True)
class LearnedRewardConfig:
  """An RL run's `reward_model` block: a reward-model run's --workdir (`experiments.
  reward_model`; "": none) whose score of each episode's rows (prompt and completion ids,
  on device) is added to its reward: reward = rule_weight * the rule-based reward + weight
  * score (the score on the episode's last turn)."""

  path: str = ""
  weight: float = 1.0
  rule_weight: float = 1.0

  def __post_init__(self):
    for name in ("weight", "rule_weight"):
      if not math.isfinite(getattr(self, name)):
        common.field_error(LearnedRewardConfig, name, getattr(self, name), "must be finite")
