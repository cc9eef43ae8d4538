"""GSM8K with a calculator: a math problem solved over turns, the calculator a tool.

reset(problem, seed) shows the instructions, optional solved examples (tool
traces of training problems, `rlpost.envs.tool_traces`) and the question; the
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

`tool_format`: "library" (the above) or a native format (`rlpost.text.tool_formats`:
hermes, llama3_json, mistral; the run's template scaffold, `rollout.template=template`,
renders it). Native: the instructions name the calculator tool without the library syntax
(the chat template lists its schema, `Env.tools`), the prompt does not open the reasoning
tag (the model writes the whole `<reasoning>...` answer), no solved examples (fewshot 0:
they would be text in the user message, not turns); a turn's calls are parsed with the
format's parser and run by `tool_functions.run_call`, their results returned as `tool`
messages in the step's info (`native_tools.TOOL_MESSAGES`, the turn as
`native_tools.ASSISTANT_MESSAGE`, call ids numbered over the episode), as
`native_tools.with_native_tools` does. The answer message alone is scored (the whole
`<reasoning>...</reasoning>\\n<answer>...</answer>`: a chat model answers in one message
after its calls, and some templates keep no text beside a call); the state's transcript
holds every turn and the results, one per line, after it.
"""

import dataclasses
import math
import types
from typing import NamedTuple

import numpy as np

from rlpost import errors
from rlpost.data import prompts as prompts_lib
from rlpost.data import tasks
from rlpost.envs import tool_traces
from rlpost.data.gsm8k import REASONING_START, SYSTEM_PROMPT, Problem
from rlpost.envs import native_tools
from rlpost.envs import prompt_dataset
from rlpost.envs import protocol
from rlpost.envs import single_turn
from rlpost.envs import tool_functions
from rlpost.envs import tools
from rlpost.envs.calculator import MAX_EXPONENT
from rlpost.text import tool_formats
from rlpost.text import tool_syntax

NAME = "gsm8k_calc"
COMPLETION_PREFIX = f"{REASONING_START}\n"  # the prompt opens the reasoning block
INSTRUCTIONS = (
  f"{SYSTEM_PROMPT}\nFor arithmetic, call the calculator: write "
  f"{tool_syntax.CALL_OPEN}calculator: EXPRESSION{tool_syntax.CALL_CLOSE} and its result comes back as "
  f"{tool_syntax.RESULT_OPEN}VALUE{tool_syntax.RESULT_CLOSE}. Expressions use numbers, + - * / ** "
  f"(exponents up to {MAX_EXPONENT}) and parentheses."
)
NATIVE_INSTRUCTIONS = (
  f"{SYSTEM_PROMPT}\nFor arithmetic, call the calculator tool; its result comes back to "
  f"you. Expressions use numbers, + - * / ** (exponents up to {MAX_EXPONENT}) and parentheses."
)


class State(NamedTuple):
  """problem: the task; transcript: the model's turns and results so far; turns: turns
  taken; bonus_paid: the well-formed-call bonus was given; calls: native calls answered."""

  problem: Problem
  transcript: str
  turns: int
  bonus_paid: bool
  calls: int = 0


def render_trace(trace: list[tool_traces.Segment]) -> str:
  """A tool trace as text the way a rollout shows it: results after "\\n" (plain scaffold)."""
  return "".join(text if role == "model" else f"\n{text}" for role, text in trace)


def first_observation(
  problem: Problem, shots: list[tuple[Problem, list]], native: bool = False
) -> str:
  """Instructions, solved (problem, trace) examples, then the question; ends where the
  model writes, after the opened reasoning tag. `native`: a native tool format's (module
  doc): its instructions and the question only."""
  if native:
    if shots:
      raise ValueError("a native tool format shows no solved examples: use fewshot=0")
    return f"{NATIVE_INSTRUCTIONS}\n\nQuestion: {problem.question}"
  examples = "".join(
    f"Question: {p.question}\nAnswer: {COMPLETION_PREFIX}{render_trace(trace)}\n\n"
    for p, trace in shots
  )
  return f"{INSTRUCTIONS}\n\n{examples}Question: {problem.question}\nAnswer: {COMPLETION_PREFIX}"


def _check_args(fewshot, max_turns, tool_bonus, tool_format="library") -> None:
  native = [name for name, fmt in tool_formats.FORMATS.items() if fmt.native]
  if tool_format != "library" and tool_format not in native:
    raise ValueError(f"tool_format={tool_format!r}: use library or a native format {native}")
  if tool_format != "library" and fewshot:
    raise ValueError(
      f"fewshot={fewshot}: a native tool format ({tool_format}) shows no solved examples "
      "(they would be text in the user message, not turns): use fewshot=0"
    )
  if max_turns < 1:
    raise ValueError(f"max_turns={max_turns}: use >= 1 (the answer's turn included)")
  if not (math.isfinite(tool_bonus) and tool_bonus >= 0):  # inf: every advantage NaN
    raise ValueError(f"tool_bonus={tool_bonus}: use a finite number >= 0 (0: off)")
  if fewshot < 0:  # shots[:-1] would silently drop the last example
    raise ValueError(f"fewshot={fewshot}: use >= 0 solved examples in the prompt")


def _finish(task: tasks.Task, state: State, text: str, completion: str, called: bool):
  """The episode's last step: the whole `completion` scored (module doc)."""
  reward, info = single_turn.score(task, "", completion, state.problem.final)
  info.update(tool_call=called, turns_exhausted=called)
  info["success"] = bool(info.get("answer_accuracy"))
  done = State(
    state.problem, state.transcript + text, state.turns + 1, state.bonus_paid, state.calls
  )
  return protocol.Step(done, "", reward, True, info)


def _native_step(task, fmt: tool_formats.Format, toolset, max_turns, tool_bonus, max_chars):
  """The step of a native tool format (module doc): calls answered as `tool` messages."""

  def step(state: State, text: str) -> protocol.Step:
    parsed = fmt.parse(text)
    if not parsed.calls or state.turns + 1 >= max_turns:
      return _finish(task, state, text, text, bool(parsed.calls))
    answer = native_tools.answer_calls(parsed, toolset, fmt, max_chars, state.calls)
    is_error = answer.info["tool_error"]
    bonus = tool_bonus > 0 and not is_error and not state.bonus_paid
    transcript = f"{state.transcript}{text}\n{answer.observation}\n"
    new = State(
      state.problem,
      transcript,
      state.turns + 1,
      state.bonus_paid or bonus,
      state.calls + answer.count,
    )
    observation, info = answer.observation, answer.info
    return protocol.Step(new, observation, tool_bonus if bonus else 0.0, False, info)

  return step


def make_env(
  task: tasks.Task,
  *,
  fewshot: int,
  max_turns: int,
  tool_bonus: float = 0.0,
  max_result_chars: int = 200,
  registry: tools.Registry = tools.REGISTRY,
  tool_format: str = "library",
) -> protocol.Env:
  """The environment over `task` (GSM8K problems, reward and accuracy functions).

  fewshot: solved examples shown, the first `fewshot` of `task.examples` that
    convert to tool traces (ValueError when fewer do).
  max_turns: model turns per episode, the answer included (>= 1).
  tool_format: "library" or a native format's name (module doc).
  """
  _check_args(fewshot, max_turns, tool_bonus, tool_format)
  tool_syntax.clip("", max_result_chars)  # validates the budget now
  shots, _ = tool_traces.tool_traces(task.examples)
  if len(shots) < fewshot:
    raise ValueError(
      f"fewshot={fewshot}: only {len(shots)} of the task's {len(task.examples)} examples "
      f"convert to tool traces; use fewshot <= {len(shots)}"
    )
  shots = shots[:fewshot]
  registry = tools.check_registry(registry)
  native = tool_format != "library"

  def reset(problem: Problem, seed: int):
    del seed  # nothing random: the problem is the task
    if not isinstance(problem, Problem):
      raise TypeError(f"{NAME}: reset needs a GSM8K Problem as task, got {type(problem).__name__}")
    return State(problem, "", 0, False), first_observation(problem, shots, native)

  def step(state: State, text: str) -> protocol.Step:
    call = tool_syntax.parse_tool_call(text)
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
    return _finish(task, state, text, completion, call is not None)

  if native:
    fmt, toolset = tool_formats.get(tool_format), tool_functions.function_tools(registry)
    step = _native_step(task, fmt, toolset, max_turns, tool_bonus, max_result_chars)
    stops = prompts_lib.STOP_STRINGS + fmt.stop_strings
    schemas = tuple(tool_functions.schemas(toolset))
    return protocol.Env(NAME, reset, step, max_turns=max_turns, stop_strings=stops, tools=schemas)
  stops = prompts_lib.STOP_STRINGS + (tool_syntax.CALL_CLOSE,)
  return protocol.Env(NAME, reset, step, max_turns=max_turns, stop_strings=stops)


RESERVED_EXAMPLES = 8  # the first training problems, kept for few-shot examples


@dataclasses.dataclass(frozen=True)
class GSM8KCalcConfig:
  """The `env` block of a GSM8K-with-a-calculator run.

  data_dir: GSM8K jsonl dir (train.jsonl, test.jsonl); "" = the Hugging Face hub.
  fewshot: solved tool-call examples in the prompt (of the RESERVED_EXAMPLES).
  max_turns, tool_bonus, tool_format: `make_env`'s (tool_format: the run's resolved
    `tools.format`, a native format's name or "library").
  """

  data_dir: str = ""
  fewshot: int = 2
  max_turns: int = 6
  tool_bonus: float = 0.0
  tool_format: str = "library"

  def __post_init__(self):
    _check_args(self.fewshot, self.max_turns, self.tool_bonus, self.tool_format)
    if self.fewshot > RESERVED_EXAMPLES:
      raise ValueError(
        f"fewshot={self.fewshot}: use at most {RESERVED_EXAMPLES} solved examples "
        "(the reserved training problems)"
      )


def build(config: GSM8KCalcConfig, run: protocol.RunInfo) -> protocol.EnvTasks:
  """The table's constructor (`rlpost.envs.table`): training seed s is GSM8K train problem
  s (mod the set, in an order shuffled by `run.seed`; the first RESERVED_EXAMPLES are the
  few-shot examples, never trained on); held-out seed `run.eval_seed_offset + k` is test
  problem k."""
  data = types.SimpleNamespace(source="gsm8k", data_dir=config.data_dir, fewshot=RESERVED_EXAMPLES)
  try:
    train, test = tasks.load_task(data, "train"), tasks.load_task(data, "test")
  except (FileNotFoundError, errors.DataError) as err:  # the loader names data.data_dir
    raise type(err)(str(err).replace("data.data_dir", "env.data_dir")) from None
  if run.eval_tasks > len(test.problems):
    raise errors.ConfigError(
      f"config.eval.num_tasks={run.eval_tasks}: GSM8K test has {len(test.problems)} problems"
    )
  env = make_env(
    train,
    fewshot=config.fewshot,
    max_turns=config.max_turns,
    tool_bonus=config.tool_bonus,
    max_result_chars=run.max_result_chars,
    tool_format=config.tool_format,
  )
  order = np.random.default_rng(run.seed).permutation(len(train.problems))
  offset = run.eval_seed_offset
  held = test.problems
  return protocol.EnvTasks(
    env,
    lambda seeds: [train.problems[order[s % len(order)]] for s in seeds],
    # past the test set's end the problems repeat: `held_out.choose` skips repeats
    lambda seeds: [held[(s - offset) % len(held)] for s in seeds],
    content_key=lambda problem, seed: prompt_dataset.normalized_question(problem.question),
  )
