"""rlpost.rewards.checkers: answer extraction, the exact checker, math-verify off the main
thread, and env.checker on GSM8K's rewards."""

import threading

import pytest
from optional_packages import require

from rlpost.envs import prompt_dataset
from rlpost.data import tasks as tasks_lib
from rlpost.rewards import checkers


def test_extract_answer_reads_the_last_complete_span():
  """Mutation caught: `spans[0]` for `spans[-1]`."""
  assert checkers.extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"
  assert checkers.extract_answer("<answer>1") is None


@pytest.mark.parametrize(
  "answer,gold,want",
  [("1,000", "1000", True), ("$1000.", "1000", True), ("1000.00", "1000", True),
   ("999", "1000", False), (" Paris ", "paris", True), ("\\boxed{1000}", "1000", False)],
)  # fmt: skip
def test_exact_compares_numbers_as_numbers_and_text_as_text(answer, gold, want):
  """Mutation caught: dropping `.replace(",", "")` ("1,000" no longer a number)."""
  assert checkers.exact(answer, gold) is want


PAIRS = [("\\boxed{1000}", "1000"), ("1/2", "0.5"), ("\\frac{3}{4}", "0.75"), ("7", "8"),
         ("x+1", "1+x"), ("50\\%", "0.5"), ("nonsense", "3")]  # fmt: skip


def test_math_verify_gives_the_packages_verdict_on_a_worker_thread():
  """Our checker equals math_verify.verify(parse(gold), parse(answer)) called on the main
  thread with its defaults, while ours runs on a thread (as rollout steps do). Mutation
  caught: `parsing_timeout=None` dropped (the default SIGALRM timeout raises off the main
  thread: every verdict False)."""
  mv = require("math_verify")
  want = [bool(mv.verify(mv.parse(g), mv.parse(a))) for a, g in PAIRS]
  assert True in want and False in want
  got = []
  thread = threading.Thread(target=lambda: got.extend(checkers.math_verify(a, g) for a, g in PAIRS))
  thread.start()
  thread.join()
  assert got == want


def test_checker_swaps_gsm8k_answer_reward_and_accuracy():
  """env.checker=math_verify: GSM8K's check_numbers pays 1.5 for "\\frac{144}{2}" against 72
  and answer_accuracy counts it; exact pays 0. Mutation caught: `with_checker` returning
  `task` for every source."""
  require("math_verify")
  task = tasks_lib.Task(
    [], dict(tasks_lib.gsm8k_rewards.REWARD_FNS), dict(tasks_lib.MATH_ACCURACY), []
  )
  completion = "<reasoning>r</reasoning><answer>\\frac{144}{2}</answer>"
  for checker, paid in (("exact", 0.0), ("math_verify", 1.5)):
    config = prompt_dataset.config_class("arithmetic")(checker=checker)
    checked = prompt_dataset.with_checker(task, config)
    assert checked.reward_fns["check_numbers"]([""], [completion], ["72"]) == [paid]
    assert checked.accuracy_fns["answer_accuracy"](completion, "72") is (paid > 0)


def test_unknown_checker_is_refused_by_name():
  with pytest.raises(ValueError, match=r"checker='sympy': use one of \('exact', 'math_verify'\)"):
    prompt_dataset.config_class("gsm8k")(checker="sympy")
