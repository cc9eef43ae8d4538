"""GSM8K with a calculator: scripted episodes, scoring of the whole transcript, the bonus,
the turn limit, and agreement of the prompt's examples with rollouts and SFT streams."""

import pytest

from rlpost.data import tasks
from rlpost.envs import tool_traces
from rlpost.data.gsm8k import Problem
from rlpost.envs import gsm8k_calc
from rlpost.text import tokenizer as tokenizer_lib
from rlpost.rewards import gsm8k as gsm8k_rewards
from rlpost.text import tool_syntax

TOK = tokenizer_lib.byte_tokenizer()
NATALIA = Problem(
  question="Natalia sold clips to 48 friends in April, and half as many in May. How many in all?",
  answer="In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72 clips.\n#### 72",
  final="72",
)
EXAMPLE = Problem(
  question="A box holds 3 rows of 4 eggs. How many eggs?",
  answer="3*4 = <<3*4=12>>12 eggs.\n#### 12",
  final="12",
)
BROKEN = Problem(question="What is two plus two?", answer="x = <<2+2=5>>5\n#### 5", final="5")
# Per the reward functions' documented values: exact format 3, four tags once 4 x 0.5,
# exact answer 3, first number right 1.5.
PERFECT = 3.0 + 2.0 + 3.0 + 1.5


def _task(examples=(BROKEN, EXAMPLE)):
  return tasks.Task([NATALIA], gsm8k_rewards.REWARD_FNS, tasks.MATH_ACCURACY, list(examples))


def _env(**kwargs):
  args = dict(fewshot=0, max_turns=4)
  return gsm8k_calc.make_env(_task(), **{**args, **kwargs})


def _play(env, texts):
  state, _ = env.reset(NATALIA, 0)
  steps = []
  for text in texts:
    step = env.step(state, text)
    steps.append(step)
    state = step.state
  return steps


def test_calls_are_answered_and_the_whole_transcript_is_scored():
  trace = tool_traces.tool_trace(NATALIA)
  model_turns = [text for role, text in trace if role == "model"]
  steps = _play(_env(), model_turns)
  assert [s.observation for s in steps] == ["<result>24</result>", "<result>72</result>", ""]
  assert [s.done for s in steps] == [False, False, True]
  assert [s.reward for s in steps] == [0.0, 0.0, PERFECT]
  assert steps[0].info == {"tool_call": True, "tool_error": False}
  last = steps[-1].info
  assert last["answer_accuracy"] and last["format_accuracy"] and last["success"]
  assert not last["tool_call"] and not last["turns_exhausted"]
  # the scored text is the rollout's view: the examples' rendering of the same trace
  assert steps[-1].state.transcript == gsm8k_calc.render_trace(trace)


def test_the_answer_alone_is_scored_without_the_tool():
  """No reasoning tag in the answer turn: the prompt opened it, so the format still holds;
  a number off by more than 20% scores -1 for the answer and 0 for the number."""
  (step,) = _play(_env(), ["48 - 18 = 30\n</reasoning>\n<answer>30</answer>"])
  assert step.done and step.reward == 3.0 + 2.0 - 1.0 + 0.0
  assert not step.info["success"] and step.info["format_accuracy"]


def test_the_last_allowed_turn_ends_the_episode_even_on_a_call():
  steps = _play(
    _env(max_turns=2), ["<tool>calculator: 48/2</tool>", "<tool>calculator: 48+24</tool>"]
  )
  assert [s.done for s in steps] == [False, True]
  assert steps[1].observation == "" and steps[1].info["turns_exhausted"]
  # "<reasoning>" once (+0.5), three tags missing (-1.5); no answer tag: 0 and 0
  assert steps[1].reward == -1.0


def test_bad_calls_get_an_error_result_and_no_bonus():
  steps = _play(
    _env(tool_bonus=0.5, max_turns=6),
    [
      "<tool>calculator 48/2</tool>",  # no colon
      "<tool>calculator: 1/0</tool>",
      "<tool>abacus: 1+1</tool>",
      "<tool>calculator: 48/2</tool>",
      "<tool>calculator: 48+24</tool>",
    ],
  )
  assert [s.info["tool_error"] for s in steps] == [True, True, True, False, False]
  assert all(s.observation.startswith("<result>error: ") for s in steps[:3])
  assert [s.reward for s in steps] == [0.0, 0.0, 0.0, 0.5, 0.0]  # once, on the first good call
  assert not any(s.done for s in steps)


def test_results_are_clipped_to_the_budget():
  (step,) = _play(_env(max_result_chars=20), ["<tool>calculator: " + "1+" * 200 + "1</tool>"])
  body = step.observation.removeprefix("<result>").removesuffix("</result>")
  assert len(body) <= 20 and step.info["tool_error"]


def test_the_prompt_shows_converted_examples_as_a_rollout_would_read_them():
  """The first `fewshot` examples that convert (BROKEN is skipped); each reads exactly
  like the text of the SFT stream of its trace (model turns, "\\n" + results)."""
  env = _env(fewshot=1)
  _, observation = env.reset(NATALIA, 0)
  trace = tool_traces.tool_trace(EXAMPLE)
  shown = gsm8k_calc.render_trace(trace)
  assert f"Question: {EXAMPLE.question}\nAnswer: <reasoning>\n{shown}\n\n" in observation
  assert BROKEN.question not in observation
  assert observation.endswith(f"Question: {NATALIA.question}\nAnswer: <reasoning>\n")
  assert observation.startswith(gsm8k_calc.INSTRUCTIONS)
  prompt, _ = tool_traces.trace_ids(TOK, "plain", "Q", [])
  ids, mask = tool_traces.trace_ids(TOK, "plain", "Q", trace)
  streamed = TOK.decode(ids[len(prompt) : -1])  # the stream after the prompt, before <eot>
  assert streamed == shown and ids[-1] == TOK.end_of_turn_id and mask[-1] == 1


def test_stop_strings_end_calls_and_answers():
  env = _env()
  assert tool_syntax.CALL_CLOSE in env.stop_strings and "</answer>" in env.stop_strings


@pytest.mark.parametrize(
  "kwargs,match",
  [
    ({"fewshot": 2}, "only 1 of the task's 2 examples"),
    ({"max_turns": 0}, "max_turns"),
    ({"tool_bonus": -1.0}, "tool_bonus"),
    # Mutation caught: `tool_bonus < 0` alone (as before) lets inf through (an inf reward
    # makes every advantage NaN) and -1 shots, which silently drop the last example.
    ({"tool_bonus": float("inf")}, r"tool_bonus=inf: use a finite number >= 0"),
    ({"tool_bonus": float("nan")}, r"tool_bonus=nan: use a finite number >= 0"),
    ({"fewshot": -1}, r"fewshot=-1: use >= 0"),
    ({"max_result_chars": 3}, "max_chars"),
  ],
)
def test_bad_settings_fail_naming_them(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _env(**kwargs)


def test_reset_needs_a_problem():
  with pytest.raises(TypeError, match="gsm8k_calc"):
    _env().reset(None, 0)


def test_earlier_turns_count_in_the_score():
  """A second <reasoning> tag written in a tool turn breaks the exact format (0) and costs
  the repeated tag (-0.5): scoring only the answer's turn would give full marks."""
  steps = _play(
    _env(),
    [
      "<reasoning> 48/2 = <tool>calculator: 48/2</tool>",
      "so 72.\n</reasoning>\n<answer>72</answer>",
    ],
  )
  assert steps[-1].reward == 0.0 + (1.5 - 0.5) + 3.0 + 1.5
  assert not steps[-1].info["format_accuracy"] and steps[-1].info["answer_accuracy"]
