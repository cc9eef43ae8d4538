"""Tools as Python functions: a JSON schema from type hints and a Google-style docstring,
and native tool calls (JSON arguments) checked against it and run.

A tool is a plain function returning str, e.g.

  def calculator(expression: str) -> str:
    '''Evaluates an arithmetic expression.

    Args:
      expression: The expression, e.g. "48/2".
    '''

`json_schema(fn)` gives what transformers' `get_json_schema` gives (checked exactly, key
order included, against transformers in tests/fixtures/tool_schemas.json, made by
experiments/oracles/tool_schemas.py): `{"type": "function", "function": {"name",
"description", "parameters": {"type": "object", "properties", "required"}, "return"?}}`;
str/int/float/bool/None/Any, list[...], tuple[...], dict[..., ...], Literal, Union and
Optional map as there, and `(choices: [...])` ending an argument's text becomes `enum`.
It raises `ToolSchemaError` (naming the function, the argument and the fix) where
transformers raises: no docstring, an argument without a type hint or without an `Args:`
line, a hint JSON cannot express. Where we differ: *args/**kwargs and Enum-class hints
are refused (a call passes JSON keywords and raw JSON values), `self`/`cls` is not skipped
(tools are functions, not methods).

One registry (`tools.REGISTRY`, name -> function) serves both call syntaxes: a native
call's arguments dict is checked against the schema and passed as keywords; the
library syntax's argument text (`<tool>NAME: TEXT</tool>`) is passed positionally, i.e. to
the function's one string parameter.
"""

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from rlpost.envs import tools
from rlpost.text.tool_formats import Call
from rlpost.text.tool_syntax import ERROR_PREFIX, clip


class ToolSchemaError(ValueError):
  """A function that cannot be offered as a tool (the message names it and the fix)."""


class FunctionTool(NamedTuple):
  """A registry entry with its schema: `function(**arguments) -> str`."""

  function: Callable[..., str]
  schema: dict


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_BARE = {**{t: {"type": n} for t, n in _SCALARS.items()}, list: {"type": "array"}}
_BARE.update({tuple: {"type": "array"}, dict: {"type": "object"}})
_ENTRY = re.compile(r"(?P<indent>[ \t]*)(?P<name>\w+)(?:[ \t]*\([^()\n]*\))?:(?P<text>.*)")
_CHOICES = "(choices:"


# ---------------------------------------------------------------- the docstring


def _section(doc: str, title: str, ends: tuple[str, ...]) -> str | None:
  """The text after a line holding only `title` (not the first line), up to the first of
  `ends` anywhere after it; None when no such line."""
  lines = doc.split("\n")
  for i in range(1, len(lines) - 1):
    if lines[i].lstrip() == title:
      rest = "\n".join(lines[i + 1 :])
      cuts = [j for j in (rest.find(end) for end in ends) if j >= 0]
      return rest[: min(cuts, default=len(rest))].rstrip()
  return None


def _arg_texts(block: str) -> dict[str, str]:
  """`Args:` entries -> their text on one line. An entry is `name:` or `name (type):`; a
  line indented deeper than its entry continues it."""
  texts, name, indent = {}, None, ""
  for line in (line for line in block.split("\n") if line.strip()):
    entry = _ENTRY.fullmatch(line)
    deeper = line.startswith(indent) and line[len(indent) : len(indent) + 1] in (" ", "\t")
    if entry and (name is None or not deeper):
      name, indent = entry["name"], entry["indent"]
      texts[name] = [entry["text"].strip()]
    elif name is not None:
      texts[name].append(line.strip())
  return {k: " ".join(p for p in parts if p) for k, parts in texts.items()}


def _docstring(fn: Callable, name: str) -> tuple[str, dict[str, str], str | None]:
  """(description, argument texts, returns text) of `fn`'s Google-style docstring."""
  doc = (inspect.getdoc(fn) or "").strip()
  if not doc:
    raise ToolSchemaError(
      f"tool {name}: the function has no docstring; write one (a description, then an "
      "'Args:' line per argument) so the model is told what it does"
    )
  cuts = [i for i in (doc.find(m) for m in ("Args:", "Returns:", "Raises:")) if i >= 0]
  description = doc[: min(cuts, default=len(doc))].strip()
  block = _section(doc, "Args:", ("Returns:", "Raises:"))
  returns = _section(doc, "Returns:", ("Raises:",))
  returns = returns.strip() if returns is not None else None
  return description, _arg_texts(block) if block is not None else {}, returns


# ---------------------------------------------------------------- type hints


def _enum_schema(values: list) -> dict:
  """{"type", "enum"} of JSON scalars; "type" lists each value's type once, first seen first."""
  kinds = list(dict.fromkeys(_SCALARS[type(v)] for v in values))
  return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def _union_schema(args: tuple, where: str) -> dict:
  """Union/Optional: one member as itself, plain types as a sorted "type" list, otherwise
  "anyOf"; None among the members adds "nullable"."""
  members = [_hint_schema(a, where) for a in args if a is not type(None)]
  if len(members) == 1:
    out = members[0]
  elif all(list(m) == ["type"] and isinstance(m["type"], str) for m in members):
    kinds = sorted({m["type"] for m in members})
    out = {"type": kinds[0] if len(kinds) == 1 else kinds}
  else:
    out = {"anyOf": members}
  if type(None) in args:
    out["nullable"] = True
  return out


def _hint_schema(hint: Any, where: str) -> dict:
  """The JSON schema of one type hint; `where` ("tool f, argument x") names it in errors."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is None:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
      raise ToolSchemaError(
        f"{where}: Enum hints are not supported; use Literal[...] of its values"
      )
    if hint is Any:
      return {}
    if hint in _BARE:
      return dict(_BARE[hint])
    raise ToolSchemaError(
      f"{where}: JSON has no type for {hint!r}; use str, int, float, bool, list, tuple, dict, "
      "Literal or a Union of these"
    )
  if origin is typing.Union or origin is types.UnionType:
    return _union_schema(args, where)
  if origin is typing.Literal and args:
    if any(type(a) not in _SCALARS for a in args):
      raise ToolSchemaError(f"{where}: Literal values must be str, int, float, bool or None")
    return _enum_schema(list(args))
  if origin is list:
    return {"type": "array", "items": _hint_schema(args[0], where)} if args else {"type": "array"}
  if origin is tuple:
    if len(args) == 1 or Ellipsis in args:
      raise ToolSchemaError(f"{where}: {hint} has no fixed length of two or more; use list[...]")
    return {"type": "array", "prefixItems": [_hint_schema(a, where) for a in args]}
  if origin is dict:
    out = {"type": "object"}
    if len(args) == 2:
      out["additionalProperties"] = _hint_schema(args[1], where)
    return out
  raise ToolSchemaError(f"{where}: JSON has no type for {hint!r}")


# ---------------------------------------------------------------- the schema


def _parameters(fn: Callable, name: str) -> tuple[dict, dict | None]:
  """({"type": "object", "properties", "required"?}, the return's schema or None)."""
  signature = inspect.signature(fn)
  required = []
  for param in signature.parameters.values():
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
      raise ToolSchemaError(
        f"tool {name}, argument {param.name}: *args/**kwargs cannot be given as JSON "
        "arguments; name each argument"
      )
    if param.annotation is inspect.Parameter.empty:
      raise ToolSchemaError(f"tool {name}, argument {param.name}: no type hint; add one (e.g. str)")
    if param.default is inspect.Parameter.empty:
      required.append(param.name)
  hints = typing.get_type_hints(fn)
  properties = {
    p: _hint_schema(hints[p], f"tool {name}, argument {p}") for p in signature.parameters
  }
  try:
    returns = _hint_schema(hints["return"], "") if "return" in hints else None
  except ToolSchemaError:
    returns = None  # the model never writes the return value: left out, as transformers does
  parameters = {"type": "object", "properties": properties}
  if required:
    parameters["required"] = required
  return parameters, returns


def _described(schema: dict, text: str, where: str) -> dict:
  """`schema` with the argument's text as "description" and a trailing `(choices: [...])`
  as "enum"."""
  start = text.lower().find(_CHOICES)
  if start >= 0 and text.rstrip().endswith(")"):
    try:
      values = json.loads(text.rstrip()[start + len(_CHOICES) : -1])
    except ValueError as e:
      raise ToolSchemaError(f"{where}: (choices: ...) must hold a JSON list ({e})") from None
    schema["enum"] = [v.strip() if isinstance(v, str) else v for v in values]
    text = text[:start].strip()
  schema["description"] = text
  return schema


def json_schema(fn: Callable, name: str | None = None) -> dict:
  """The tool schema of `fn`, named `name` (default `fn.__name__`), as transformers'
  `get_json_schema` writes it; ToolSchemaError naming the function and argument else."""
  name = name or getattr(fn, "__name__", "operation")
  description, texts, returns_text = _docstring(fn, name)
  parameters, returns = _parameters(fn, name)
  for arg, schema in parameters["properties"].items():
    if arg not in texts:
      raise ToolSchemaError(
        f"tool {name}, argument {arg}: the docstring has no line for it; add "
        f"'{arg}: <what it is>' under 'Args:'"
      )
    _described(schema, texts[arg], f"tool {name}, argument {arg}")
  out = {"name": name, "description": description, "parameters": parameters}
  if returns is not None:
    if returns_text is not None:
      returns["description"] = returns_text
    out["return"] = returns
  return {"type": "function", "function": out}


def function_tools(registry: tools.Registry) -> dict[str, FunctionTool]:
  """Each registry entry with its schema (named by its registry key); ToolSchemaError for
  a function that cannot be a tool. Build once, before any rollout."""
  return {
    name: FunctionTool(fn, json_schema(fn, name))
    for name, fn in tools.check_registry(registry).items()
  }


def schemas(toolset: Mapping[str, FunctionTool]) -> list[dict]:
  """The `tools=[...]` list a chat template takes."""
  return [t.schema for t in toolset.values()]


# ---------------------------------------------------------------- checking and running calls

_JSON_TYPES = {
  "string": lambda v: isinstance(v, str),
  "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
  "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
  "boolean": lambda v: isinstance(v, bool),
  "null": lambda v: v is None,
  "array": lambda v: isinstance(v, list),
  "object": lambda v: isinstance(v, dict),
}


def _json_type(value: Any) -> str:
  """The JSON type name of a decoded JSON value."""
  kinds = ("boolean", "integer", "number", "string", "null", "array", "object")
  return next((k for k in kinds if _JSON_TYPES[k](value)), type(value).__name__)


def _same_json(a: Any, b: Any) -> bool:
  """JSON equality: 2 == 2.0, but true is not 1."""
  return a == b and isinstance(a, bool) == isinstance(b, bool)


def _mismatch(schema: dict, value: Any, path: str) -> str | None:
  """Why `value` does not fit `schema` (the subset `json_schema` writes), or None."""
  if value is None and schema.get("nullable"):
    return None
  if "anyOf" in schema:
    if all(_mismatch(s, value, path) for s in schema["anyOf"]):
      return f"{path} must be one of {json.dumps(schema['anyOf'])}, got {_json_type(value)}"
    return None
  kinds = schema.get("type")
  kinds = [kinds] if isinstance(kinds, str) else kinds
  if kinds is not None and not any(_JSON_TYPES[k](value) for k in kinds):
    return f"{path} must be {' or '.join(kinds)}, got {_json_type(value)} {json.dumps(value)[:40]}"
  if "enum" in schema and not any(_same_json(v, value) for v in schema["enum"]):
    return f"{path} must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)[:40]}"
  if isinstance(value, list) and "prefixItems" in schema:
    if len(value) != len(schema["prefixItems"]):
      return f"{path} must have {len(schema['prefixItems'])} items, got {len(value)}"
    pairs = zip(schema["prefixItems"], value)
    return next(
      filter(None, (_mismatch(s, v, f"{path}[{i}]") for i, (s, v) in enumerate(pairs))), None
    )
  if isinstance(value, list) and "items" in schema:
    return next(
      filter(None, (_mismatch(schema["items"], v, f"{path}[{i}]") for i, v in enumerate(value))),
      None,
    )
  if isinstance(value, dict) and "additionalProperties" in schema:
    items = value.items()
    return next(
      filter(
        None, (_mismatch(schema["additionalProperties"], v, f"{path}[{k!r}]") for k, v in items)
      ),
      None,
    )
  return None


def check_arguments(schema: dict, arguments: Mapping[str, Any]) -> str | None:
  """Why a call's JSON `arguments` do not fit the tool `schema` (unknown or missing
  arguments, a wrong JSON type), naming the tool and argument; None when they fit."""
  function = schema["function"]
  name, parameters = function["name"], function["parameters"]
  properties = parameters["properties"]
  unknown = [a for a in arguments if a not in properties]
  if unknown:
    return f"tool {name} has no argument {unknown[0]!r}; its arguments: {', '.join(properties) or 'none'}"
  missing = [a for a in parameters.get("required", ()) if a not in arguments]
  if missing:
    return f"tool {name} needs argument {missing[0]!r}"
  problems = (_mismatch(properties[a], v, f"argument {a!r}") for a, v in arguments.items())
  problem = next(filter(None, problems), None)
  return f"tool {name}: {problem}" if problem else None


def _library_call(tool: FunctionTool, text: str) -> Callable[[], str] | str:
  """The library syntax's text as the function's one string parameter, or why not."""
  parameters = tool.schema["function"]["parameters"]
  required = parameters.get("required", [])
  if len(required) != 1 or parameters["properties"][required[0]].get("type") != "string":
    name = tool.schema["function"]["name"]
    return f"tool {name} takes JSON arguments {list(parameters['properties'])}, not one text"
  return lambda: tool.function(text)


def _invocation(tool: FunctionTool, call: Call) -> Callable[[], str] | str:
  """A thunk calling the tool with the call's arguments, or why the arguments do not fit."""
  if isinstance(call.arguments, str):
    return _library_call(tool, call.arguments)
  arguments = call.arguments
  if isinstance(arguments, dict):
    problem = check_arguments(tool.schema, call.arguments)
    return problem or (lambda: tool.function(**arguments))
  return f"tool {call.name}: arguments must be a JSON object, got {type(arguments).__name__}"


def run_call(toolset: Mapping[str, FunctionTool], call: Call, max_chars: int) -> tuple[str, bool]:
  """(result text clipped to `max_chars`, is_error) for one parsed call: a malformed call's
  error, an unknown tool, arguments not fitting the schema, or what the tool returned
  (its failures contained as in `tools.run_tool`). Never raises for the call's content."""
  tool = toolset.get(call.name)
  if call.error:
    result = call.error if call.error.startswith(ERROR_PREFIX) else ERROR_PREFIX + call.error
  elif tool is None:
    result = tools.unknown_tool(toolset, call.name)
  else:
    invocation = _invocation(tool, call)
    if isinstance(invocation, str):
      result = f"{ERROR_PREFIX}{invocation}"
    else:
      result = tools.contained(call.name, invocation)
  return clip(result, max_chars), result.startswith(ERROR_PREFIX)
