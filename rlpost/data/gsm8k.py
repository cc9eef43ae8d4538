"""GSM8K problems: JSONL / Hugging Face loading, and the reasoning/answer format.

GSM8K rows are `{"question": str, "answer": str}` where the answer is a worked
solution whose last line is `#### <number>`. The solution lines carry
calculator annotations such as `48/2 = <<48/2=24>>24`.

The tag constants and `SYSTEM_PROMPT` define the completion format shared by
SFT targets (`sft_completion`) and the GRPO rewards (`rlpost.rewards.gsm8k`):

  <reasoning>
  ...
  </reasoning>
  <answer>72</answer>
"""

import os
import re
from typing import Any, NamedTuple

from rlpost import errors
from rlpost.data.jsonl import read_jsonl, require_str

REASONING_START = "<reasoning>"
REASONING_END = "</reasoning>"
ANSWER_START = "<answer>"
ANSWER_END = "</answer>"
SYSTEM_PROMPT = (
  f"Solve the math problem. Think it through step by step between {REASONING_START} "
  f"and {REASONING_END}, then give only the final number, without units or words, "
  f"between {ANSWER_START} and {ANSWER_END}. Use this format:\n"
  f"{REASONING_START}\n...\n{REASONING_END}\n{ANSWER_START}...{ANSWER_END}"
)

SPLITS = ("train", "test")
HF_DATASET = ("openai/gsm8k", "main")

_FINAL_MARK = "####"
_CALCULATOR = re.compile(r"<<[^<>]*>>")


class Problem(NamedTuple):
  """One word problem.

  question: the problem text.
  answer: the worked solution text, ending with `#### <final>`.
  final: the number after `#### `, commas removed (e.g. "1234", "-3", "0.5").
  """

  question: str
  answer: str
  final: str


def problem_from_record(record: dict[str, Any], where: str) -> Problem:
  """Problem from a `{"question", "answer"}` dict; ValueError naming `where` if malformed."""
  question = require_str(record, "question", where)
  answer = require_str(record, "answer", where)
  if _FINAL_MARK not in answer:
    raise errors.DataError(
      f"{where}: field 'answer' has no '{_FINAL_MARK} <number>' final line "
      f"(answer ends {answer[-60:]!r}); GSM8K answers end with '#### 72'"
    )
  final = answer.rsplit(_FINAL_MARK, 1)[1].strip().replace(",", "")
  if not final:
    raise errors.DataError(
      f"{where}: nothing after '{_FINAL_MARK}' in field 'answer' "
      f"(answer ends {answer[-60:]!r}); expected e.g. '#### 72'"
    )
  try:
    float(final)
  except ValueError:
    raise errors.DataError(
      f"{where}: field 'answer' ends '{_FINAL_MARK} {final[:40]}', not a number; the "
      f"answer rewards and accuracy compare numbers, so write only the number after "
      f"'{_FINAL_MARK}' (e.g. '#### 72', '#### -3.5', '#### 1,234')"
    ) from None
  return Problem(question=question, answer=answer, final=final)


def load_jsonl_problems(path: str | os.PathLike) -> list[Problem]:
  """Reads GSM8K-format JSONL; a malformed line raises ValueError naming `path:line`."""
  return [problem_from_record(obj, where) for where, obj in read_jsonl(path)]


def load_gsm8k(split: str, data_dir: str = "") -> list[Problem]:
  """GSM8K `split` ("train": 7,473 problems, "test": 1,319).

  Args:
    split: "train" or "test".
    data_dir: directory holding `{split}.jsonl`; when empty, the Hugging Face
      dataset `openai/gsm8k` (config "main") is loaded with `datasets`
      (imported here, so it is only needed on that path).

  Returns:
    The problems, in file order.
  """
  if split not in SPLITS:
    raise ValueError(f"GSM8K split {split!r} does not exist; use one of {SPLITS}")
  if data_dir:
    path = os.path.join(data_dir, f"{split}.jsonl")
    if not os.path.isfile(path):
      raise FileNotFoundError(
        f"data.data_dir={data_dir!r}: {path} not found; --config.data.data_dir must name a "
        "directory holding train.jsonl and test.jsonl (e.g. ../shared/data/gsm8k), or be '' "
        "to load GSM8K from the Hugging Face hub"
      )
    return load_jsonl_problems(path)
  fix = (
    "or set data_dir (config.data.data_dir / --config.data.data_dir=...) to a "
    "directory holding train.jsonl and test.jsonl"
  )
  try:
    import datasets  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise errors.DataError(
      "Loading GSM8K from the Hugging Face hub needs the `datasets` package: "
      f"pip install datasets, {fix}"
    ) from e
  try:
    rows = datasets.load_dataset(*HF_DATASET)[split]
  except Exception as e:  # network, hub and cache errors all surface here
    raise errors.DataError(
      f"Could not load {HF_DATASET[0]!r} ({HF_DATASET[1]!r}) from the Hugging "
      f"Face hub ({type(e).__name__}: {e}); check the connection, {fix}"
    ) from e
  return [
    problem_from_record(dict(row), f"{HF_DATASET[0]}[{split}] row {i}")
    for i, row in enumerate(rows)
  ]


def solution_steps(answer: str) -> list[str]:
  """Solution lines before `####`, calculator annotations removed, blank lines dropped."""
  reasoning = answer.rsplit(_FINAL_MARK, 1)[0]
  lines = (_CALCULATOR.sub("", line).strip() for line in reasoning.splitlines())
  return [line for line in lines if line]


def sft_completion(problem: Problem) -> str:
  """The worked answer rewritten in the reasoning/answer tag format (module docstring)."""
  steps = "\n".join(solution_steps(problem.answer))
  return f"{REASONING_START}\n{steps}\n{REASONING_END}\n{ANSWER_START}{problem.final}{ANSWER_END}"
