"""The environment table: a config's `env.name` -> the environment's config and builder.

Adding an environment takes one module under `rlpost/envs/` with a frozen config
dataclass (its `env` block's fields, checked on construction) and `build(config,
run: protocol.RunInfo) -> protocol.EnvTasks`, one entry in ENVS, and its config block
(`experiments/configs/agentic.py`); `--config.env.name=NAME` selects it. Prompt datasets
(GSM8K, arithmetic, digit, a JSONL file) are entries too (`prompt_dataset`), and so are the
packages' environments: reasoning-gym tasks, gymnasium's toy-text games, textarena games
(each imports its package only when chosen).

A user's own environment needs no entry: `env.name=MODULE:FUNCTION` imports MODULE and
calls FUNCTION() for an `EnvSpec` (or any object with `config` and `build`), or for
`protocol.EnvTasks` directly (an env block of no further fields). It is checked as the
built-in ones are (its config's fields, `protocol.check_env`).
"""

import dataclasses
import functools
import importlib
from typing import Any, Callable, NamedTuple

from rlpost import errors
from rlpost.envs import agent as agent_env
from rlpost.envs import frozenlake
from rlpost.data import tasks as tasks_lib
from rlpost.envs import gsm8k_calc
from rlpost.envs import prompt_dataset
from rlpost.envs import protocol
from rlpost.envs import reasoning_gym
from rlpost.envs import textarena_games
from rlpost.envs import native_tools
from rlpost.envs import tool_functions
from rlpost.envs import tools
from rlpost.text import tool_formats
from rlpost.envs import toy_text


class EnvSpec(NamedTuple):
  """config: the `env` block's dataclass; build: (config, RunInfo) -> EnvTasks;
  takes_tools: whether the `tools` block may wrap it (an environment that answers
  calls itself says False); own_tools: whether it offers tools of its own."""

  config: type
  build: Callable[[Any, protocol.RunInfo], protocol.EnvTasks]
  takes_tools: bool = True
  own_tools: bool = False


ENVS: dict[str, EnvSpec] = {
  "frozenlake": EnvSpec(frozenlake.FrozenLakeConfig, frozenlake.build),
  gsm8k_calc.NAME: EnvSpec(
    gsm8k_calc.GSM8KCalcConfig, gsm8k_calc.build, takes_tools=False, own_tools=True
  ),
  # prompt datasets: each prompt a one-turn episode scored by the dataset's rewards
  **{
    source: EnvSpec(prompt_dataset.config_class(source), prompt_dataset.build, takes_tools=False)
    for source in tasks_lib.SOURCES
  },
  # the packages' environments (extras reasoning-gym, gymnasium, textarena)
  "reasoning_gym": EnvSpec(reasoning_gym.ReasoningGymConfig, reasoning_gym.build),
  "gymnasium": EnvSpec(toy_text.GymConfig, toy_text.build),
  "textarena": EnvSpec(textarena_games.TextArenaConfig, textarena_games.build),
  # user code behind the OpenAI-compatible endpoint (the `openai` package)
  "agent": EnvSpec(agent_env.AgentEnvConfig, agent_env.build, takes_tools=False),
}


@dataclasses.dataclass(frozen=True)
class NoFields:
  """The env block of a user environment given as EnvTasks: no fields besides `name`."""


@functools.cache
def _user_spec(name: str) -> EnvSpec:
  """The EnvSpec a user's `MODULE:FUNCTION` returns (module docstring)."""
  module_name, _, function = name.partition(":")
  where = f"config.env.name={name!r}"
  try:
    module = importlib.import_module(module_name)
  except ImportError as err:
    raise errors.ConfigError(
      f"{where}: module {module_name!r} does not import ({err}); put it on PYTHONPATH"
    ) from None
  make_spec = getattr(module, function, None)
  if not callable(make_spec):
    raise errors.ConfigError(
      f"{where}: {module_name} has no function {function!r} returning an EnvSpec or EnvTasks"
    )
  got = make_spec()
  if isinstance(got, protocol.EnvTasks):
    return EnvSpec(NoFields, lambda config, run: got)
  config, build = getattr(got, "config", None), getattr(got, "build", None)
  if not (dataclasses.is_dataclass(config) and isinstance(config, type) and callable(build)):
    raise errors.ConfigError(
      f"{where}: {function}() returned {type(got).__name__}; return "
      "rlpost.envs.table.EnvSpec(ConfigDataclass, build) or rlpost.envs.protocol.EnvTasks"
    )
  return EnvSpec(config, build, getattr(got, "takes_tools", True), getattr(got, "own_tools", False))


def spec_of(name: str) -> EnvSpec:
  """The table's entry `name`, or a user's `MODULE:FUNCTION`; ConfigError otherwise."""
  if name in ENVS:
    return ENVS[name]
  if isinstance(name, str) and ":" in name:
    return _user_spec(name)
  raise errors.ConfigError(
    f"config.env.name={name!r}: use one of {sorted(ENVS)}, or MODULE:FUNCTION for your own "
    "(a function returning an EnvSpec or EnvTasks)"
  )


def offers_tools(name: str, tools_enabled: bool) -> bool:
  """Whether episodes of environment `name` can call a tool (an unknown name: False; it is
  refused, naming the choices, when the environment is built)."""
  spec = ENVS.get(name)
  if spec is None and isinstance(name, str) and ":" in name:
    spec = _user_spec(name)
  return tools_enabled or (spec is not None and spec.own_tools)


def env_config(block: dict) -> Any:
  """The typed config of an `env` block {"name": ..., fields...}; errors name the field."""
  block = dict(block)
  name = block.pop("name", None)
  spec = spec_of(name)
  fields = list(spec.config.__dataclass_fields__)
  unknown = sorted(set(block) - set(fields))
  if unknown:
    raise errors.ConfigError(
      f"config.env.name={name!r}: this env block has {unknown}, which {name} does not "
      f"take (its fields: {fields}); start from an agentic config made for {name} "
      "(experiments/configs/agentic.py) or set these fields to its own"
    )
  try:
    return spec.config(**block)
  except (TypeError, ValueError) as err:
    message = str(err)
    if message.split("=", 1)[0] in fields:  # "field=value ...": name it in the config
      raise errors.ConfigError(f"config.env.{message} (env.name={name!r})") from None
    raise errors.ConfigError(f"config.env ({name}): {message}") from None


def make(
  name: str, config: Any, run: protocol.RunInfo, tools_enabled: bool, tool_format: str = "library"
) -> protocol.EnvTasks:
  """The environment `name` built from its typed config, wrapped with the calculator tool
  when `tools_enabled` (its results clipped to `run.max_result_chars`): in the library's
  syntax, or in a native `tool_format` (`rlpost.text.tool_formats`: calls in the model's
  own format, results as `tool` messages, `rlpost.envs.native_tools`)."""
  spec = spec_of(name)
  if tools_enabled and not spec.takes_tools:
    raise errors.ConfigError(
      f"config.tools.enabled=True: {name} answers tool calls itself; use False"
    )
  if spec.own_tools and dataclasses.is_dataclass(config) and hasattr(config, "tool_format"):
    config = dataclasses.replace(config, tool_format=tool_format)  # it answers calls itself
  env_tasks = spec.build(config, run)
  if not isinstance(env_tasks, protocol.EnvTasks):
    raise errors.ConfigError(
      f"config.env.name={name!r}: its build returned {type(env_tasks).__name__}, not "
      "rlpost.envs.protocol.EnvTasks"
    )
  try:
    protocol.check_env(env_tasks.env)
  except ValueError as err:
    raise errors.ConfigError(f"config.env.name={name!r}: {err}") from None
  if tools_enabled and tool_format != "library":
    fmt, toolset = tool_formats.get(tool_format), tool_functions.function_tools(tools.REGISTRY)
    env = native_tools.with_native_tools(env_tasks.env, toolset, fmt, run.max_result_chars)
    env_tasks = env_tasks._replace(env=env)
  elif tools_enabled:
    env = tools.with_tools(env_tasks.env, tools.REGISTRY, run.max_result_chars)
    env_tasks = env_tasks._replace(env=env)
  return env_tasks
