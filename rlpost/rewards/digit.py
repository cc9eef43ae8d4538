"""A toy task for tiny random models: "answer with the digit D".

Reward = fraction of completion characters equal to D (dense, in [0, 1]), so a
randomly initialised model starts near 1/vocab and GRPO has signal at once.
"""
from rlpost.data.gsm8k import Problem


def problems(digit: str, count: int = 64) -> list[Problem]:
  """`count` distinct prompts asking for `digit`."""
  return [Problem(question=f"#{i} say {digit}: ", answer=digit, final=digit) for i in range(count)]


def digit_fraction(prompts, completions, answers) -> list[float]:
  del prompts
  return [sum(ch == a for ch in c) / len(c) if c else 0.0 for c, a in zip(completions, answers)]


REWARD_FNS = {"digit_fraction": digit_fraction}
