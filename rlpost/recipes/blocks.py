"""Typed, frozen values of the RL recipe's config blocks that no library module owns
(`sampling`, `eval`, `log`, `tools`): each checks its own fields once, on
construction (`common.from_block` turns a `ValueError` "Cls.field=value: fix" into
"config.block.field=value: fix"). Blocks owned by the library are built the same way
from their own dataclasses: `algo` (`rl.objectives`), `rollout` (`rollout.RolloutConfig`),
`env` (`envs.table`: an environment's, or a prompt dataset's), `critic` (`learners.CriticConfig`),
`mesh` (`train.sharding.MeshConfig`), `lora` (`models.lora.LoraConfig`).
"""

import dataclasses
import math

from rlpost.models import quant
from rlpost.recipes import common
from rlpost.text import tool_formats
from rlpost.text import tool_syntax

SAMPLER_WEIGHTS = ("model", "int8", "int4")  # `sampling.weights`: what the sampler reads
INT4_MATMULS = ("auto", "native", "xla")  # `sampling.int4_matmul`: how int4 decode steps multiply


@dataclasses.dataclass(frozen=True)
class SamplingBlock:
  """The `sampling` block of an RL run: `temperature` (finite, >= 0; training needs > 0,
  checked by the recipe, which knows why), `max_new_tokens` (a prompt dataset's cap;
  None: an environment's turns set it), `prompt_bucket` (>= 1 token), `weights` (one of
  SAMPLER_WEIGHTS), `int8_paths` ("auto" or LAYOUT:ROWS), `int4_matmul` (one of
  INT4_MATMULS: with int4 weights, the decode steps' matmuls in `q4_native`'s kernel or
  XLA's dequantise-then-dot; "auto": native where its library builds)."""

  temperature: float = 1.0
  max_new_tokens: int | None = None
  prompt_bucket: int = 64
  weights: str = "model"
  int8_paths: str = "auto"
  int4_matmul: str = "auto"

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
    common.check_one_of(SamplingBlock, "int4_matmul", self.int4_matmul, INT4_MATMULS)
    if self.int8_paths != "auto":  # a typo fails even before it is used
      quant.parse_paths(self.int8_paths)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """An environment run's `eval` block: greedy episodes on held-out seeds before training,
  every `every` iterations and after the last (0: off), `num_tasks` of them, `batch_tasks` per rollout call (0: all),
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


NO_LOG = LogConfig(trajectories_every=0, trajectories_logged=0)  # a config with no `log` block


@dataclasses.dataclass(frozen=True)
class ToolsConfig:
  """An environment run's `tools` block: `enabled` wraps the environment with the tool
  registry; a tool result's text is clipped to `max_result_chars`; `format`: the call
  syntax, "library" (`<tool>NAME: ARGUMENT</tool>`, any scaffold), "native" (the one the
  model's chat template writes, `tool_formats.detect`; the library's when the template has
  no tool section) or a format by name (`tool_formats.FORMATS`); a native format needs
  the template scaffold (`rollout.template=template`)."""

  enabled: bool = False
  max_result_chars: int = 200
  format: str = "library"

  def __post_init__(self):
    common.check_one_of(ToolsConfig, "format", self.format, ("native", *tool_formats.FORMATS))
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
