"""Answer checkers: is an extracted answer the gold one? (`env.checker` exact | math_verify)

  exact        the library's own comparison: numbers compared as numbers once "$", ","
               and a trailing "." are dropped ("1,000" == "1000" == "1000.0"), anything
               else as text after trimming and lower-casing.
  math_verify  Hugging Face's math-verify (the `math-verify` extra): LaTeX and plain
               expressions parsed and compared symbolically (\\boxed{}, fractions,
               percentages, sets). Called with its timeouts off (`parsing_timeout=None,
               timeout_seconds=None`: they use SIGALRM, which raises off the main thread,
               and rollout steps run on a thread pool), in a worker process with a time
               limit instead (`rlpost.rewards.bounded`).

Each checker is `(answer: str, gold: str) -> bool` and never raises (a failure is False).
`extract_answer` finds the answer a completion gives inside <answer>...</answer>.
"""

import re

from rlpost.rewards import bounded
from rlpost.rewards import extras

_HERE = "rlpost.rewards.checkers"

CHECKERS = ("exact", "math_verify")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def extract_answer(completion: str) -> str | None:
  """The text of the last complete <answer>...</answer> span, trimmed, or None."""
  spans = _ANSWER.findall(completion)
  return spans[-1].strip() if spans else None


def _number(text: str) -> float | None:
  try:
    return float(text.strip().replace(",", "").replace("$", "").rstrip("."))
  except ValueError:
    return None


def exact(answer: str, gold: str) -> bool:
  """Equal as numbers (module docstring), else as trimmed, lower-cased text."""
  a, g = _number(answer), _number(gold)
  if a is not None and g is not None:
    return a == g
  return " ".join(answer.split()).lower() == " ".join(gold.split()).lower()


def math_verify(answer: str, gold: str) -> bool:
  """math-verify's verdict on `answer` against `gold` (both parsed by it), False when
  either does not parse, the comparison fails, or it runs past `bounded.TIMEOUT_S` (it
  runs in a worker process: "9^9^9^9" would never finish)."""
  _math_verify_module()  # a missing extra: the ConfigError naming pip install, here
  setup = (_HERE + ":_math_verify_module", ())
  return bounded.call(_HERE + ":math_verify_here", (answer, gold), False, setup=setup)


def _math_verify_module():
  return extras.load("math_verify", "config.env.checker='math_verify'")


def math_verify_here(mv, answer: str, gold: str) -> bool:
  """`math_verify` in this process (`mv`: the math_verify module), with no time limit."""
  try:
    parsed_gold = mv.parse(gold, parsing_timeout=None)
    parsed = mv.parse(answer, parsing_timeout=None)
    return bool(parsed_gold and parsed and mv.verify(parsed_gold, parsed, timeout_seconds=None))
  except Exception:  # pylint: disable=broad-except  (a parser failure is a wrong answer)
    return False


def check(name: str) -> None:
  """ValueError "checker=...: fix" unless `name` is a checker whose package imports."""
  if name not in CHECKERS:
    raise ValueError(f"checker={name!r}: use one of {CHECKERS}")
  if name == "math_verify":
    extras.load("math_verify", "config.env.checker='math_verify'")


def get(name: str):
  """The checker function `name` (one of CHECKERS)."""
  check(name)
  return {"exact": exact, "math_verify": math_verify}[name]


def answer_reward(checker):
  """A reward function `(prompts, completions, answers) -> list[float]`: 1.0 when the
  completion's <answer> span passes `checker` against the answer, else 0.0."""

  def reward(prompts, completions, answers):
    del prompts
    out = []
    for completion, gold in zip(completions, answers):
      found = extract_answer(completion)
      out.append(float(found is not None and checker(found, gold)))
    return out

  return reward


def exact_answer(prompts, completions, answers) -> list[float]:
  """1.0 when the <answer> span equals the answer by `exact` (a JSONL dataset's
  `env.rewards` may name it: rlpost.rewards.checkers:exact_answer)."""
  return answer_reward(exact)(prompts, completions, answers)


def math_verify_answer(prompts, completions, answers) -> list[float]:
  """1.0 when math-verify finds the <answer> span equal to the answer
  (rlpost.rewards.checkers:math_verify_answer)."""
  return answer_reward(math_verify)(prompts, completions, answers)
