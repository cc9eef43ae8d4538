"""Tool calls in a model's own format: one parser (and renderer) per format, text only.

  hermes       Qwen2.5, Qwen3, Hermes, SmolLM3: <tool_call>{"name": N, "arguments": {...}}</tool_call>,
               several per turn; calls inside a <think> block (before the first </think>) are not read
  llama3_json  Llama 3.1+: {"name": N, "parameters": {...}} ("arguments" also), several
               separated by ";", with or without a leading <|python_tag|>
  mistral      [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] and the newer
               [TOOL_CALLS]N[ARGS]{...} (optionally N[CALL_ID]ID[ARGS]{...}), repeated
  library      this library's <tool>NAME: ARGUMENT</tool> (tool_syntax), one call per turn: the
               fallback for templates with no tool section (Gemma 3, SmolLM2)

`get(name).parse(text)` gives `Parsed(content, calls)`: the text before the first call and
each call as `Call(name, arguments, id, error)`; a malformed call (broken or cut-off JSON,
no name, arguments not an object) is a Call whose `error` is an "error: ..." text the model
is shown; nothing raises. `detect(template_text)` picks the format from a chat template.

Stop strings: the native formats add none. Their models write several calls in one turn
and end it with their own end-of-turn token (<|im_end|>, <|eot_id|>/<|eom_id|>, </s>);
stopping at the first </tool_call> would cut the second call off and leave the turn without
the end-of-turn token the template renders, so re-rendered history would not extend the
sampled tokens. The library syntax stops at </tool> (one call per turn, as before).
The markers <|python_tag|> and [TOOL_CALLS] are control tokens: parse text decoded with
control tokens written (`Tokenizer.decode(..., skip_special=False)`).

Where we differ from vLLM's parsers (vllm/entrypoints/openai/tool_parsers, non-streaming):
- vLLM treats a turn it cannot parse as plain content; we answer it with a named error
  (broken JSON, no "name", "arguments" not an object, a call cut off) so the model learns
  the format. One bad call does not drop the turn's good calls (vLLM drops all).
- hermes: vLLM reads an unclosed last <tool_call> to the end of the text; we call it cut
  off (the token limit ended the turn). As in vLLM, a JSON string holding "</tool_call>"
  ends its call there (the format cannot tell).
- llama3_json: vLLM searches the first JSON object anywhere (two levels of braces at
  most) and returns no content. We read calls after <|python_tag|> or when the turn starts
  with "{" (errors if malformed); elsewhere only a whole object with a "name" at the first
  "{" is a call (else the turn is content, as in vLLM); any nesting depth; the text before
  the call is kept as content. Python code after <|python_tag|> (built-in tools) is an error.
- mistral: list and NAME[ARGS] forms may mix across [TOOL_CALLS] markers.
- ids: a 9-alphanumeric "id" the model wrote (list form, [CALL_ID]) is kept; other ids are
  ours, "call" + 5 digits (Mistral's templates refuse other lengths), numbered within the
  turn (vLLM draws random ids; deterministic ids keep a run reproducible).
"""

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from rlpost.text import tool_syntax

ERROR_PREFIX = tool_syntax.ERROR_PREFIX
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
THINK_CLOSE = "</think>"
PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
XML_FUNCTION = "<function="
LLAMA3_HEADER = "<|start_header_id|>"
_DECODER = json.JSONDecoder()


class Call(NamedTuple):
  """One tool call. arguments: the JSON object (a dict), or for the library syntax the
  argument text; error: "" for a well-formed call, else the "error: ..." the model sees."""

  name: str
  arguments: dict | str
  id: str
  error: str = ""


class Parsed(NamedTuple):
  """An assistant turn: `content` (the text before the first call) and its calls in order."""

  content: str
  calls: tuple[Call, ...]


class Format(NamedTuple):
  """A tool-call format. parse(text) -> Parsed (our call ids count within the turn);
  render(content, calls) -> the text a model writes; stop_strings: end a tool turn; native:
  results go back as `tool` messages through the chat template, else as library text."""

  name: str
  parse: Callable[[str], Parsed]
  render: Callable[[str, Sequence[Call]], str]
  stop_strings: tuple[str, ...]
  native: bool


def call_id(index: int) -> str:
  """Our id of the `index`-th call: "call" + 5 digits (9 alphanumerics). A rollout wanting
  ids unique over an episode renumbers: `call._replace(id=call_id(n))`."""
  return f"call{index % 100000:05d}"


def _id(given: Any, index: int) -> str:
  """A model-given id when it is 9 alphanumerics (what Mistral's templates accept), else ours."""
  ok = isinstance(given, str) and len(given) == 9 and given.isascii() and given.isalnum()
  return given if ok else call_id(index)


def _bad(index: int, reason: str, fix: str) -> Call:
  """A malformed call: its error names the call (1-based within the turn) and the fix."""
  return Call("", {}, call_id(index), f"{ERROR_PREFIX}tool call {index + 1}: {reason}; {fix}")


def _decode(text: str, at: int) -> tuple[Any, int] | str:
  """(JSON value, end index) decoded at `text[at:]` (after whitespace), or why not."""
  while at < len(text) and text[at].isspace():
    at += 1
  if at == len(text):
    return "no JSON (cut off?)"
  try:
    return _DECODER.raw_decode(text, at)
  except json.JSONDecodeError as e:
    if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
      return "the JSON is cut off before its end"
    return f"not valid JSON ({e.msg} at character {e.pos - at})"


def _object_call(value: Any, keys: tuple[str, ...], index: int, fix: str) -> Call:
  """A Call from a decoded {"name", <one of keys>: {...}} object (a valid "id" is kept)."""
  if not isinstance(value, dict):
    return _bad(index, f"expected a JSON object, got {type(value).__name__}", fix)
  name = value.get("name")
  if not isinstance(name, str) or not name.strip():
    return _bad(index, 'no "name" (a non-empty string)', fix)
  key = next((k for k in keys if k in value), None)
  if key is None:
    return _bad(index, f'no "{keys[0]}" object', fix)
  if not isinstance(value[key], dict):
    return _bad(index, f'"{key}" must be a JSON object, got {type(value[key]).__name__}', fix)
  return Call(name.strip(), value[key], _id(value.get("id"), index))


def _json_call(text: str, keys: tuple[str, ...], index: int, fix: str) -> Call:
  """One call from text that must hold exactly one JSON object (surrounding spaces aside)."""
  decoded = _decode(text, 0)
  if isinstance(decoded, str):
    return _bad(index, decoded, fix)
  value, end = decoded
  if text[end:].strip():
    return _bad(index, f"text after the JSON object: {text[end:].strip()[:30]!r}", fix)
  return _object_call(value, keys, index, fix)


# ---------------------------------------------------------------- hermes

_HERMES_FIX = f'write {HERMES_OPEN}{{"name": NAME, "arguments": {{...}}}}{HERMES_CLOSE}'


def parse_hermes(text: str) -> Parsed:
  """Every <tool_call>...</tool_call> after the first </think>; an unclosed one is cut off."""
  think = text.find(THINK_CLOSE)
  at = text.find(HERMES_OPEN, think + len(THINK_CLOSE) if think >= 0 else 0)
  if at < 0:
    return Parsed(text, ())
  content, calls = text[:at], []
  while at >= 0:
    body = at + len(HERMES_OPEN)
    end = text.find(HERMES_CLOSE, body)
    index = len(calls)
    if end < 0:
      calls.append(_bad(index, f"cut off: no {HERMES_CLOSE}", _HERMES_FIX))
      break
    calls.append(_json_call(text[body:end], ("arguments",), index, _HERMES_FIX))
    at = text.find(HERMES_OPEN, end + len(HERMES_CLOSE))
  return Parsed(content, tuple(calls))


def render_hermes(content: str, calls: Sequence[Call]) -> str:
  """As Qwen's templates write an assistant turn's calls (a newline before each call but a
  first one with no content)."""
  parts = [content]
  for i, call in enumerate(calls):
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    parts.append(f"{chr(10) if content or i else ''}{HERMES_OPEN}\n{body}\n{HERMES_CLOSE}")
  return "".join(parts)


# ---------------------------------------------------------------- llama3_json

_LLAMA_FIX = 'write {"name": NAME, "parameters": {...}}, several separated by ";"'


def _json_sequence(body: str) -> list[Call]:
  """Calls from `OBJECT ; OBJECT ; ...` (text after the last object is ignored)."""
  calls, at = [], 0
  while True:
    index = len(calls)
    decoded = _decode(body, at)
    if isinstance(decoded, str):
      return calls + [_bad(index, decoded, _LLAMA_FIX)]
    value, at = decoded
    calls.append(_object_call(value, ("arguments", "parameters"), index, _LLAMA_FIX))
    rest = body[at:].lstrip()
    if not rest.startswith(";"):
      return calls
    at = len(body) - len(rest) + 1


def parse_llama3_json(text: str) -> Parsed:
  """Calls after <|python_tag|> or at a turn starting with "{"; else a whole call object at
  the first "{" (prose around a JSON value that is no call is content)."""
  tag = text.find(PYTHON_TAG)
  if tag >= 0:
    return Parsed(text[:tag], tuple(_json_sequence(text[tag + len(PYTHON_TAG) :])))
  if text.lstrip().startswith("{"):
    return Parsed("", tuple(_json_sequence(text)))
  brace = text.find("{")
  if brace < 0:
    return Parsed(text, ())
  calls = _json_sequence(text[brace:])
  if calls[0].error:
    return Parsed(text, ())
  return Parsed(text[:brace], tuple(calls))


def render_llama3_json(content: str, calls: Sequence[Call]) -> str:
  """As Llama 3.1's template writes calls: {"name": ..., "parameters": ...}, joined by "; "."""
  bodies = (
    json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls
  )
  return content + "; ".join(bodies)


# ---------------------------------------------------------------- mistral

_MISTRAL_FIX = (
  f'write {TOOL_CALLS}[{{"name": NAME, "arguments": {{...}}}}] or {TOOL_CALLS}NAME{ARGS}{{...}}'
)


def _mistral_named(segment: str, index: int) -> Call:
  """NAME[ARGS]{...} or NAME[CALL_ID]ID[ARGS]{...} (or NAME{...}, [ARGS] decoded away)."""
  head, sep, args = segment.partition(ARGS)
  if not sep:
    brace = segment.find("{")
    if brace < 0:
      return _bad(index, f"no {ARGS} and no arguments object", _MISTRAL_FIX)
    head, args = segment[:brace], segment[brace:]
  name, _, given_id = (part.strip() for part in head.partition(CALL_ID))
  if not name or not all(ch.isalnum() or ch in "_-" for ch in name):
    return _bad(
      index, f"tool name must be letters, digits, _ or -, got {name[:40]!r}", _MISTRAL_FIX
    )
  decoded = _decode(args, 0)
  if isinstance(decoded, str):
    return _bad(index, decoded, _MISTRAL_FIX)
  if not isinstance(decoded[0], dict):
    return _bad(
      index, f"arguments must be a JSON object, got {type(decoded[0]).__name__}", _MISTRAL_FIX
    )
  return Call(name, decoded[0], _id(given_id, index))


def _mistral_list(segment: str, first: int) -> list[Call]:
  """[{"name", "arguments"}, ...]: one call per element, numbered from `first`."""
  decoded = _decode(segment, 0)
  if isinstance(decoded, str):
    return [_bad(first, decoded, _MISTRAL_FIX)]
  if not isinstance(decoded[0], list) or not decoded[0]:
    return [_bad(first, "expected a non-empty JSON list of calls", _MISTRAL_FIX)]
  return [
    _object_call(v, ("arguments",), first + i, _MISTRAL_FIX) for i, v in enumerate(decoded[0])
  ]


def parse_mistral(text: str) -> Parsed:
  """Each [TOOL_CALLS] segment: a JSON list of calls, or NAME[ARGS]{...}."""
  first = text.find(TOOL_CALLS)
  if first < 0:
    return Parsed(text, ())
  calls = []
  for segment in text[first + len(TOOL_CALLS) :].split(TOOL_CALLS):
    index = len(calls)
    if segment.lstrip().startswith("["):
      calls += _mistral_list(segment, index)
    else:
      calls.append(_mistral_named(segment, index))
  return Parsed(text[:first], tuple(calls))


def render_mistral(content: str, calls: Sequence[Call]) -> str:
  """The list form, as Mistral's templates write calls (Mistral-Nemo's with each call's id)."""
  body = [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in calls]
  return f"{content}{TOOL_CALLS}{json.dumps(body, ensure_ascii=False)}"


# ---------------------------------------------------------------- library


def parse_library(text: str) -> Parsed:
  """The last <tool>NAME: ARGUMENT</tool> (tool_syntax.parse_tool_call); arguments = the text."""
  call = tool_syntax.parse_tool_call(text)
  if call is None:
    return Parsed(text, ())
  content = text[: text.rfind(tool_syntax.CALL_OPEN)]
  if isinstance(call, str):
    return Parsed(content, (Call("", "", call_id(0), call),))
  return Parsed(content, (Call(call.name, call.argument, call_id(0)),))


def render_library(content: str, calls: Sequence[Call]) -> str:
  """content + <tool>NAME: ARGUMENT</tool>; the syntax holds one call with text arguments."""
  if len(calls) != 1 or not isinstance(calls[0].arguments, str):
    raise ValueError(f"the library syntax writes one call with text arguments, got {list(calls)!r}")
  return (
    f"{content}{tool_syntax.CALL_OPEN}{calls[0].name}: {calls[0].arguments}{tool_syntax.CALL_CLOSE}"
  )


# ---------------------------------------------------------------- the table

FORMATS = {
  "hermes": Format("hermes", parse_hermes, render_hermes, (), True),
  "llama3_json": Format("llama3_json", parse_llama3_json, render_llama3_json, (), True),
  "mistral": Format("mistral", parse_mistral, render_mistral, (), True),
  "library": Format("library", parse_library, render_library, (tool_syntax.CALL_CLOSE,), False),
}


# Control-token texts a format's parser reads: the text a rollout decodes for the
# environment keeps them (`multiturn.TurnConfig.keep_special`) where the vocabulary has them.
MARKERS = {
  "hermes": (HERMES_OPEN, HERMES_CLOSE, "<think>", THINK_CLOSE),
  "llama3_json": (PYTHON_TAG,),
  "mistral": (TOOL_CALLS, ARGS, CALL_ID),
  "library": (),
}


def get(name: str) -> Format:
  """The format `name`; ValueError naming the known ones otherwise."""
  if name not in FORMATS:
    raise ValueError(f"tool format {name!r} is unknown; use one of {', '.join(FORMATS)}")
  return FORMATS[name]


def detect(template_text: str | None) -> str:
  """The format a chat template's text uses: <tool_call> with a JSON "arguments" ->
  hermes; [TOOL_CALLS] -> mistral; Llama 3 headers with <|python_tag|> or "parameters" ->
  llama3_json; no tool section (or no template) -> library. A tool section we cannot read
  (XML <function=NAME> calls as in Qwen3-Coder and Qwen3.5, <tool_call> without JSON as
  in GLM 4.6) is a ValueError, rather than answering every call as broken JSON."""
  text = (template_text or "").replace('\\"', '"')  # quotes escaped inside Jinja strings
  if XML_FUNCTION in text or (HERMES_OPEN in text and '"arguments"' not in text):
    raise ValueError(
      f"this chat template writes tool calls in a format no parser reads (not JSON inside "
      f"{HERMES_OPEN}); known formats: {', '.join(FORMATS)}; name one, or use the library "
      "syntax (config.tools.format=library)"
    )
  if HERMES_OPEN in text:
    return "hermes"
  if TOOL_CALLS in text:
    return "mistral"
  if LLAMA3_HEADER in text and (PYTHON_TAG in text or '"parameters"' in text):
    return "llama3_json"
  return "library"


def result_message(fmt: Format, call: Call, text: str) -> dict | str:
  """A tool's result as the model is shown it: for a native format the OpenAI-shape `tool`
  message the chat template renders; for the library syntax <result>text</result>."""
  if fmt.native:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text}
  return tool_syntax.result_observation(text)
