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

With a chat template (`ChatSetup.template`: the model file's, or `model.chat_template`)
the conversation is the template's rendering (`template_ids.conversation_ids`: tools in
its tool section, `tool` messages and `tool_calls` as it writes them), and completions are
read by the template's tool format (`tool_formats.detect`, or `ChatSetup.tool_format`):
a turn with a malformed call stays content, as vLLM's parsers do. A template without a
tool section given tools falls back to the library syntax, described in the system turn.
"""

import dataclasses
import json
import uuid

from rlpost.text import chat_formats, chat_template, template_ids, tool_formats, tool_syntax

DEFAULT_ARGUMENT = "argument"


@dataclasses.dataclass(frozen=True)
class ChatSetup:
  """template: the chat template (None: the tokenizer's hand-written layout);
  tool_format: the format completions' calls are read in (`tool_formats.FORMATS`);
  date_string: the day templates print."""

  template: chat_template.ChatTemplate | None = None
  tool_format: str = "library"
  date_string: str = chat_template.DEFAULT_DATE


def setup(
  template: chat_template.ChatTemplate | None,
  tool_format: str = "native",
  date: str = chat_template.DEFAULT_DATE,
) -> ChatSetup:
  """The ChatSetup of a template: its own tool format when `tool_format` is native."""
  if tool_format == "native":
    tool_format = tool_formats.detect(template.text) if template is not None else "library"
  tool_formats.get(tool_format)
  return ChatSetup(template, tool_format, date)


def _setup(chat: ChatSetup | None) -> ChatSetup:
  return chat or ChatSetup()


def stop_strings(tools: tuple, chat: ChatSetup | None = None) -> tuple[str, ...]:
  """Strings that end a turn holding a tool call (kept in the text); () without tools."""
  if not tools:
    return ()
  return tool_formats.get(_setup(chat).tool_format).stop_strings


CALL_OPENERS = {
  "library": (tool_syntax.CALL_OPEN,),
  "hermes": (tool_formats.HERMES_OPEN,),
  "mistral": (tool_formats.TOOL_CALLS,),
  "llama3_json": (tool_formats.PYTHON_TAG, "{"),
}


def call_openers(tools: tuple, chat: ChatSetup | None = None) -> tuple[str, ...]:
  """Strings a tool call of the setup's format may begin with (a stream holds its text
  back from them); () without tools."""
  if not tools:
    return ()
  return CALL_OPENERS[_setup(chat).tool_format]


def prompt_ids(
  tokenizer, messages: list[dict], tools: tuple, chat: ChatSetup | None = None
) -> list[int]:
  """Messages ({"role", "content": str, "tool_calls"?}, content parts already joined)
  and the enabled tools (OpenAI function dicts, () for none) -> prompt ids ending with
  the assistant's opening. ValueError for a conversation the layout cannot hold."""
  chat = _setup(chat)
  if chat.template is not None and (not tools or chat.tool_format != "library"):
    return template_ids.conversation_ids(
      chat.template,
      tokenizer,
      [_template_message(m) for m in messages],
      tools=list(tools) or None,
      add_generation_prompt=True,
      date_string=chat.date_string,
    )
  turns = [_as_turn(m) for m in messages]
  if tools:
    if turns and turns[0]["role"] == "system":
      turns[0] = {"role": "system", "content": turns[0]["content"] + "\n\n" + _describe(tools)}
    else:
      turns.insert(0, {"role": "system", "content": _describe(tools)})
  if chat.template is not None:
    return template_ids.conversation_ids(
      chat.template, tokenizer, turns, add_generation_prompt=True, date_string=chat.date_string
    )
  return chat_formats.conversation_ids(tokenizer, turns)


def _template_message(message: dict) -> dict:
  """An OpenAI message as templates read it: a call's JSON-text arguments as an object."""
  calls = message.get("tool_calls")
  if not calls:
    return message
  out = []
  for call in calls:
    function = dict(call.get("function") or {})
    try:
      function["arguments"] = json.loads(function.get("arguments") or "{}")
    except (TypeError, json.JSONDecodeError):
      pass  # not JSON text: the template writes it as it is
    out.append({**call, "function": function})
  return {**message, "tool_calls": out}


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


def split_tool_calls(
  text: str, tools: tuple, chat: ChatSetup | None = None
) -> tuple[str | None, list[dict]]:
  """(content, tool_calls) of a completion: well-formed calls of enabled tools become
  OpenAI tool calls (content: the text before them, None if empty); any other text
  (a malformed call, an unknown tool) is content with no calls."""
  fmt = tool_formats.get(_setup(chat).tool_format)
  if tools and fmt.native:
    parsed = fmt.parse(text)
    names = {t["function"]["name"] for t in tools}
    if not parsed.calls or any(c.error or c.name not in names for c in parsed.calls):
      return text, []
    calls = [
      {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
      }
      for c in parsed.calls
    ]
    return parsed.content or None, calls
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
