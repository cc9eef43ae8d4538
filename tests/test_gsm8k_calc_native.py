"""gsm8k_calc in a native tool format, and tool traces as OpenAI conversations: the SFT
conversation of a solution, laid out by each family's template (transformers' fixtures),
replayed through the native environment gets the same results and the full reward."""

import pytest
from test_gsm8k_calc import NATALIA, PERFECT, _task
from test_template_turns import _setup

from rlpost.data import template_sft
from rlpost.envs import gsm8k_calc, native_tools, tool_functions, tool_traces, tools
from rlpost.text import tool_formats

SCHEMAS = tool_functions.schemas(tool_functions.function_tools(tools.REGISTRY))
# template fixture -> its native tool format
FAMILIES = {"qwen2_5": "hermes", "llama3_1": "llama3_json", "mistral_nemo": "mistral"}


def _env(fmt: str, **kwargs):
  args = dict(fewshot=0, max_turns=4, tool_format=fmt)
  return gsm8k_calc.make_env(_task(), **{**args, **kwargs})


def _conversation():
  trace = tool_traces.tool_trace(NATALIA)
  observation = gsm8k_calc.first_observation(NATALIA, [], native=True)
  return tool_traces.conversation(observation, trace)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_sft_conversation_replays_through_the_native_environment(name):
  """Each assistant span the template writes for the trace (what SFT trains on), decoded
  with its control tokens, is a model turn of the native environment: its calls parse in
  the family's format, the environment answers them with the conversation's own `tool`
  messages, and the last turn scores the full reward. Mutation: `call_id(state.calls + i)`
  -> `call_id(i)` in `_native_step` (the second call's id repeats the first's)."""
  layout, tok = _setup(name)
  env = _env(FAMILIES[name])
  messages = _conversation()
  state, observation = env.reset(NATALIA, 0)
  assert messages[0]["content"] == observation and env.tools == tuple(SCHEMAS)
  ids, mask = template_sft.tokenize({"messages": messages, "tools": SCHEMAS}, tok, layout, 10**5)
  eot = {i: s for s, i in tok.special_tokens.items()}[tok.end_of_turn_id]
  spans, start = [], None
  for k, flag in enumerate([*mask, False]):
    if flag and start is None:
      start = k
    elif not flag and start is not None:
      spans.append(tok.decode(ids[start:k], skip_special=False).removesuffix(eot))
      start = None
  results = [m for m in messages if m["role"] == "tool"]
  for k, text in enumerate(spans):
    step = env.step(state, text)
    state = step.state
    if k < len(results):
      assert step.info[native_tools.TOOL_MESSAGES] == (results[k],)
      assert not step.info["tool_error"] and not step.done
  assert step.done and step.reward == PERFECT and step.info["success"]


def test_native_prompt_names_the_tool_not_the_library_syntax():
  _, observation = _env("hermes").reset(NATALIA, 0)
  assert "<tool>" not in observation and "calculator tool" in observation
  assert observation.endswith(f"Question: {NATALIA.question}")


def test_bad_native_calls_are_error_results_and_a_call_on_the_last_turn_ends_it():
  """Broken JSON and an unknown tool are answered with errors (tool_error, no bonus); a
  call on the last allowed turn ends and scores the episode. Mutation: `is_error = any(...)`
  -> `is_error = False`."""
  env = _env("hermes", max_turns=2, tool_bonus=0.5)
  state, _ = env.reset(NATALIA, 0)
  step = env.step(state, '<tool_call>\n{"name": "calculator", "arguments": {"expr\n</tool_call>')
  assert step.info["tool_error"] and step.reward == 0.0 and not step.done
  assert step.info[native_tools.TOOL_MESSAGES][0]["content"].startswith("error:")
  call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
  last = env.step(step.state, call)
  assert last.done and last.info["turns_exhausted"] and last.info["tool_call"]
  unknown = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
  step = _env("hermes").step(env.reset(NATALIA, 0)[0], unknown)
  assert step.info["tool_error"] and "unknown tool" in step.observation


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"tool_format": "hermes", "fewshot": 1}, "fewshot=1: a native tool format"),
    ({"tool_format": "library_x"}, "tool_format='library_x'"),
    ({"tool_format": "library", "fewshot": -1}, "fewshot=-1"),
  ],
)
def test_bad_tool_format_settings_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    gsm8k_calc.make_env(_task(), **{"fewshot": 0, "max_turns": 4, **kwargs})
  assert tool_formats.get("hermes").native
