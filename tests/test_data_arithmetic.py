"""Synthetic arithmetic problems: determinism per seed and correct answers."""

import re

import pytest

from rlpost.data import arithmetic, gsm8k

# Independent readings of each question text: pattern -> answer from its numbers.
_READERS = [
  (r"has (\d+) \w+, buys (\d+) more and then gives (\d+) away", lambda a, b, c: a + b - c),
  (r"has (\d+) \w+ and buys (\d+) more", lambda a, b: a + b),
  (r"has (\d+) \w+ and gives (\d+) of them", lambda a, b: a - b),
  (r"buys (\d+) boxes with (\d+) \w+ in each box", lambda a, b: a * b),
]


def _expected(question):
  for pattern, fn in _READERS:
    match = re.search(pattern, question)
    if match:
      return fn(*(int(g) for g in match.groups()))
  raise AssertionError(f"no reader for {question!r}")


def test_deterministic_per_seed_and_prefix_stable():
  a = arithmetic.generate_problems(40, seed=3)
  assert a == arithmetic.generate_problems(40, seed=3)
  assert a[:7] == arithmetic.generate_problems(7, seed=3)
  assert a != arithmetic.generate_problems(40, seed=4)
  assert len(set(a)) > 30


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_answers_are_correct(seed):
  problems = arithmetic.generate_problems(200, seed=seed, max_operand=30)
  templates_seen = set()
  for p in problems:
    truth = _expected(p.question)
    assert truth >= 0
    assert p.final == str(truth)
    assert p.answer.endswith(f"\n#### {truth}")
    for lhs, rhs in re.findall(r"<<([\d+\-*]+)=(\d+)>>", p.answer):
      assert eval(lhs) == int(rhs)  # pylint: disable=eval-used  (digits and + - * only)
    numbers = [int(x) for x in re.findall(r"\d+", p.question)]
    assert all(2 <= n <= 30 for n in numbers)
    templates_seen.add(next(i for i, (pat, _) in enumerate(_READERS) if re.search(pat, p.question)))
  assert templates_seen == set(range(len(_READERS)))


def test_round_trips_through_gsm8k_parsing_and_format():
  for p in arithmetic.generate_problems(20, seed=0):
    assert gsm8k.problem_from_record(p._asdict(), "synthetic") == p
    completion = gsm8k.sft_completion(p)
    assert "<<" not in completion and completion.endswith(f"<answer>{p.final}</answer>")


def test_bad_arguments():
  with pytest.raises(ValueError, match="max_operand=1"):
    arithmetic.generate_problems(3, seed=0, max_operand=1)
  with pytest.raises(ValueError, match="seed=-1"):
    arithmetic.generate_problems(3, seed=-1)
