"""GSM8K solutions as calculator tool-call traces (SFT warm-start for tool use).

A GSM8K training solution carries calculator annotations:

  Natalia sold 48/2 = <<48/2=24>>24 clips in May.

becomes a trace of model and tool segments in `rlpost.envs.tools`' syntax:

  model: "Natalia sold 48/2 = <tool>calculator: 48/2</tool>"
  tool:  "<result>24</result>"
  model: "24 clips in May.\\n...\\n</reasoning>\\n<answer>72</answer>"

The prompt opens the reasoning tag (`rlpost.envs.gsm8k_calc.first_observation`
ends with "<reasoning>\\n", as the few-shot prompt does). The model writes the
expression, the tool answers in the one result format (`tools.format_number`),
the model continues. A solution is dropped (and the
reason counted) when an annotation is malformed, its expression fails in the
calculator, or the calculator's result disagrees with the annotated one.
`trace_ids` turns a trace into the exact token stream a multi-turn rollout
builds (same scaffold), with loss only on the model's segments.

In a native tool format (the model's own, `rlpost.text.tool_formats`) a trace is an
OpenAI-shaped conversation (`conversation`): the question as the user message; each model
segment ending in a call an assistant message whose content is its text before the call
and whose call is a `tool_calls` entry to the calculator (`{"expression": ...}`), each
result a `tool` message answered as a native rollout answers it (`tool_functions.run_call`);
then the answer message, the whole worked solution in the reasoning/answer format (the
segments' texts without the calls: a native episode scores its answer message alone, and
templates such as Llama 3's write a tool-call turn's JSON without its content). The chat
template writes the calls in its format, so SFT on it (`rlpost.data.template_sft`) trains
what a native rollout samples.
"""

import collections
import re
from typing import NamedTuple

from rlpost.data.gsm8k import ANSWER_END, ANSWER_START, REASONING_END, REASONING_START, Problem
from rlpost.envs import calculator
from rlpost.envs import tool_functions
from rlpost.text import scaffold
from rlpost.envs import tools
from rlpost.text import tool_formats
from rlpost.text import tool_syntax

_ANNOTATION = re.compile(r"<<([^<>]*)>>")
_FINAL_MARK = "####"


class Segment(NamedTuple):
  role: str  # "model" (trained on) | "tool" (the tool's answer, not trained on)
  text: str


def _annotation_call(body: str) -> tuple[str, str] | str:
  """(expression, result text) of an annotation body `EXPR=RESULT`, or a drop reason."""
  if body.count("=") != 1:
    return "malformed annotation"
  expression, annotated = (part.strip() for part in body.split("="))
  if not expression or not annotated:
    return "malformed annotation"
  try:
    expected = tools.format_number(float(annotated.replace(",", "")))
  except ValueError:
    return "malformed annotation"
  result = calculator.calculator(expression)
  if result.startswith(tool_syntax.ERROR_PREFIX):
    return "calculator error"
  if result != expected:
    return "result disagrees"
  return expression, result


def tool_trace(problem: Problem) -> list[Segment] | str:
  """The solution of `problem` as model / tool segments, or why it is dropped."""
  if _FINAL_MARK not in problem.answer:
    return "no final answer"
  reasoning = problem.answer.rsplit(_FINAL_MARK, 1)[0].strip()
  segments, text, pos = [], "", 0
  for match in _ANNOTATION.finditer(reasoning):
    call = _annotation_call(match.group(1))
    if isinstance(call, str):
      return call
    expression, result = call
    text += reasoning[pos : match.start()]
    segments.append(
      Segment(
        "model", f"{text}{tool_syntax.CALL_OPEN}calculator: {expression}{tool_syntax.CALL_CLOSE}"
      )
    )
    segments.append(Segment("tool", tool_syntax.result_observation(result)))
    text, pos = "", match.end()
  if "<<" in reasoning[pos:] or ">>" in reasoning[pos:]:
    return "malformed annotation"
  final = f"{ANSWER_START}{problem.final}{ANSWER_END}"
  segments.append(Segment("model", f"{text}{reasoning[pos:]}\n{REASONING_END}\n{final}"))
  return segments


def tool_traces(
  problems: list[Problem], limit: int | None = None
) -> tuple[list[tuple[Problem, list[Segment]]], dict]:
  """(kept (problem, trace) pairs, {drop reason: count}) over `problems`, in order; with a
  `limit`, it stops once `limit` are kept (the counts cover the problems read so far)."""
  kept, dropped = [], collections.Counter()
  for problem in problems:
    if limit is not None and len(kept) >= limit:
      break
    trace = tool_trace(problem)
    if isinstance(trace, str):
      dropped[trace] += 1
    else:
      kept.append((problem, trace))
  return kept, dict(dropped)


def trace_ids(tokenizer, template: str, first_observation: str, trace: list[Segment]):
  """(ids, loss_mask) of a trace as a rollout stream: first prompt, then the segments.

  A model segment is trained on (mask 1); a tool segment enters through
  `scaffold.observation_ids` after the model's unclosed turn (mask 0); the last
  model segment ends with <end_of_turn>, trained on, as a sampled turn would.
  """
  ids = scaffold.prompt_ids(tokenizer, template, first_observation)
  mask = [0] * len(ids)
  for k, (role, text) in enumerate(trace):
    if role == "model":
      new = scaffold.text_ids(tokenizer, text)
      if k == len(trace) - 1:
        new.append(tokenizer.end_of_turn_id)
      ids, mask = ids + new, mask + [1] * len(new)
    else:
      new = scaffold.observation_ids(tokenizer, template, text, model_closed_turn=False)
      ids, mask = ids + new, mask + [0] * len(new)
  return ids, mask


def conversation(
  first_observation: str, trace: list[Segment], max_result_chars: int = 200
) -> list[dict]:
  """A trace as OpenAI messages (module doc): [user, assistant, tool, ..., assistant]; call
  ids numbered over the conversation as a native rollout numbers them."""
  toolset = tool_functions.function_tools(tools.REGISTRY)
  messages, answer = [{"role": "user", "content": first_observation}], ""
  for role, text in trace:
    call = tool_syntax.parse_tool_call(text) if role == "model" else None
    if call is None:
      answer += text if role == "model" else ""
      continue
    content = text[: text.rfind(tool_syntax.CALL_OPEN)]
    answer += content
    native = tool_formats.Call(
      "calculator", {"expression": call.argument}, tool_formats.call_id(len(messages) // 2)
    )
    result, _ = tool_functions.run_call(toolset, native, max_result_chars)
    function = {"name": native.name, "arguments": native.arguments}
    call_entry = {"id": native.id, "type": "function", "function": function}
    messages.append({"role": "assistant", "content": content, "tool_calls": [call_entry]})
    messages.append(
      {"role": "tool", "tool_call_id": native.id, "name": native.name, "content": result}
    )
  messages.append({"role": "assistant", "content": f"{REASONING_START}\n{answer}"})
  return messages
