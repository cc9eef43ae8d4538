"""Chat templates: the Jinja template a model file carries, rendered exactly as
transformers' `apply_chat_template(..., tokenize=False)` renders it.

Where a template comes from: a GGUF's `tokenizer.chat_template` metadata
(`Tokenizer.chat_template`), a Hugging Face directory (`chat_template.jinja`, else
tokenizer_config.json's `chat_template`: a string, or a list of named templates of which
"default" is taken unless another is named), or a file (`--config.model.chat_template`).
A model file without one (the Gemma 3 270M base GGUF) keeps its family's hand-written
layout (`chat_formats`), which equals the instruction-tuned template on the conversations
it supports (tests/test_chat_template.py).

Rendering as transformers does: an `ImmutableSandboxedEnvironment` (templates are
untrusted code; `namespace()` refuses "_" names) with `trim_blocks` and `lstrip_blocks`,
the `loopcontrols` extension and the `{% generation %}` block tag (a pass-through here); `tojson` is `json.dumps` with
`ensure_ascii=False`, no key sorting and no HTML escaping (Jinja's own sorts keys and
escapes `<>&'`); `raise_exception(message)`; `strftime_now(format)` formats the run's fixed
`date_string` ("26 Jul 2024" by default), not today, so prompts do not change daily. The
template sees `messages` (None-valued keys dropped; `reasoning_content` filled from
`thinking` / `reasoning` as transformers does), `tools`, `documents`,
`add_generation_prompt`, `bos_token`, `eos_token` and any extra keyword (`date_string`,
`enable_thinking`, ...).

Checked before rendering, each with one named error (`ChatTemplateError`): roles (ROLES),
contents (a string, or a list of parts: dicts with a string "type", text parts with a
string "text", the shape multimodal templates read; None only beside `tool_calls`), tool
calls (each a dict whose `function` has a non-empty string `name`), tools (dicts naming a
function), and `tools` given to a template that never reads them (the fallback: the
library's own tool syntax, `tool_syntax`, described in the system text). A template that
fails while rendering is named with the message index where it first fails.
"""

import dataclasses
import datetime
import functools
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox
import jinja2.utils

from rlpost import errors

DEFAULT_DATE = "26 Jul 2024"  # strftime_now's and date_string's day: fixed, not today
DATE_FORMAT = "%d %b %Y"
ROLES = ("system", "developer", "user", "assistant", "tool", "ipython")
GGUF_KEY = "tokenizer.chat_template"


class ChatTemplateError(errors.DataError):
  """A conversation the template cannot render, or a template that cannot be used."""


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A Jinja chat template. source: where its text came from (named in every error);
  bos_token / eos_token: the tokenizer's texts the template may write (None: undefined)."""

  text: str
  source: str
  bos_token: str | None = None
  eos_token: str | None = None

  @functools.cached_property
  def compiled(self) -> jinja2.Template:
    try:
      return _ENV.from_string(self.text)
    except jinja2.TemplateSyntaxError as e:
      raise ChatTemplateError(f"chat template {self.source}: line {e.lineno}: {e}") from None

  @functools.cached_property
  def reads_tools(self) -> bool:
    """Whether the template reads the `tools` variable at all."""
    self.compiled  # a syntax error is named here too
    return "tools" in jinja2.meta.find_undeclared_variables(_ENV.parse(self.text))


class _GenerationBlock(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with it
  for its assistant-token mask): renders its body unchanged."""

  tags = frozenset({"generation"})

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(
    value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
  )


def _raise_exception(message):
  raise jinja2.TemplateError(message)


class _Namespace(jinja2.utils.Namespace):
  """Jinja's `namespace()`, refusing attribute names that start with "_" (a template must
  not reach Python internals through it; transformers refuses them too)."""

  def __init__(*args, **kwargs):  # Jinja's own signature: `self` may be a keyword name
    self, rest = args[0], args[1:]
    attrs = dict(*rest, **kwargs)
    for name in attrs:
      _Namespace._check(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name, value):
    _Namespace._check(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check(name):
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(
        f"namespace attribute {name!r}: names may not start with '_'"
      )


def _make_env() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
  )
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["namespace"] = _Namespace
  return env


_ENV = _make_env()


def parse_date(date_string: str, field: str = "date_string") -> datetime.datetime:
  """The day of `date_string` ("26 Jul 2024"); ValueError naming `field` otherwise."""
  try:
    return datetime.datetime.strptime(date_string, DATE_FORMAT)
  except (TypeError, ValueError):
    raise ValueError(
      f"{field}={date_string!r}: write a day as {DEFAULT_DATE!r} (day, month abbreviation, year)"
    ) from None


# ------------------------------------------------------------------ where templates come from


def from_file(path: str | os.PathLike, **special) -> ChatTemplate:
  """The template in a .jinja file (or a tokenizer_config.json / HF directory)."""
  path = pathlib.Path(path)
  if path.is_dir() or path.name == "tokenizer_config.json":
    text = hf_directory_text(path if path.is_dir() else path.parent)
    if not text:
      raise ChatTemplateError(f"{path}: holds no chat template")
    return ChatTemplate(text, str(path), **special)
  if not path.is_file():
    raise ChatTemplateError(f"{path}: no such file; give a .jinja chat template file")
  return ChatTemplate(path.read_text(encoding="utf-8"), str(path), **special)


def hf_directory_text(directory: str | os.PathLike, name: str = "default") -> str:
  """A Hugging Face directory's template text: chat_template.jinja, else
  tokenizer_config.json's `chat_template` (a string, or a list of {"name", "template"} from
  which `name` is taken); "" when it has none."""
  directory = pathlib.Path(directory)
  if (directory / "chat_template.jinja").is_file():
    return (directory / "chat_template.jinja").read_text(encoding="utf-8")
  path = directory / "tokenizer_config.json"
  if not path.is_file():
    return ""
  try:
    value = json.loads(path.read_text(encoding="utf-8")).get("chat_template") or ""
  except (json.JSONDecodeError, AttributeError) as e:
    raise ChatTemplateError(f"{path}: not a JSON object ({e}); copy the file again") from None
  if isinstance(value, str):
    return value
  named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
  if not isinstance(named.get(name), str):
    raise ChatTemplateError(
      f"{path}: chat_template has no template named {name!r}; it has {sorted(map(str, named))}"
    )
  return named[name]


def for_tokenizer(tokenizer, path: str = "") -> ChatTemplate | None:
  """The template to render a tokenizer's conversations with: the file `path` names (the
  config's `model.chat_template`), else the tokenizer's own (`Tokenizer.chat_template`,
  from its model file), else None (the family's hand-written layout, `chat_formats`)."""
  texts = {i: s for s, i in tokenizer.special_tokens.items()}
  special = {"bos_token": texts.get(tokenizer.bos_id), "eos_token": texts.get(tokenizer.eos_id)}
  if path:
    return from_file(path, **special)
  if tokenizer.chat_template:
    return ChatTemplate(tokenizer.chat_template, "the model file's chat template", **special)
  return None


# ------------------------------------------------------------------ checks before rendering


def _fail(where: str, value, fix: str):
  raise ChatTemplateError(f"{where}={value!r}: {fix}")


def _check_content(k: int, message: Mapping[str, Any]):
  content = message.get("content")
  if isinstance(content, str) or (content is None and message.get("tool_calls")):
    return
  if not isinstance(content, list):
    _fail(f"messages[{k}].content", content, "give a string or a list of content parts")
  for j, part in enumerate(content):
    if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
      _fail(f"messages[{k}].content[{j}]", part, 'give a dict with a string "type"')
    if part["type"] == "text" and not isinstance(part.get("text"), str):
      _fail(f"messages[{k}].content[{j}].text", part.get("text"), "a text part needs a string")


def _check_tool_calls(k: int, calls):
  if not isinstance(calls, list):
    _fail(f"messages[{k}].tool_calls", calls, "give a list of tool calls")
  for j, call in enumerate(calls):
    function = call.get("function") if isinstance(call, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
      _fail(
        f"messages[{k}].tool_calls[{j}].function.name",
        name,
        'each call needs {"function": {"name": ..., "arguments": ...}} (the OpenAI shape)',
      )


def check_conversation(messages: Sequence[Mapping[str, Any]], tools=None):
  """Raises ChatTemplateError naming the first bad message, tool call or tool."""
  if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
    _fail("messages", messages, "give a non-empty list of {'role', 'content'} dicts")
  for k, message in enumerate(messages):
    if not isinstance(message, Mapping):
      _fail(f"messages[{k}]", message, "give a dict with 'role' and 'content'")
    if message.get("role") not in ROLES:
      _fail(f"messages[{k}].role", message.get("role"), f"use one of {ROLES}")
    _check_content(k, message)
    if message.get("tool_calls") is not None:
      _check_tool_calls(k, message["tool_calls"])
  for j, tool in enumerate(tools or ()):
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
      _fail(f"tools[{j}]", tool, 'give {"type": "function", "function": {"name": ...}}')


# ------------------------------------------------------------------ rendering


def _template_messages(messages) -> list[dict]:
  """Messages as the template sees them (transformers' normalization)."""
  out = []
  for message in messages:
    message = {k: v for k, v in message.items() if v is not None}
    reasoning = next(
      (message[k] for k in ("reasoning_content", "thinking", "reasoning") if k in message), None
    )
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    out.append(message)
  return out


def _render(template: ChatTemplate, messages, tools, documents, add_generation_prompt, kwargs):
  day = parse_date(kwargs.get("date_string", DEFAULT_DATE))
  special = {"bos_token": template.bos_token, "eos_token": template.eos_token}
  variables = {k: v for k, v in special.items() if v is not None}
  variables |= {"strftime_now": day.strftime} | kwargs
  return template.compiled.render(
    messages=_template_messages(messages),
    tools=tools,
    documents=documents,
    add_generation_prompt=add_generation_prompt,
    **variables,
  )


def _failing_message(template, messages, tools, documents, kwargs) -> int | None:
  """The index of the first message whose prefix of the conversation fails to render."""
  for k in range(1, len(messages) + 1):
    try:
      _render(template, messages[:k], tools, documents, False, kwargs)
    except Exception:  # pylint: disable=broad-except
      return k - 1
  return None


def render(
  template: ChatTemplate,
  messages: Sequence[Mapping[str, Any]],
  *,
  tools: Sequence[Mapping[str, Any]] | None = None,
  documents: Sequence[Mapping[str, Any]] | None = None,
  add_generation_prompt: bool = False,
  **kwargs,
) -> str:
  """The conversation as the template writes it: transformers'
  `apply_chat_template(messages, tools=tools, add_generation_prompt=..., tokenize=False,
  **kwargs)` byte for byte. kwargs: `date_string` (passed on when given; its day, else
  DEFAULT_DATE's, is what `strftime_now` formats), `enable_thinking`, ...
  ChatTemplateError (module doc) on bad input and on any failure inside the template."""
  check_conversation(messages, tools)
  if tools and not template.reads_tools:
    raise ChatTemplateError(
      f"chat template {template.source} has no tool support (it never reads `tools`): "
      "render with tools=None and describe the tools in the system text in the library's "
      "own syntax (rlpost.text.tool_syntax, --config.tools.format=library)"
    )
  if "date_string" in kwargs:
    parse_date(kwargs["date_string"])
  try:
    return _render(template, messages, tools, documents, add_generation_prompt, kwargs)
  except ChatTemplateError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    k = _failing_message(template, messages, tools, documents, kwargs)
    where = f" at messages[{k}] (role {messages[k]['role']!r})" if k is not None else ""
    raise ChatTemplateError(
      f"chat template {template.source} failed{where}: {type(e).__name__}: {e}"
    ) from e
