"""Tool calls in the model's own format inside an episode: the env wrapper for native formats.

`with_native_tools(env, toolset, fmt)` answers a turn holding calls in `fmt`
(`rlpost.text.tool_formats`: hermes, llama3_json, mistral) by running every call of the
turn (`rlpost.envs.tool_functions.run_call`: arguments checked against the tool's schema,
failures contained) and returning their results as `tool` messages in the step's info
(`TOOL_MESSAGES`; the turn itself as an assistant message with `tool_calls`,
`ASSISTANT_MESSAGE`), which the chat template renders as the next observation
(`rlpost.text.template_turns`); the observation text is their contents, one per line, for
transcripts. The tools' schemas go into `Env.tools` (the template's tool section). A turn without calls goes to `env.step`. A malformed call (broken JSON, an
unknown tool, arguments that do not fit the schema, a call cut by the token limit) is an
"error: ..." result the model sees, with info tool_error True; nothing raises.

Call ids are renumbered over the episode (`call00000`, `call00001`, ... from the episode's
first call), so a template that matches results to calls by id sees unique ids.
"""

from collections.abc import Mapping
from typing import NamedTuple

from rlpost.envs import tool_functions
from rlpost.envs.protocol import Env, Step, check_env
from rlpost.text import tool_formats
from rlpost.text.tool_syntax import clip

TOOL_MESSAGES = "tool_messages"  # info key: the turn's results as `tool` messages (a tuple)
ASSISTANT_MESSAGE = "assistant_message"  # info key: the turn as an OpenAI assistant message


class Answer(NamedTuple):
  """A turn's calls answered: the observation text (the results, one per line), the step
  info (tool_call, tool_error, TOOL_MESSAGES, ASSISTANT_MESSAGE), the calls counted."""

  observation: str
  info: dict
  count: int


def answer_calls(
  parsed: tool_formats.Parsed,
  toolset: Mapping[str, tool_functions.FunctionTool],
  fmt: tool_formats.Format,
  max_result_chars: int,
  answered: int,
) -> Answer:
  """Runs every call of a parsed turn (ids renumbered from `answered`, the episode's calls
  so far) and returns their results as `tool` messages and the turn as an assistant
  message with its well-formed calls."""
  calls = [c._replace(id=tool_formats.call_id(answered + i)) for i, c in enumerate(parsed.calls)]
  results = [tool_functions.run_call(toolset, c, max_result_chars) for c in calls]
  messages = tuple(
    tool_formats.result_message(fmt, c, text) for c, (text, _) in zip(calls, results)
  )
  assistant = {
    "role": "assistant",
    "content": parsed.content,
    "tool_calls": [
      {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
      for c in calls
      if not c.error
    ],
  }
  info = {
    "tool_call": True,
    "tool_error": any(err for _, err in results),
    TOOL_MESSAGES: messages,
    ASSISTANT_MESSAGE: assistant,
  }
  return Answer("\n".join(m["content"] for m in messages), info, len(calls))


def with_native_tools(
  env: Env,
  toolset: Mapping[str, tool_functions.FunctionTool],
  fmt: tool_formats.Format,
  max_result_chars: int = 200,
) -> Env:
  """`env` with tool calls in the native format `fmt`; see the module doc."""
  if not fmt.native:
    raise ValueError(f"with_native_tools takes a native tool format, got {fmt.name!r}")
  clip("", max_result_chars)  # validates the budget now, not at the first call
  check_env(env)
  toolset = dict(toolset)

  def reset(task, seed):
    state, observation = env.reset(task, seed)
    return (state, 0), observation  # (inner state, calls answered so far)

  def step(state, assistant_text: str) -> Step:
    inner, answered = state
    parsed = fmt.parse(assistant_text)
    if not parsed.calls:
      result = env.step(inner, assistant_text)
      if not (isinstance(result, tuple) and len(result) == 5 and isinstance(result[4], dict)):
        return result  # malformed: left for the driver's check (multiturn.checked_step)
      result = Step(*result)
      return result._replace(
        state=(result.state, answered), info={**result.info, "tool_call": False}
      )
    answer = answer_calls(parsed, toolset, fmt, max_result_chars, answered)
    return Step((inner, answered + answer.count), answer.observation, 0.0, False, answer.info)

  stops = tuple(env.stop_strings) + tuple(s for s in fmt.stop_strings if s not in env.stop_strings)
  schemas = tuple(env.tools) + tuple(tool_functions.schemas(toolset))
  return env._replace(reset=reset, step=step, stop_strings=stops, tools=schemas)
