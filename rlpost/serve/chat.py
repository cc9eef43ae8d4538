"""The two seams between OpenAI chat messages and the model's tokens.

  prompt_ids(tokenizer, messages, tools)   conversation -> prompt ids
  split_tool_calls(text, tools)            completion text -> (content, OpenAI tool_calls)

Today both use what the library has: `chat_formats.conversation_ids` (system / user /
assistant turns in the model file's layout) and the library's one tool-call syntax,
`<tool>NAME: ARGUMENT</tool>` (`tool_syntax`). Tools are described in the system turn; a
`tool` message is a user turn holding `<result>...</result>`; an assistant message's
`tool_calls` are written back in the call syntax. OpenAI's `arguments` is a JSON object:
the call's one argument goes under the tool's single parameter name (`argument` when
its schema has none or several), and comes back from a one-value object.

Issue 66 replaces the body of each function (and nothing else): `prompt_ids` by
`text.chat_template.render(template, messages, tools=..., add_generation_prompt=True)`
then its text-to-ids function; `split_tool_calls` by the model format's
`text.tool_formats` parser, and `stop_strings` by that format's stop strings.
"""

import json
import uuid

from rlpost.text import chat_formats, tool_syntax

DEFAULT_ARGUMENT = "argument"


def stop_strings(tools: tuple) -> tuple[str, ...]:
  """Strings that end a turn holding a tool call (kept in the text); () without tools."""
  return (tool_syntax.CALL_CLOSE,) if tools else ()


def prompt_ids(tokenizer, messages: list[dict], tools: tuple) -> list[int]:
  """Messages ({"role", "content": str, "tool_calls"?}, content parts already joined)
  and the enabled tools (OpenAI function dicts, () for none) -> prompt ids ending with
  the assistant's opening. ValueError for a conversation the layout cannot hold."""
  turns = [_as_turn(m) for m in messages]
  if tools:
    if turns and turns[0]["role"] == "system":
      turns[0] = {"role": "system", "content": turns[0]["content"] + "\n\n" + _describe(tools)}
    else:
      turns.insert(0, {"role": "system", "content": _describe(tools)})
  return chat_formats.conversation_ids(tokenizer, turns)


def _as_turn(message: dict) -> dict:
  role, content = message["role"], message.get("content") or ""
  if role == "tool":
    return {"role": "user", "content": tool_syntax.result_observation(content)}
  calls = message.get("tool_calls") or ()
  written = "".join(_call_text(c) for c in calls)
  return {"role": role, "content": content + written}


def _call_text(call: dict) -> str:
  function = call.get("function") or {}
  arguments = function.get("arguments", "")
  try:
    parsed = json.loads(arguments)
  except (TypeError, json.JSONDecodeError):
    parsed = None
  if isinstance(parsed, dict) and len(parsed) == 1:
    arguments = str(next(iter(parsed.values())))
  name = function.get("name", "")
  return f"{tool_syntax.CALL_OPEN}{name}: {arguments}{tool_syntax.CALL_CLOSE}"


def _describe(tools: tuple) -> str:
  head = (
    "You can call a tool by writing "
    f"{tool_syntax.CALL_OPEN}NAME: ARGUMENT{tool_syntax.CALL_CLOSE}; its result comes back "
    f"as {tool_syntax.RESULT_OPEN}...{tool_syntax.RESULT_CLOSE}. Tools:"
  )
  lines = [head]
  for tool in tools:
    f = tool["function"]
    lines.append(f"- {f['name']}: {f.get('description', '')}".rstrip())
  return "\n".join(lines)


def _argument_name(tool: dict) -> str:
  properties = (tool["function"].get("parameters") or {}).get("properties") or {}
  return next(iter(properties)) if len(properties) == 1 else DEFAULT_ARGUMENT


def split_tool_calls(text: str, tools: tuple) -> tuple[str | None, list[dict]]:
  """(content, tool_calls) of a completion: a well-formed call of an enabled tool becomes
  one OpenAI tool call (content: the text before it, None if empty); any other text is
  content with no calls."""
  by_name = {t["function"]["name"]: t for t in tools}
  call = tool_syntax.parse_tool_call(text) if tools else None
  if not isinstance(call, tool_syntax.ToolCall) or call.name not in by_name:
    return text, []
  before = text[: text.rfind(tool_syntax.CALL_OPEN)]
  arguments = json.dumps({_argument_name(by_name[call.name]): call.argument})
  function = {"name": call.name, "arguments": arguments}
  return before or None, [
    {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}
  ]
