"""Native tool-call formats (rlpost/text/tool_formats.py): render and parse agree, text
without a call has none, a call cut anywhere is a named error, and the cases where vLLM's
parsers specify behaviour (or where we differ on purpose, as the module docstring lists)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpost.text import tool_formats
from rlpost.text.tool_formats import Call, Parsed

FORMATS = tuple(tool_formats.FORMATS)
NATIVE = ("hermes", "llama3_json", "mistral")
MARKERS = (
  "<tool_call>",
  "</tool_call>",
  "</think>",
  "<|python_tag|>",
  "[TOOL_CALLS]",
  "[ARGS]",
  "[CALL_ID]",
  "<tool>",
  "</tool>",
)


def _plain(text: str) -> bool:
  return not any(m in text for m in MARKERS)


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
json_text = st.text(max_size=12).filter(_plain)
json_values = st.recursive(
  st.none()
  | st.booleans()
  | st.integers()
  | st.floats(allow_nan=False, allow_infinity=False)
  | json_text,
  lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_text, inner, max_size=3),
  max_leaves=8,
)
arguments = st.dictionaries(json_text, json_values, max_size=4)
# prose before the calls: no markers and no "{" or "[" (a brace would start a llama3_json call)
content = st.text(st.characters(blacklist_characters="{[<"), max_size=20)


@st.composite
def turns(draw, fmt_name):
  """(content, calls) a model could write in `fmt_name` (the library syntax: one text call)."""
  if fmt_name == "library":
    text = draw(st.text(min_size=1, max_size=20).map(str.strip).filter(lambda t: t and _plain(t)))
    return draw(content), [Call(draw(names), text, tool_formats.call_id(0))]
  n = draw(st.integers(1, 3))
  calls = [Call(draw(names), draw(arguments), tool_formats.call_id(i)) for i in range(n)]
  return draw(content), calls


@pytest.mark.parametrize("fmt_name", FORMATS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_render_then_parse_gives_the_same_calls(fmt_name, data):
  """Mutations caught: `_json_sequence` not skipping the ";" (`at = len(body) - len(rest)`:
  two or more llama3_json calls); `_mistral_list` numbering every call `first` (ids)."""
  fmt = tool_formats.get(fmt_name)
  prose, calls = data.draw(turns(fmt_name))
  parsed = fmt.parse(fmt.render(prose, calls))
  assert parsed.calls == tuple(calls)
  assert parsed.content.strip() == prose.strip()


@pytest.mark.parametrize("fmt_name", FORMATS)
@settings(max_examples=80, deadline=None)
@given(text=st.text(st.characters() | st.sampled_from('{}[]":; '), max_size=60).filter(_plain))
def test_text_with_no_call_has_no_call(fmt_name, text):
  """Mutation caught: `parse_llama3_json` without its `if calls[0].error` fallback (prose
  with a brace became a broken call)."""
  parsed = tool_formats.get(fmt_name).parse(text)
  if fmt_name == "llama3_json" and text.lstrip().startswith("{"):
    return  # a turn starting with "{" is a call attempt in llama3_json (docstring)
  assert parsed == Parsed(text, ())


def _last_call_span(fmt_name: str, text: str) -> int:
  """Where the last call's body starts: after its opening marker (or its "{")."""
  if fmt_name == "hermes":
    return text.rfind("<tool_call>") + len("<tool_call>")
  if fmt_name == "mistral":
    return text.rfind("[TOOL_CALLS]") + len("[TOOL_CALLS]")
  if fmt_name == "library":
    return text.rfind("<tool>") + len("<tool>")
  return text.rfind('{"name"') + 1


@pytest.mark.parametrize("fmt_name", FORMATS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_call_cut_anywhere_inside_is_a_named_error(fmt_name, data):
  """The turn cut (the token limit) after the last call's opening and before its end: the
  last call is an "error: tool call N: ..." (library: "error: ..."), nothing raises.
  llama3_json turns carry no prose here: a cut call in prose reads as prose (docstring).

  Mutation caught: `parse_hermes` reading an unclosed call to the end of the text
  (vLLM's behaviour) — a cut exactly after complete JSON then gave a call."""
  fmt = tool_formats.get(fmt_name)
  prose, calls = data.draw(turns(fmt_name))
  if fmt_name == "llama3_json":
    prose = data.draw(st.sampled_from(["", "<|python_tag|>"]))
  text = fmt.render(prose, calls)
  cut = data.draw(st.integers(_last_call_span(fmt_name, text), len(text) - 1))
  parsed = fmt.parse(text[:cut])
  assert parsed.calls, text[:cut]
  last = parsed.calls[-1]
  assert last.error.startswith("error: "), (text[:cut], parsed)
  if fmt_name != "library":
    assert last.error.startswith(f"error: tool call {len(parsed.calls)}: ")


@pytest.mark.parametrize("fmt_name", FORMATS)
@settings(max_examples=100, deadline=None)
@given(
  text=st.lists(
    st.sampled_from(MARKERS) | st.text(max_size=8) | st.just('{"name": "f"'), max_size=8
  ).map("".join)
)
def test_parse_never_raises_and_every_call_is_whole_or_an_error(fmt_name, text):
  """Markers and fragments in any order: every call has a name and an arguments object
  (text for the library syntax), or an error."""
  for call in tool_formats.get(fmt_name).parse(text).calls:
    if call.error:
      assert call.error.startswith("error: ")
    else:
      assert call.name and isinstance(call.arguments, str if fmt_name == "library" else dict)


# ---------------------------------------------------------------- hermes (vLLM: hermes_tool_parser)


def test_hermes_keeps_the_text_before_the_first_call_and_reads_every_call():
  text = (
    'Two sums.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    ' between <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call> after'
  )
  parsed = tool_formats.parse_hermes(text)
  assert parsed.content == "Two sums.\n"
  assert [c.arguments["expression"] for c in parsed.calls] == ["1+1", "2+2"]
  assert [c.id for c in parsed.calls] == ["call00000", "call00001"]


@pytest.mark.parametrize(
  "body, reason",
  [
    ('{"name": "f", "arguments": {"x": 1}', "cut off"),
    ('{"name": "f" "arguments": {}}', "not valid JSON"),
    ('{"arguments": {}}', 'no "name"'),
    ('{"name": "f"}', 'no "arguments"'),
    ('{"name": "f", "arguments": "{\\"x\\": 1}"}', '"arguments" must be a JSON object, got str'),
    ('["f"]', "expected a JSON object, got list"),
    ('{"name": "f", "arguments": {}} trailing', "text after the JSON object"),
  ],
)
def test_hermes_malformed_call_is_named_and_the_good_call_beside_it_stays(body, reason):
  """vLLM returns the whole turn as content when any call fails; we answer each bad call
  with its reason and keep the good ones (module docstring).

  Mutation caught: `_object_call` taking a string "arguments" (the tool got a str)."""
  good = '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
  parsed = tool_formats.parse_hermes(f"{good}<tool_call>{body}</tool_call>")
  assert parsed.calls[0] == Call("g", {}, "call00000")
  assert (
    parsed.calls[1].error.startswith("error: tool call 2: ") and reason in parsed.calls[1].error
  )


def test_hermes_reads_no_call_inside_thinking():
  text = (
    '<think>I could write <tool_call>{"name": "f", "arguments": {}}</tool_call></think>\nNo call.'
  )
  assert tool_formats.parse_hermes(text) == Parsed(text, ())


# ---------------------------------------------------------------- llama3_json (vLLM: llama_tool_parser)


@pytest.mark.parametrize("prefix", ["", "<|python_tag|>", "  "])
def test_llama3_json_reads_semicolon_separated_calls_with_or_without_the_tag(prefix):
  text = f'{prefix}{{"name": "a", "parameters": {{"x": {{"y": {{"z": [1]}}}}}}}} ; {{"name": "b", "arguments": {{}}}}'
  parsed = tool_formats.parse_llama3_json(text)
  assert parsed.calls == (
    Call("a", {"x": {"y": {"z": [1]}}}, "call00000"),
    Call("b", {}, "call00001"),
  )


def test_llama3_json_prefers_arguments_over_parameters_as_vllm_does():
  text = '{"name": "a", "arguments": {"x": 1}, "parameters": {"x": 2}}'
  assert tool_formats.parse_llama3_json(text).calls[0].arguments == {"x": 1}


def test_llama3_json_prose_braces_that_are_no_call_are_content():
  for text in ["The set {1, 2} has two members.", 'Answer: {"value": 3}', "Brace { never closed"]:
    assert tool_formats.parse_llama3_json(text) == Parsed(text, ())


def test_llama3_json_call_after_prose_keeps_the_prose():
  parsed = tool_formats.parse_llama3_json(
    'Let me check. {"name": "f", "parameters": {"q": "x"}} ok'
  )
  assert parsed == Parsed("Let me check. ", (Call("f", {"q": "x"}, "call00000"),))


@pytest.mark.parametrize(
  "text, reason",
  [
    ("<|python_tag|>print(2 + 2)", "not valid JSON"),
    ('{"answer": 3}', 'no "name"'),
    ('{"name": "a", "parameters": {}};', "no JSON"),
    ('{"name": "a", "parameters": {"x": ', "cut off"),
  ],
)
def test_llama3_json_a_turn_that_opens_a_call_and_breaks_it_is_an_error(text, reason):
  """After <|python_tag|> or at a turn starting with "{", a broken call is an error (vLLM:
  content)."""
  last = tool_formats.parse_llama3_json(text).calls[-1]
  assert last.error.startswith("error: tool call ") and reason in last.error


# ---------------------------------------------------------------- mistral (vLLM: mistral_tool_parser)


def test_mistral_list_form_keeps_content_and_a_model_id_of_nine_alphanumerics():
  text = 'Sure.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abcDE1234"}, {"name": "b", "arguments": {}, "id": "short"}]'
  parsed = tool_formats.parse_mistral(text)
  assert parsed == Parsed("Sure.", (Call("a", {"x": 1}, "abcDE1234"), Call("b", {}, "call00001")))


def test_mistral_name_args_form_with_and_without_call_id():
  """The v11+ form Mistral-Small-3.2's template writes: [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...};
  NAME{...} is what vLLM reads when [ARGS] was decoded away."""
  text = '[TOOL_CALLS]get_weather[CALL_ID]A1b2C3d4E[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]now{}'
  assert tool_formats.parse_mistral(text).calls == (
    Call("get_weather", {"city": "Paris"}, "A1b2C3d4E"),
    Call("add", {"a": 1}, "call00001"),
    Call("now", {}, "call00002"),
  )


@pytest.mark.parametrize(
  "text, reason",
  [
    ("[TOOL_CALLS]", "no [ARGS]"),
    ("[TOOL_CALLS]two words[ARGS]{}", "tool name must be"),
    ("[TOOL_CALLS]f[ARGS][1]", "arguments must be a JSON object"),
    ("[TOOL_CALLS][]", "non-empty JSON list"),
    ('[TOOL_CALLS][{"name": "f", "arguments": {}', "cut off"),
  ],
)
def test_mistral_malformed_calls_are_named(text, reason):
  (call,) = tool_formats.parse_mistral(text).calls
  assert call.error.startswith("error: tool call 1: ") and reason in call.error


# ---------------------------------------------------------------- library, table, detect, results


def test_library_format_is_tool_syntax_with_text_arguments():
  parsed = tool_formats.parse_library("Half: <tool>calculator: 48/2</tool>")
  assert parsed == Parsed("Half: ", (Call("calculator", "48/2", "call00000"),))
  (bad,) = tool_formats.parse_library("<tool>calculator 48/2</tool>").calls
  assert bad.error.startswith("error: ") and "NAME: ARGUMENT" in bad.error


def test_stop_strings_native_formats_end_at_the_models_end_of_turn():
  """Native turns hold several calls: no stop string may cut the second off."""
  assert {tool_formats.get(n).stop_strings for n in NATIVE} == {()}
  assert tool_formats.get("library").stop_strings == ("</tool>",)
  with pytest.raises(ValueError, match="tool format 'qwen' is unknown; use one of hermes"):
    tool_formats.get("qwen")


# Template lines as the model families' chat templates write them (Qwen2.5, Llama 3.1,
# Mistral-Nemo, Qwen3-Coder, GLM 4.6); detect() was also run on llama.cpp's 71 bundled
# templates (see the report of issue 66): Qwen2.5/QwQ/Qwen3/Hermes -> hermes, Llama 3.1-3.3 ->
# llama3_json, Mistral-Nemo/Small-3.2/Devstral -> mistral, Gemma/SmolLM -> library.
QWEN = (
  '<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)
LLAMA = '<|start_header_id|>ipython<|end_header_id|>{{- \'{"name": "\' + tool_call.name + \'", "parameters": \' }}'
LLAMA_BUILTIN = "<|start_header_id|>assistant<|end_header_id|>\\n\\n<|python_tag|>"
MISTRAL = '{{- "[TOOL_CALLS][" }}{%- for tool_call in message.tool_calls %}'
GEMMA = "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"


@pytest.mark.parametrize(
  "template, name",
  [
    (QWEN, "hermes"),
    (LLAMA, "llama3_json"),
    (LLAMA_BUILTIN, "llama3_json"),
    (MISTRAL, "mistral"),
    (GEMMA, "library"),
    (None, "library"),
  ],
)
def test_detect_picks_the_format_from_the_template(template, name):
  assert tool_formats.detect(template) == name


@pytest.mark.parametrize(
  "template",
  [
    "<tool_call>\\n<function=' + tool_call.name + '>\\n",
    "<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key>",
  ],
)
def test_detect_refuses_a_tool_section_no_parser_reads(template):
  """Mutation caught: without the refusal, Qwen3-Coder's XML calls were read as hermes
  JSON and every call answered "not valid JSON"."""
  with pytest.raises(ValueError, match="no parser reads.*config.tools.format=library"):
    tool_formats.detect(template)


def test_result_message_native_is_a_tool_message_library_is_result_text():
  call = Call("calculator", {"expression": "48/2"}, "call00003")
  message = tool_formats.result_message(tool_formats.get("hermes"), call, "24")
  assert message == {
    "role": "tool",
    "tool_call_id": "call00003",
    "name": "calculator",
    "content": "24",
  }
  assert (
    tool_formats.result_message(tool_formats.get("library"), call, "24") == "<result>24</result>"
  )


# Assistant turns with two calls, f(x=1, s="é<") and g(), as transformers 5.25.0 rendered them
# from the models' templates (llama.cpp's copies), the generation prompt cut off.
CALLS = (Call("f", {"x": 1, "s": "é<"}, "call00000"), Call("g", {}, "call00001"))
RENDERED = {
  "hermes": '<tool_call>\n{"name": "f", "arguments": {"x": 1, "s": "é<"}}\n</tool_call>\n'
  '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',  # Qwen2.5-7B-Instruct
  "mistral": '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1, "s": "é<"}, "id": "call00000"}, '
  '{"name": "g", "arguments": {}, "id": "call00001"}]',  # Mistral-Nemo-Instruct-2407
  "mistral_v11": '[TOOL_CALLS]f[CALL_ID]call00000[ARGS]{"x": 1, "s": "é<"}'
  "[TOOL_CALLS]g[CALL_ID]call00001[ARGS]{}",  # Mistral-Small-3.2-24B-Instruct-2506
}


@pytest.mark.parametrize("key", RENDERED)
def test_parse_reads_what_the_models_templates_render(key):
  """Mutation caught: `_mistral_named` without the [CALL_ID] split (the name became
  "f[CALL_ID]call00000", refused)."""
  assert tool_formats.get(key.removesuffix("_v11")).parse(RENDERED[key]) == Parsed("", CALLS)


def test_render_writes_the_templates_call_layout():
  """render_hermes equals Qwen2.5's rendering above (no newline before a first call without
  content); llama3_json is Llama 3.1's {"name", "parameters"} (its template renders one call)."""
  assert tool_formats.render_hermes("", CALLS) == RENDERED["hermes"]
  assert (
    tool_formats.render_hermes("Hi", CALLS[:1])
    == "Hi\n" + RENDERED["hermes"].split("\n<tool_call>")[0]
  )
  assert tool_formats.render_llama3_json("", CALLS[:1]) == json.dumps(
    {"name": "f", "parameters": {"x": 1, "s": "é<"}}, ensure_ascii=False
  )
  with pytest.raises(ValueError, match="one call with text arguments"):
    tool_formats.render_library("", CALLS[:1])
