"""Tools as Python functions (rlpost/envs/tool_functions.py): schemas equal transformers'
`get_json_schema` (tests/fixtures/tool_schemas.json, made by
experiments/oracles/tool_schemas.py), calls are checked against them and never raise."""

import enum
import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpost.envs import calculator, tool_functions, tools
from rlpost.envs.tool_functions import ToolSchemaError, check_arguments, json_schema, run_call
from rlpost.text import tool_formats
from rlpost.text.tool_formats import Call
from tests.fixtures import tool_functions_examples as examples

ORACLE = json.loads((pathlib.Path(__file__).parent / "fixtures/tool_schemas.json").read_text())
TOOLS = {fn.__name__: fn for fn in [*examples.TOOLS, calculator.calculator]}
FUNCTION_TOOLS = tool_functions.function_tools(TOOLS)


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_schema_equals_transformers_key_order_included(name):
  """Key order too: a template's tojson writes the keys in order.

  Mutations caught: `_arg_texts` joining a multi-line argument text with "\\n" (search);
  `_union_schema` without `out["nullable"] = True` (search, mixed, annotated_args) or
  without sorting the type names (unsorted_unions)."""
  assert json.dumps(json_schema(TOOLS[name])) == json.dumps(ORACLE["schemas"][name])


def test_every_example_is_in_the_oracle():
  assert set(ORACLE["schemas"]) == set(TOOLS)
  assert set(ORACLE["refused"]) == {fn.__name__ for fn in examples.REFUSED}


@pytest.mark.parametrize(
  "fn, match",
  [
    (examples.no_docstring, r"tool no_docstring: the function has no docstring"),
    (examples.missing_hint, r"tool missing_hint, argument x: no type hint"),
    (examples.undocumented_arg, r"tool undocumented_arg, argument y: the docstring has no line"),
    (examples.custom_class, r"tool custom_class, argument p: JSON has no type for .*Point"),
    (examples.one_tuple, r"tool one_tuple, argument t: tuple\[int\] has no fixed length"),
  ],
)
def test_refuses_what_transformers_refuses_naming_function_and_argument(fn, match):
  """transformers raised for each of these (ORACLE["refused"]); we raise ToolSchemaError."""
  assert fn.__name__ in ORACLE["refused"]
  with pytest.raises(ToolSchemaError, match=match):
    json_schema(fn)


class Colour(enum.Enum):
  RED = "red"


def _star(*values: int) -> str:
  """Sums.

  Args:
    values: Numbers.
  """
  return str(sum(values))


def _colour(c: Colour) -> str:
  """Names a colour.

  Args:
    c: The colour.
  """
  return c.value


@pytest.mark.parametrize(
  "fn, match",
  [
    (_star, r"tool _star, argument values: \*args/\*\*kwargs"),
    (_colour, r"argument c: Enum hints"),
  ],
)
def test_refuses_what_json_keyword_calls_cannot_reach(fn, match):
  """Where we differ from transformers (module docstring): it writes schemas for these."""
  with pytest.raises(ToolSchemaError, match=match):
    json_schema(fn)


def test_function_tools_name_schemas_by_registry_key_and_refuse_undocumented_entries():
  renamed = tool_functions.function_tools({"calc": calculator.calculator})
  assert renamed["calc"].schema["function"]["name"] == "calc"
  assert tool_functions.schemas(renamed) == [renamed["calc"].schema]
  with pytest.raises(ToolSchemaError, match="tool echo: the function has no docstring"):
    tool_functions.function_tools({"echo": lambda a: a})


# ---------------------------------------------------------------- arguments against the schema


def _fitting(schema: dict) -> st.SearchStrategy:
  """JSON values that fit `schema` (the subset json_schema writes)."""
  if "enum" in schema:
    base = st.sampled_from(schema["enum"])
  elif "anyOf" in schema:
    base = st.one_of([_fitting(s) for s in schema["anyOf"]])
  elif "prefixItems" in schema:
    base = st.tuples(*[_fitting(s) for s in schema["prefixItems"]]).map(list)
  else:
    kinds = schema.get("type", ["string", "integer", "boolean", "null"])
    base = st.one_of(
      [_fitting_type(k, schema) for k in ([kinds] if isinstance(kinds, str) else kinds)]
    )
  return base | st.none() if schema.get("nullable") else base


def _fitting_type(kind: str, schema: dict) -> st.SearchStrategy:
  if kind == "array":
    return st.lists(_fitting(schema["items"]) if "items" in schema else st.integers(), max_size=3)
  if kind == "object":
    values = (
      _fitting(schema["additionalProperties"])
      if "additionalProperties" in schema
      else st.text(max_size=3)
    )
    return st.dictionaries(st.text(max_size=4), values, max_size=3)
  simple = {
    "string": st.text(max_size=8),
    "integer": st.integers(),
    "number": st.integers() | st.floats(allow_nan=False, allow_infinity=False),
    "boolean": st.booleans(),
    "null": st.none(),
  }
  return simple[kind]


@st.composite
def fitting_calls(draw):
  """(tool name, arguments) with every required and some optional arguments, all fitting."""
  name = draw(st.sampled_from(sorted(FUNCTION_TOOLS)))
  parameters = FUNCTION_TOOLS[name].schema["function"]["parameters"]
  required = parameters.get("required", [])
  chosen = [p for p in parameters["properties"] if p in required or draw(st.booleans())]
  return name, {p: draw(_fitting(parameters["properties"][p])) for p in chosen}


@settings(max_examples=150, deadline=None)
@given(call=fitting_calls())
def test_arguments_that_fit_the_schema_pass_and_the_function_takes_them(call):
  name, arguments = call
  assert check_arguments(FUNCTION_TOOLS[name].schema, arguments) is None
  FUNCTION_TOOLS[name].function(**arguments)  # the schema describes the signature


WRONG = {  # a JSON value of another type than the schema's, per JSON type
  "string": 3,
  "integer": True,
  "number": "3",
  "boolean": 1,
  "array": {"a": 1},
  "object": [1],
}


@settings(max_examples=150, deadline=None)
@given(call=fitting_calls(), data=st.data())
def test_an_argument_of_the_wrong_json_type_is_named(call, data):
  """bool is no integer (JSON's true is not 1), an int is a number.

  Mutation caught: the "integer" check without `not isinstance(v, bool)`."""
  name, arguments = call
  properties = FUNCTION_TOOLS[name].schema["function"]["parameters"]["properties"]
  typed = [
    p
    for p in arguments
    if isinstance(properties[p].get("type"), str) and properties[p]["type"] in WRONG
  ]
  if not typed:
    return
  arg = data.draw(st.sampled_from(typed))
  problem = check_arguments(
    FUNCTION_TOOLS[name].schema, {**arguments, arg: WRONG[properties[arg]["type"]]}
  )
  assert problem is not None and problem.startswith(f"tool {name}: argument {arg!r} must be ")


def test_nested_values_enums_and_tuples_are_checked():
  schema = FUNCTION_TOOLS["mixed"].schema
  base = {"value": 1, "payload": {"a": 1.5}, "pairs": [[1, 2]], "point": [1, "x"], "anything": None}
  assert check_arguments(schema, base) is None
  for change, where in [
    ({"payload": {"a": "heavy"}}, "argument 'payload'['a'] must be number"),
    ({"pairs": [[1, 2.5]]}, "argument 'pairs'[0][1] must be integer"),
    ({"point": [1]}, "argument 'point' must have 2 items"),
    ({"point": ["x", 1]}, "argument 'point'[0] must be integer"),
    ({"maybe": {"no": 1}}, "argument 'maybe' must be one of"),
  ]:
    assert where in check_arguments(schema, {**base, **change}), change
  assert check_arguments(schema, {**base, "maybe": None}) is None
  pick = FUNCTION_TOOLS["pick"].schema
  assert "must be one of [1, 2, 3], got 4" in check_arguments(
    pick, {"flavour": "vanilla", "size": 4}
  )
  assert "must be one of" in check_arguments(pick, {"flavour": "mint"})


def test_unknown_and_missing_arguments_are_named():
  schema = FUNCTION_TOOLS["get_weather"].schema
  assert check_arguments(schema, {"city": "Paris", "units": "celsius"}) == (
    "tool get_weather has no argument 'units'; its arguments: city, unit"
  )
  assert check_arguments(schema, {"unit": "celsius"}) == "tool get_weather needs argument 'city'"


# ---------------------------------------------------------------- running calls

REGISTRY_TOOLS = tool_functions.function_tools(tools.REGISTRY)


def test_the_calculator_runs_as_a_function_tool_and_as_library_text():
  assert run_call(REGISTRY_TOOLS, Call("calculator", {"expression": "48/2"}, "c"), 200) == (
    "24",
    False,
  )
  assert run_call(REGISTRY_TOOLS, Call("calculator", "48/2", "c"), 200) == ("24", False)
  result, is_error = run_call(REGISTRY_TOOLS, Call("calculator", {"expression": "1/0"}, "c"), 200)
  assert is_error and result == "error: division by zero"


@pytest.mark.parametrize(
  "call, result",
  [
    (
      Call("calculator", {"expression": 48}, "c"),
      "error: tool calculator: argument 'expression' must be string, got integer 48",
    ),
    (Call("calculator", {}, "c"), "error: tool calculator needs argument 'expression'"),
    (Call("search", {"query": "x"}, "c"), "error: unknown tool 'search'; known tools: calculator"),
    (Call("", {}, "c", 'error: tool call 1: no "name"'), 'error: tool call 1: no "name"'),
  ],
)
def test_bad_calls_are_error_observations(call, result):
  """Mutation caught: `run_call` skipping `check_arguments` (the calculator got 48 and
  answered "error: expected a string", naming no argument)."""
  assert run_call(REGISTRY_TOOLS, call, 200) == (result, True)


def test_failing_tools_are_contained_and_results_clipped():
  def boom(x: int) -> str:
    """Fails.

    Args:
      x: Anything.
    """
    raise RuntimeError(f"no {x}")

  def number(x: int) -> str:
    """Returns a number, not text.

    Args:
      x: Anything.
    """
    return x

  def long(x: int) -> str:
    """Long text.

    Args:
      x: Its length.
    """
    return "y" * x

  box = tool_functions.function_tools({"boom": boom, "number": number, "long": long})
  assert run_call(box, Call("boom", {"x": 1}, "c"), 200) == (
    "error: tool boom failed: RuntimeError: no 1",
    True,
  )
  assert run_call(box, Call("number", {"x": 1}, "c"), 200) == (
    "error: tool number returned int, not str",
    True,
  )
  result, is_error = run_call(box, Call("long", {"x": 500}, "c"), 30)
  assert (
    not is_error
    and len(result) == 30
    and result.endswith(tool_formats.tool_syntax.TRUNCATION_MARKER)
  )
  text, is_error = run_call(box, Call("boom", "1", "c"), 200)
  assert is_error and "takes JSON arguments ['x'], not one text" in text


@pytest.mark.parametrize("fmt_name", ["hermes", "llama3_json", "mistral"])
def test_parse_and_run_three_calls_in_each_native_format(fmt_name):
  fmt = tool_formats.get(fmt_name)
  calls = [
    Call("calculator", {"expression": e}, tool_formats.call_id(i))
    for i, e in enumerate(["1+1", "2*3", "7/0"])
  ]
  parsed = fmt.parse(fmt.render("Let me compute. ", calls))
  results = [run_call(REGISTRY_TOOLS, c, 200) for c in parsed.calls]
  assert results == [("2", False), ("6", False), ("error: division by zero", True)]


@pytest.mark.parametrize("fmt_name", list(tool_formats.FORMATS))
@settings(max_examples=60, deadline=None)
@given(
  parts=st.lists(
    st.sampled_from(
      [
        '<tool_call>{"name": "calculator", "arguments": ',
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "<tool>calculator: ",
      ]
    )
    | st.sampled_from(
      ['{"expression": ', '"1+1"', "}", "</tool_call>", "</tool>", "[", "]", ";", "2", "null"]
    )
    | st.text(max_size=5),
    max_size=10,
  )
)
def test_any_turn_parses_and_runs_without_raising(fmt_name, parts):
  """Whatever a model writes, every call it parses to is answered with text."""
  for call in tool_formats.get(fmt_name).parse("".join(parts)).calls:
    result, is_error = run_call(REGISTRY_TOOLS, call, 200)
    assert isinstance(result, str) and len(result) <= 200
    assert is_error == result.startswith("error: ")
