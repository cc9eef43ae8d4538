"""A toy task for tiny random models: "answer with the digit D".

Reward = number of characters equal to D in the completion (dense: a random
model starts near max_new_tokens / vocab, so GRPO has signal at once; integer
scale, so estimators without std normalisation (Dr.GRPO) see O(1) advantages).
"""

from rlpost.data.gsm8k import Problem


def problems(digit: str, count: int = 64) -> list[Problem]:
  """`count` distinct prompts asking for `digit`."""
  return [Problem(question=f"#{i} say {digit}: ", answer=digit, final=digit) for i in range(count)]


def digit_count(prompts, completions, answers) -> list[float]:
  del prompts
  return [float(c.count(a)) for c, a in zip(completions, answers)]


REWARD_FNS = {"digit_count": digit_count}
