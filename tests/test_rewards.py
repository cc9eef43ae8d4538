"""GSM8K rewards on hand-written completions, and the reward error policy."""

import math

import numpy as np
import pytest

from rlpost import rewards
from rlpost.rewards import gsm8k as r

GOOD = "<reasoning>\n3 + 4 = 7\n</reasoning>\n<answer>7</answer>"
CASES = {
  # completion: (exactly, approximately, check_answer, check_numbers) with truth "7"
  GOOD: (3.0, 2.0, 3.0, 1.5),
  "<reasoning>x</reasoning><answer> 7 </answer>": (3.0, 2.0, 1.5, 1.5),
  "<reasoning>x</reasoning><answer>7.5</answer>": (3.0, 2.0, 0.5, 0.0),
  "<reasoning>x</reasoning><answer>8.2</answer>": (3.0, 2.0, 0.25, 0.0),
  "<reasoning>x</reasoning><answer>12</answer>": (3.0, 2.0, -1.0, 0.0),
  "<reasoning>x</reasoning><answer>seven</answer>": (3.0, 2.0, 0.0, 0.0),
  "<reasoning>x</reasoning><answer>7 apples</answer>": (3.0, 2.0, 0.0, 1.5),  # not a number
  "The answer is 7": (0.0, -2.0, 0.0, 0.0),
  "<answer>7</answer>": (0.0, 0.0, 3.0, 1.5),
  GOOD + " trailing": (0.0, 2.0, 3.0, 1.5),
  # Two reasoning or answer blocks are not the exact format.
  "<reasoning><reasoning>x</reasoning><answer>7</answer><answer>7</answer>": (0.0, -1.0, 3.0, 1.5),
  "<reasoning>x</reasoning><answer>7</answer><reasoning>y</reasoning><answer>7</answer>": (
    0.0,
    -2.0,
    3.0,
    1.5,
  ),
  "": (0.0, -2.0, 0.0, 0.0),
}


@pytest.mark.parametrize("completion", list(CASES))
def test_reward_functions_on_hand_written_completions(completion):
  got = tuple(
    fn([""], [completion], ["7"])[0]
    for fn in (
      r.match_format_exactly,
      r.match_format_approximately,
      r.check_answer,
      r.check_numbers,
    )
  )
  assert got == CASES[completion]


def test_numbers_with_commas_and_negatives():
  assert r.check_numbers([""], ["<answer>1,234</answer>"], ["1234"]) == [1.5]
  assert r.check_answer([""], ["<answer>-5</answer>"], ["-5"]) == [3.0]
  assert r.is_correct(GOOD, "7") and not r.is_correct(GOOD, "8")
  assert r.has_format(GOOD) and not r.has_format("7")


def test_score_returns_per_function_values():
  per_fn, errors = rewards.score(r.REWARD_FNS, ["", ""], [GOOD, "nope"], ["7", "7"])
  assert set(per_fn) == set(r.REWARD_FNS) and all(v == 0 for v in errors.values())
  np.testing.assert_array_equal(per_fn["check_answer"], [3.0, 0.0])


def test_reward_error_policy_zero_for_rare_failures_then_raise():
  def flaky(prompts, completions, answers):
    return [1.0 / (len(c) - 3) for c in completions]  # ZeroDivisionError on 3-char text

  per_fn, errors = rewards.score(
    {"flaky": flaky}, ["", "", ""], ["abcd", "abc", "abcde"], ["", "", ""]
  )
  np.testing.assert_allclose(per_fn["flaky"], [1.0, 0.0, 0.5])
  assert errors == {"flaky": 1}
  with pytest.raises(RuntimeError, match=r"reward function 'flaky' failed on 2/3.*example 0"):
    rewards.score({"flaky": flaky}, ["", "", ""], ["abc", "abc", "abcde"], ["", "", ""])


def test_reward_function_returning_garbage_is_an_error():
  with pytest.raises(RuntimeError, match="non-finite"):
    rewards.score({"nan": lambda p, c, a: [math.nan] * len(c)}, [""], ["x"], [""])
  with pytest.raises(RuntimeError, match="returned 2 rewards for 1"):
    rewards.score({"long": lambda p, c, a: [1.0, 2.0]}, [""], ["x"], [""])
