"""RL tasks: (training problems, reward functions, accuracy functions, few-shot examples)."""

import os
from typing import Callable, NamedTuple

from rlpost import errors
from rlpost import rewards
from rlpost.data import arithmetic
from rlpost.data import gsm8k
from rlpost.data import jsonl
from rlpost.rewards import digit as digit_rewards
from rlpost.rewards import gsm8k as gsm8k_rewards

SOURCES = ("gsm8k", "arithmetic", "digit", "jsonl")


class Task(NamedTuple):
  problems: list  # list[gsm8k.Problem] to train on
  reward_fns: dict  # name -> (prompts, completions, answers) -> list[float]
  accuracy_fns: dict  # metric name -> (completion, answer) -> bool
  examples: list  # few-shot exemplars (never trained on)
  system: str = gsm8k.SYSTEM_PROMPT  # the chat template's system text ("": none)
  where: Callable[[int], str] | None = None  # problem i -> "path:line" (None: "problem i")

  def where_of(self, i: int) -> str:
    """Where problem i came from, for an error that names it."""
    return self.where(i) if self.where is not None else f"problem {i}"


MATH_ACCURACY = {
  "answer_accuracy": gsm8k_rewards.is_correct,
  "format_accuracy": gsm8k_rewards.has_format,
}


def check_digit(digit) -> None:
  """`env.digit` of the digit task: one visible character (its count is the reward);
  ValueError "digit=...: fix" (the env table names it config.env.digit)."""
  if not (isinstance(digit, str) and len(digit) == 1 and not digit.isspace()):
    raise ValueError(
      f"digit={digit!r}: must be one visible character (e.g. '7'); the reward "
      "counts its occurrences in each completion"
    )


def load_prompts(path: str) -> list[gsm8k.Problem]:
  """The prompts of a JSONL file, one `{"prompt": str, "answer": str | number}` object per
  line ("answer" optional, default ""; it is what reward functions get as the answer):
  Problem(question=prompt, answer=answer, final=answer). Errors name `path:line`."""
  problems = []
  for where, record in jsonl.read_jsonl(path):
    prompt = jsonl.require_str(record, "prompt", where)
    answer = record.get("answer", "")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
      answer = str(answer)
    if not isinstance(answer, str):
      raise errors.DataError(
        f"{where}: field 'answer' must be a string or a number, got "
        f"{type(answer).__name__} {str(answer)[:60]!r}"
      )
    problems.append(gsm8k.Problem(question=prompt, answer=answer, final=answer))
  if not problems:
    raise errors.DataError(f"{path}: holds no prompts; write one JSON object per line")
  return problems


def load_task(data_cfg, split: str = "train", seed: int = 0) -> Task:
  """Builds the task named by `data_cfg.source` (a prompt dataset's config,
  `rlpost.envs.prompt_dataset`): a JSONL file's prompts (`path`) are scored by `rewards`
  and have no accuracy flags."""
  source = data_cfg.source
  if source == "jsonl":
    path = data_cfg.path
    fns = rewards.load_reward_fns(data_cfg.rewards)
    return Task(load_prompts(path), fns, {}, [], "", lambda i: jsonl.where_of(path, i))
  if source == "digit":
    check_digit(data_cfg.digit)
    return Task(
      digit_rewards.problems(data_cfg.digit),
      digit_rewards.REWARD_FNS,
      {"answer_accuracy": lambda c, a: c.strip().startswith(a)},
      [],
    )
  if source == "gsm8k":
    problems = gsm8k.load_gsm8k(split, data_cfg.data_dir)
    shots = gsm8k.load_gsm8k("train", data_cfg.data_dir)[: data_cfg.fewshot]
  elif source == "arithmetic":
    problems = arithmetic.generate_problems(2000, seed + (split == "test"))
    shots = arithmetic.generate_problems(data_cfg.fewshot, seed + 7)
  else:
    raise ValueError(f"source={source!r} is not one of {SOURCES}")
  skipped = len(shots) if split == "train" and source == "gsm8k" else 0
  where = None
  if source == "gsm8k":
    file = os.path.join(data_cfg.data_dir, f"{split}.jsonl")
    hub = f"{gsm8k.HF_DATASET[0]}[{split}] row"
    where = lambda i: (
      jsonl.where_of(file, i + skipped) if data_cfg.data_dir else f"{hub} {i + skipped}"
    )
  problems = problems[skipped:]
  return Task(problems, gsm8k_rewards.REWARD_FNS, MATH_ACCURACY, shots, where=where)
