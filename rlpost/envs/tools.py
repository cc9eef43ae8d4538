"""Tool calls inside a multi-turn episode: the one call syntax, the registry, the env wrapper.

The one documented syntax (an SFT trace converter must write exactly this):

  call    <tool>NAME: ARGUMENT</tool>     e.g. <tool>calculator: 48/2</tool>
  result  <result>TEXT</result>           e.g. <result>24</result>

CALL_CLOSE is a stop string: a rollout ends the model's turn when it closes a call, the
wrapper (`with_tools`) runs the tool and shows the result as the next observation. Numbers
in results are written by `format_number`, the one result format for numbers.
"""

import types
from collections.abc import Callable, Mapping
from typing import NamedTuple

from rlpost.envs import calculator
from rlpost.envs.protocol import Env, Step, check_env

CALL_OPEN = "<tool>"
CALL_CLOSE = "</tool>"
RESULT_OPEN = "<result>"
RESULT_CLOSE = "</result>"
ERROR_PREFIX = "error: "
TRUNCATION_MARKER = "...[truncated]"

format_number = calculator.format_number  # THE result format for numbers

Registry = Mapping[str, Callable[[str], str]]
REGISTRY: Registry = types.MappingProxyType({"calculator": calculator.calculator})


class ToolCall(NamedTuple):
  """A parsed call: the tool's name and its argument text (both stripped)."""

  name: str
  argument: str


def parse_tool_call(text: str) -> ToolCall | None | str:
  """The call in an assistant turn: None (no CALL_OPEN in the text), a ToolCall, or an
  "error: ..." string for a malformed call.

  The call read is the one opened by the LAST CALL_OPEN, running to the next CALL_CLOSE;
  its body must be "NAME: ARGUMENT" with NAME an identifier (split at the first colon).
  """
  start = text.rfind(CALL_OPEN)
  if start < 0:
    return None
  start += len(CALL_OPEN)
  end = text.find(CALL_CLOSE, start)
  if end < 0:
    return f"{ERROR_PREFIX}tool call has no closing {CALL_CLOSE} tag"
  name, colon, argument = text[start:end].partition(":")
  name = name.strip()
  if not colon:
    return f"{ERROR_PREFIX}a tool call must look like {CALL_OPEN}NAME: ARGUMENT{CALL_CLOSE}"
  if not name:
    return f"{ERROR_PREFIX}tool call has no tool name"
  if not name.isidentifier():
    return f"{ERROR_PREFIX}tool name must be an identifier, got {name[:40]!r}"
  return ToolCall(name, argument.strip())


def clip(text: str, max_chars: int) -> str:
  """`text` cut to at most `max_chars` characters, ending in TRUNCATION_MARKER if cut."""
  if max_chars < len(TRUNCATION_MARKER):
    raise ValueError(f"max_chars must be at least {len(TRUNCATION_MARKER)}, got {max_chars}")
  if len(text) <= max_chars:
    return text
  return text[: max_chars - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER


def _call(registry: Registry, call: ToolCall) -> str:
  """The tool's raw result text, or an error string; never raises for a tool's failure
  (an exception, a non-str result, text with a lone surrogate that no tokenizer encodes)."""
  tool = registry.get(call.name)
  if tool is None:
    known = ", ".join(sorted(registry)) or "none"
    return f"{ERROR_PREFIX}unknown tool {call.name!r}; known tools: {known}"
  try:
    result = tool(call.argument)
  except Exception as e:
    message = f"{ERROR_PREFIX}tool {call.name} failed: {type(e).__name__}: {e}"
    return message.encode("utf-8", "backslashreplace").decode("utf-8")
  if not isinstance(result, str):
    return f"{ERROR_PREFIX}tool {call.name} returned {type(result).__name__}, not str"
  try:
    result.encode("utf-8")
  except UnicodeEncodeError as e:
    return (
      f"{ERROR_PREFIX}tool {call.name} returned text that is not UTF-8 "
      f"({result[e.start]!a} at index {e.start})"
    )
  return result


def run_tool(registry: Registry, call: ToolCall, max_chars: int) -> tuple[str, bool]:
  """(result text clipped to `max_chars`, is_error); is_error when it starts with "error: "."""
  result = _call(registry, call)
  return clip(result, max_chars), result.startswith(ERROR_PREFIX)


def result_observation(text: str) -> str:
  """A tool's result as the model sees it: RESULT_OPEN + text + RESULT_CLOSE."""
  return f"{RESULT_OPEN}{text}{RESULT_CLOSE}"


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
