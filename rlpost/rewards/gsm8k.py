"""GSM8K rewards for the reasoning/answer tag format (see rlpost.data.gsm8k).

Each function is `(prompts, completions, answers) -> list[float]`.
"""

import re

from rlpost.data.gsm8k import ANSWER_END, ANSWER_START, REASONING_END, REASONING_START

_FULL_FORMAT = re.compile(
  rf"^\s*{re.escape(REASONING_START)}.+?{re.escape(REASONING_END)}.*?"
  rf"{re.escape(ANSWER_START)}(.+?){re.escape(ANSWER_END)}\s*$",
  re.DOTALL,
)
_ANSWER = re.compile(rf"{re.escape(ANSWER_START)}(.+?){re.escape(ANSWER_END)}", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def extract_answer(completion: str) -> str | None:
  """Text inside the first <answer>...</answer> pair, or None."""
  match = _ANSWER.search(completion)
  return match.group(1) if match else None


def _to_number(text: str) -> float | None:
  try:
    return float(text.strip().replace(",", "").replace("$", "").rstrip("."))
  except ValueError:
    return None


_TAGS = (REASONING_START, REASONING_END, ANSWER_START, ANSWER_END)


def _exact_format(completion: str) -> bool:
  """Exactly one reasoning block, then exactly one answer block, nothing else around them."""
  return bool(_FULL_FORMAT.search(completion)) and all(completion.count(t) == 1 for t in _TAGS)


def match_format_exactly(prompts, completions, answers) -> list[float]:
  """3.0 when the completion is exactly one reasoning block, then one answer block (else 0)."""
  del prompts, answers
  return [3.0 if _exact_format(c) else 0.0 for c in completions]


def match_format_approximately(prompts, completions, answers) -> list[float]:
  """+0.5 per tag that appears exactly once, -0.5 per tag missing or repeated."""
  del prompts, answers
  return [sum(0.5 if c.count(t) == 1 else -0.5 for t in _TAGS) for c in completions]


def check_answer(prompts, completions, answers) -> list[float]:
  """Answer-tag text vs the truth.

  3.0 exact; 1.5 equal after stripping whitespace; 0.5 within 10% (ratio);
  0.25 within 20%; -1.0 numeric but wrong; 0.0 no answer tag or not a number.
  """
  del prompts
  scores = []
  for completion, truth in zip(completions, answers):
    guess = extract_answer(completion)
    if guess is None:
      scores.append(0.0)
    elif guess == truth:
      scores.append(3.0)
    elif guess.strip() == truth.strip():
      scores.append(1.5)
    else:
      g, t = _to_number(guess), _to_number(truth)
      if g is None or t is None:
        scores.append(0.0)
      elif t != 0 and 0.9 <= g / t <= 1.1:
        scores.append(0.5)
      elif t != 0 and 0.8 <= g / t <= 1.2:
        scores.append(0.25)
      else:
        scores.append(-1.0)
  return scores


def check_numbers(prompts, completions, answers) -> list[float]:
  """1.5 when the first number inside the answer tags equals the truth, else 0."""
  del prompts
  scores = []
  for completion, truth in zip(completions, answers):
    guess = extract_answer(completion)
    found = _NUMBER.search(guess) if guess is not None else None
    g, t = (_to_number(found.group(0)) if found else None), _to_number(truth)
    scores.append(1.5 if g is not None and t is not None and g == t else 0.0)
  return scores


def is_correct(completion: str, truth: str) -> bool:
  """Answer accuracy: the answer-tag number equals the truth."""
  return check_numbers([""], [completion], [truth])[0] > 0


def has_format(completion: str, truth: str = "") -> bool:
  """Format accuracy: the full reasoning/answer tag format (`truth` unused)."""
  del truth
  return match_format_exactly([""], [completion], [""])[0] > 0


REWARD_FNS = {
  "match_format_exactly": match_format_exactly,
  "match_format_approximately": match_format_approximately,
  "check_answer": check_answer,
  "check_numbers": check_numbers,
}
