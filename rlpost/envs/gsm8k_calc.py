"""GSM8K with a calculator: a math problem solved over turns, the calculator a tool.

reset(problem, seed) shows the instructions, optional solved examples (tool
traces of training problems, `rlpost.data.tool_traces`) and the question; the
prompt ends with the opened reasoning tag. Each model turn either

  calls the calculator, <tool>calculator: 48/2</tool>  -> observation <result>24</result>
  or answers, ...</reasoning>\\n<answer>72</answer>     -> scored, the episode ends.

The answer is scored by the task's GSM8K reward functions on the whole
completion as the model saw it: "<reasoning>\\n" + its turns with the results
between them. A call on the last allowed turn (`max_turns`) is not answered:
the episode ends and is scored as it stands. `tool_bonus` (default 0) is added
on the turn of the episode's first well-formed call that the tool answers
without an error, once per episode.

Results sit after the model's text as the plain scaffold shows them
("\\n<result>...</result>"), and the solved examples are rendered the same way
(`render_trace`), so an example reads exactly like a rollout.
"""

import math
from typing import NamedTuple

from rlpost.data import prompts as prompts_lib
from rlpost.data import tasks
from rlpost.data import tool_traces
from rlpost.data.gsm8k import REASONING_START, SYSTEM_PROMPT, Problem
from rlpost.envs import protocol
from rlpost.envs import single_turn
from rlpost.envs import tools
from rlpost.envs.calculator import MAX_EXPONENT

NAME = "gsm8k_calc"
COMPLETION_PREFIX = f"{REASONING_START}\n"  # the prompt opens the reasoning block
INSTRUCTIONS = (
  f"{SYSTEM_PROMPT}\nFor arithmetic, call the calculator: write "
  f"{tools.CALL_OPEN}calculator: EXPRESSION{tools.CALL_CLOSE} and its result comes back as "
  f"{tools.RESULT_OPEN}VALUE{tools.RESULT_CLOSE}. Expressions use numbers, + - * / ** "
  f"(exponents up to {MAX_EXPONENT}) and parentheses."
)


class State(NamedTuple):
  """problem: the task; transcript: the model's turns and results so far; turns: turns
  taken; bonus_paid: the well-formed-call bonus was given."""

  problem: Problem
  transcript: str
  turns: int
  bonus_paid: bool


def render_trace(trace: list[tool_traces.Segment]) -> str:
  """A tool trace as text the way a rollout shows it: results after "\\n" (plain scaffold)."""
  return "".join(text if role == "model" else f"\n{text}" for role, text in trace)


def first_observation(problem: Problem, shots: list[tuple[Problem, list]]) -> str:
  """Instructions, solved (problem, trace) examples, then the question; ends where the
  model writes, after the opened reasoning tag."""
  examples = "".join(
    f"Question: {p.question}\nAnswer: {COMPLETION_PREFIX}{render_trace(trace)}\n\n"
    for p, trace in shots
  )
  return f"{INSTRUCTIONS}\n\n{examples}Question: {problem.question}\nAnswer: {COMPLETION_PREFIX}"


def make_env(
  task: tasks.Task,
  *,
  fewshot: int,
  max_turns: int,
  tool_bonus: float = 0.0,
  max_result_chars: int = 200,
  registry: tools.Registry = tools.REGISTRY,
) -> protocol.Env:
  """The environment over `task` (GSM8K problems, reward and accuracy functions).

  fewshot: solved examples shown, the first `fewshot` of `task.examples` that
    convert to tool traces (ValueError when fewer do).
  max_turns: model turns per episode, the answer included (>= 1).
  """
  if max_turns < 1:
    raise ValueError(f"max_turns={max_turns}: use >= 1 (the answer's turn included)")
  if not (math.isfinite(tool_bonus) and tool_bonus >= 0):  # inf: every advantage NaN
    raise ValueError(f"tool_bonus={tool_bonus}: use a finite number >= 0 (0: off)")
  if fewshot < 0:  # shots[:-1] would silently drop the last example
    raise ValueError(f"fewshot={fewshot}: use >= 0 solved examples in the prompt")
  tools.clip("", max_result_chars)  # validates the budget now
  shots, _ = tool_traces.tool_traces(task.examples)
  if len(shots) < fewshot:
    raise ValueError(
      f"fewshot={fewshot}: only {len(shots)} of the task's {len(task.examples)} examples "
      f"convert to tool traces; use fewshot <= {len(shots)}"
    )
  shots = shots[:fewshot]
  registry = tools.check_registry(registry)

  def reset(problem: Problem, seed: int):
    del seed  # nothing random: the problem is the task
    if not isinstance(problem, Problem):
      raise TypeError(f"{NAME}: reset needs a GSM8K Problem as task, got {type(problem).__name__}")
    return State(problem, "", 0, False), first_observation(problem, shots)

  def step(state: State, text: str) -> protocol.Step:
    call = tools.parse_tool_call(text)
    turns = state.turns + 1
    if call is not None and turns < max_turns:
      observation, is_error = tools.answer_call(registry, call, max_result_chars)
      bonus = tool_bonus > 0 and not is_error and not state.bonus_paid
      new = State(
        state.problem, f"{state.transcript}{text}\n{observation}", turns, state.bonus_paid or bonus
      )
      info = {"tool_call": True, "tool_error": is_error}
      return protocol.Step(new, observation, tool_bonus if bonus else 0.0, False, info)
    completion = f"{COMPLETION_PREFIX}{state.transcript}{text}"
    reward, info = single_turn.score(task, "", completion, state.problem.final)
    info.update(tool_call=call is not None, turns_exhausted=call is not None)
    info["success"] = bool(info.get("answer_accuracy"))
    done = State(state.problem, state.transcript + text, turns, state.bonus_paid)
    return protocol.Step(done, "", reward, True, info)

  stops = prompts_lib.STOP_STRINGS + (tools.CALL_CLOSE,)
  return protocol.Env(NAME, reset, step, max_turns=max_turns, stop_strings=stops)
