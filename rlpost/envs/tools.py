"""Tool calls inside a multi-turn episode: the registry, running a call, the env wrapper.

The call syntax is `rlpost.text.tool_syntax`. Numbers in results are written by
`format_number`, the one result format for numbers. A registry maps names to functions;
the same registry serves native JSON calls (`rlpost.envs.tool_functions`: the functions'
type hints and docstrings give their schemas).
"""

import types
from collections.abc import Callable, Mapping

from rlpost.envs import calculator
from rlpost.envs.protocol import Env, Step, check_env
from rlpost.text.tool_syntax import (
  CALL_CLOSE,
  CALL_OPEN,
  ERROR_PREFIX,
  ToolCall,
  clip,
  parse_tool_call,
  result_observation,
)

format_number = calculator.format_number  # THE result format for numbers

Registry = Mapping[str, Callable[[str], str]]
REGISTRY: Registry = types.MappingProxyType({"calculator": calculator.calculator})


def unknown_tool(registry: Mapping, name: str) -> str:
  """The error for a call to a tool the registry does not hold, listing the known ones."""
  known = ", ".join(sorted(registry)) or "none"
  return f"{ERROR_PREFIX}unknown tool {name!r}; known tools: {known}"


def contained(name: str, invoke: Callable[[], object]) -> str:
  """`invoke()`'s text, or an error string; never raises for a tool's failure (an
  exception, a non-str result, text with a lone surrogate that no tokenizer encodes)."""
  try:
    result = invoke()
  except Exception as e:
    message = f"{ERROR_PREFIX}tool {name} failed: {type(e).__name__}: {e}"
    return message.encode("utf-8", "backslashreplace").decode("utf-8")
  if not isinstance(result, str):
    return f"{ERROR_PREFIX}tool {name} returned {type(result).__name__}, not str"
  try:
    result.encode("utf-8")
  except UnicodeEncodeError as e:
    return (
      f"{ERROR_PREFIX}tool {name} returned text that is not UTF-8 "
      f"({result[e.start]!a} at index {e.start})"
    )
  return result


def _call(registry: Registry, call: ToolCall) -> str:
  """The tool's raw result text, or an error string: the argument text is the function's
  one positional argument (a function tool's one string parameter)."""
  tool = registry.get(call.name)
  if tool is None:
    return unknown_tool(registry, call.name)
  return contained(call.name, lambda: tool(call.argument))


def run_tool(registry: Registry, call: ToolCall, max_chars: int) -> tuple[str, bool]:
  """(result text clipped to `max_chars`, is_error); is_error when it starts with "error: "."""
  result = _call(registry, call)
  return clip(result, max_chars), result.startswith(ERROR_PREFIX)


def answer_call(registry: Registry, call: ToolCall | str, max_chars: int) -> tuple[str, bool]:
  """(observation, is_error) answering a `parse_tool_call` result that is not None: the
  tool's result, or the parse error, clipped to `max_chars` inside the result tags."""
  if isinstance(call, str):
    result, is_error = clip(call, max_chars), True
  else:
    result, is_error = run_tool(registry, call, max_chars)
  return result_observation(result), is_error


def check_registry(registry: Registry) -> dict:
  """`registry` as a dict, or ValueError naming the entry a call could never reach: every
  name must be an identifier (the call syntax's NAME) and every tool callable."""
  registry = dict(registry)
  for name, tool in registry.items():
    if not (isinstance(name, str) and name.isidentifier()):
      raise ValueError(
        f"tool registry: name {name!r} is not an identifier, so {CALL_OPEN}NAME: ...{CALL_CLOSE} "
        f"can never call it; rename it (e.g. {str(name).replace('-', '_')!r})"
      )
    if not callable(tool):
      raise ValueError(
        f"tool registry: tool {name!r} is {type(tool).__name__}, not a function of the "
        "argument text"
      )
  return registry


def with_tools(env: Env, registry: Registry = REGISTRY, max_result_chars: int = 200) -> Env:
  """`env` with tool calls: a turn holding a call (see `parse_tool_call`) is answered by the
  tool (reward 0.0, not done, state unchanged, info tool_call/tool_error); any other turn
  goes to `env.step`, whose info gets tool_call False. Adds CALL_CLOSE to stop_strings."""
  clip("", max_result_chars)  # validates the budget now, not at the first call
  check_env(env)
  registry = check_registry(registry)

  def step(state, assistant_text: str) -> Step:
    call = parse_tool_call(assistant_text)
    if call is None:
      inner = env.step(state, assistant_text)
      if not (isinstance(inner, tuple) and len(inner) == 5 and isinstance(inner[4], dict)):
        return inner  # malformed: left for the driver's check (multiturn.checked_step) to name
      inner = Step(*inner)
      return inner._replace(info={**inner.info, "tool_call": False})
    observation, is_error = answer_call(registry, call, max_result_chars)
    info = {"tool_call": True, "tool_error": is_error}
    return Step(state, observation, 0.0, False, info)

  stops = tuple(env.stop_strings) + ((CALL_CLOSE,) if CALL_CLOSE not in env.stop_strings else ())
  return env._replace(step=step, stop_strings=stops)
