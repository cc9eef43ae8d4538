"""Synthetic arithmetic word problems in GSM8K's format: an offline stand-in.

Problem `i` of seed `s` is drawn from `np.random.default_rng([s, i])`, so the
list is deterministic per seed, and `generate_problems(n, s)[:k] ==
generate_problems(k, s)`. Answers are worked solutions with GSM8K-style
calculator annotations and a final `#### <number>` line, so everything that
consumes GSM8K (`sft_completion`, the rewards) consumes these too.
"""

import numpy as np

from rlpost.data.gsm8k import Problem

NAMES = ("Tom", "Ana", "Ravi", "Mei", "Lena", "Omar", "Sara", "Kofi")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "books")


def _add(name, item, a, b, c):
  del c
  s = a + b
  return (
    f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?",
    [f"{name} has {a} + {b} = <<{a}+{b}={s}>>{s} {item}."],
    s,
  )


def _subtract(name, item, a, b, c):
  del c
  a, b = max(a, b), min(a, b)
  r = a - b
  return (
    f"{name} has {a} {item} and gives {b} of them to a friend. "
    f"How many {item} does {name} have left?",
    [f"{name} has {a} - {b} = <<{a}-{b}={r}>>{r} {item} left."],
    r,
  )


def _multiply(name, item, a, b, c):
  del c
  p = a * b
  return (
    f"{name} buys {a} boxes with {b} {item} in each box. How many {item} does {name} buy?",
    [f"{name} buys {a} * {b} = <<{a}*{b}={p}>>{p} {item}."],
    p,
  )


def _add_then_subtract(name, item, a, b, c):
  s = a + b
  c = min(c, s)
  r = s - c
  return (
    f"{name} has {a} {item}, buys {b} more and then gives {c} away. "
    f"How many {item} does {name} have left?",
    [
      f"After buying, {name} has {a} + {b} = <<{a}+{b}={s}>>{s} {item}.",
      f"After giving {c} away, {name} has {s} - {c} = <<{s}-{c}={r}>>{r} {item}.",
    ],
    r,
  )


TEMPLATES = (_add, _subtract, _multiply, _add_then_subtract)


def make_problem(seed: int, index: int, max_operand: int = 20) -> Problem:
  """Problem `index` of `seed`: operands drawn uniformly from [2, max_operand]."""
  if max_operand < 2:
    raise ValueError(
      f"max_operand={max_operand} must be >= 2 (operands are drawn from [2, max_operand])"
    )
  rng = np.random.default_rng([seed, index])
  template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
  name = NAMES[int(rng.integers(len(NAMES)))]
  item = ITEMS[int(rng.integers(len(ITEMS)))]
  a, b, c = (int(x) for x in rng.integers(2, max_operand + 1, size=3))
  question, steps, final = template(name, item, a, b, c)
  answer = "\n".join(steps) + f"\n#### {final}"
  return Problem(question=question, answer=answer, final=str(final))


def generate_problems(num_problems: int, seed: int, *, max_operand: int = 20) -> list[Problem]:
  """`num_problems` deterministic problems for `seed` (see module docstring)."""
  if num_problems < 0 or seed < 0:
    raise ValueError(f"num_problems={num_problems} and seed={seed} must be >= 0")
  return [make_problem(seed, i, max_operand) for i in range(num_problems)]
