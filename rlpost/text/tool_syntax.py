"""The one tool-call syntax of this library (an SFT trace converter must write exactly this):

  call    <tool>NAME: ARGUMENT</tool>     e.g. <tool>calculator: 48/2</tool>
  result  <result>TEXT</result>           e.g. <result>24</result>

CALL_CLOSE is a stop string: a rollout ends the model's turn when it closes a call; the
environment (`rlpost.envs.tools.with_tools`) runs the tool and shows the result as the
next observation. Text only: which tools exist and how they run is `rlpost.envs.tools`.
"""

from typing import NamedTuple

CALL_OPEN = "<tool>"
CALL_CLOSE = "</tool>"
RESULT_OPEN = "<result>"
RESULT_CLOSE = "</result>"
ERROR_PREFIX = "error: "
TRUNCATION_MARKER = "...[truncated]"


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


def result_observation(text: str) -> str:
  """A tool's result as the model sees it: RESULT_OPEN + text + RESULT_CLOSE."""
  return f"{RESULT_OPEN}{text}{RESULT_CLOSE}"
