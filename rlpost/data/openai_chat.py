"""SFT records in the OpenAI message shape (the shape the OpenAI API and TRL use): assistant
tool calls and `tool` results (and an assistant's reasoning text, `reasoning_content`,
`thinking` or `reasoning`, which templates such as Qwen3's write), checked and normalized
before any compute.

  {"messages": [
     {"role": "system", "content": str},                                  optional, first
     {"role": "user", "content": str},
     {"role": "assistant", "content": str | null,
      "tool_calls": [{"id": str, "type": "function",
                      "function": {"name": str, "arguments": {...} | "{...}"}}]},
     {"role": "tool", "tool_call_id": str, "name": str, "content": str},
     {"role": "assistant", "content": str}],
   "tools": [{"type": "function", "function": {"name": str, ...}}]}          optional

Order (RULE): after an optional system message, a user message; a user message is answered
by an assistant message; an assistant message with tool calls is followed by one tool
message per call (matched by `tool_call_id`, any order), then by an assistant message; the
conversation ends with an assistant message whose calls (if any) are all answered.

Normalized: arguments given as JSON text (as the OpenAI API sends them) are parsed to an
object (templates write `arguments | tojson`, which would quote a string); a call without an
id gets `tool_formats.call_id(n)` (n counts the record's calls: the 9 characters Mistral's
templates need); a tool message without `tool_call_id` answers the first unanswered call,
and one without `name` takes its call's; a null assistant content beside calls becomes "".
Every error is a `DataError` naming the record (`where`), the message index and the field.
"""

import json
from typing import Any

from rlpost import errors
from rlpost.text import tool_formats

ROLES = ("system", "user", "assistant", "tool")
RULE = (
  "after an optional system message: user, then assistant; an assistant's tool calls are "
  "each answered by a tool message before the next assistant message; the last message is "
  "an assistant's with every call answered"
)


REASONING = ("reasoning_content", "thinking", "reasoning")  # an assistant's reasoning text


def openai_fields(record: Any) -> bool:
  """Whether an SFT record uses fields beyond role/content: `tools`, `tool_calls`, `tool`
  messages, an assistant's reasoning (REASONING keys)."""
  if not isinstance(record, dict):
    return False
  messages = record.get("messages")
  extra = {"tool_calls", *REASONING}
  used = isinstance(messages, list) and any(
    isinstance(m, dict) and (m.get("role") == "tool" or not extra.isdisjoint(m)) for m in messages
  )
  return "tools" in record or used


def _reasoning(message: dict, where: str, k: int) -> dict:
  """The REASONING fields of an assistant message (strings; the template writes them)."""
  out = {key: message[key] for key in REASONING if key in message}
  for key, value in out.items():
    if not isinstance(value, str):
      _fail(where, f"messages[{k}].{key}", value, "give the reasoning text as a string")
  return out


def _fail(where: str, field: str, value: Any, fix: str):
  raise errors.DataError(f"{where}: {field}={value!r:.80}: {fix}")


def _text(message: dict, where: str, field: str) -> str:
  value = message.get("content")
  if not isinstance(value, str):
    _fail(where, field, value, "give a string")
  return value


def _arguments(value: Any, where: str, field: str) -> dict:
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      _fail(where, field, value, f"is not JSON ({e.msg}): give a JSON object or its text")
  if not isinstance(value, dict):
    _fail(where, field, value, "give the arguments as a JSON object (or its text)")
  return value


def _calls(raw: Any, where: str, k: int, first: int) -> list[dict]:
  """The normalized tool calls of messages[k]; `first` numbers ids not given."""
  if not isinstance(raw, list) or not raw:
    _fail(where, f"messages[{k}].tool_calls", raw, "give a non-empty list of calls")
  out = []
  for j, call in enumerate(raw):
    field = f"messages[{k}].tool_calls[{j}]"
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
      _fail(
        where, field, call, 'give {"id", "type": "function", "function": {"name", "arguments"}}'
      )
    if call.get("type", "function") != "function":
      _fail(where, f"{field}.type", call["type"], 'only "function" calls exist')
    name = call["function"].get("name")
    if not isinstance(name, str) or not name:
      _fail(where, f"{field}.function.name", name, "give the tool's name (a non-empty string)")
    call_id = call.get("id", tool_formats.call_id(first + j))
    if not isinstance(call_id, str) or not call_id or call_id in {c["id"] for c in out}:
      _fail(where, f"{field}.id", call_id, "give each call of a turn its own non-empty string id")
    arguments = _arguments(
      call["function"].get("arguments", {}), where, f"{field}.function.arguments"
    )
    out.append(
      {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    )
  return out


def _tool_result(message: dict, pending: list[dict], where: str, k: int) -> dict:
  """The normalized tool message k, answering (and removing) one of the `pending` calls."""
  if not pending:
    _fail(where, f"messages[{k}].role", "tool", f"no tool call is waiting for a result ({RULE})")
  call_id = message.get("tool_call_id", pending[0]["id"])
  call = next((c for c in pending if c["id"] == call_id), None)
  if call is None:
    waiting = [c["id"] for c in pending]
    _fail(where, f"messages[{k}].tool_call_id", call_id, f"answer one of the calls {waiting}")
  pending.remove(call)
  name = message.get("name", call["function"]["name"])
  if name != call["function"]["name"]:
    _fail(where, f"messages[{k}].name", name, f"call {call_id} is to {call['function']['name']!r}")
  content = _text(message, where, f"messages[{k}].content")
  return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def _check_tools(tools: Any, where: str) -> list[dict]:
  if not isinstance(tools, list):
    _fail(where, "tools", tools, "give a list of tool schemas")
  for j, tool in enumerate(tools):
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
      _fail(where, f"tools[{j}]", tool, 'give {"type": "function", "function": {"name": ...}}')
  return tools


def record(obj: Any, where: str = "record") -> dict:
  """The normalized {"messages": [...][, "tools": [...]]} of an OpenAI-shaped SFT record."""
  raw = obj.get("messages") if isinstance(obj, dict) else None
  if not isinstance(raw, list) or not raw:
    _fail(where, "messages", raw, "give a non-empty list of messages")
  messages, pending, previous, n_calls = [], [], "start", 0
  for k, message in enumerate(raw):
    role = message.get("role") if isinstance(message, dict) else None
    if not isinstance(message, dict) or role not in ROLES:
      _fail(where, f"messages[{k}].role", role, f"give an object whose role is one of {ROLES}")
    allowed = {
      "system": k == 0,
      "user": previous in ("start", "system", "assistant") and not pending,
      "assistant": previous in ("user", "tool") and not pending,
      "tool": previous in ("calls", "tool"),
    }[role]
    if not allowed:
      after = f"messages[{k - 1}] ({previous})" if k else "the start"
      _fail(where, f"messages[{k}].role", role, f"cannot follow {after}: {RULE}")
    if role == "tool":
      messages.append(_tool_result(message, pending, where, k))
    elif role == "assistant" and message.get("tool_calls") is not None:
      pending = _calls(message["tool_calls"], where, k, n_calls)
      n_calls += len(pending)
      content = (
        "" if message.get("content") is None else _text(message, where, f"messages[{k}].content")
      )
      messages.append({"role": "assistant", "content": content, "tool_calls": list(pending)})
      messages[-1].update(_reasoning(message, where, k))
      role = "calls"
    else:
      messages.append({"role": role, "content": _text(message, where, f"messages[{k}].content")})
      messages[-1].update(_reasoning(message, where, k) if role == "assistant" else {})
    previous = role
  if previous != "assistant":
    _fail(
      where, f"messages[{len(raw) - 1}].role", raw[-1].get("role"), f"end with an answer: {RULE}"
    )
  out = {"messages": messages}
  if "tools" in obj:
    out["tools"] = _check_tools(obj["tools"], where)
  return out
