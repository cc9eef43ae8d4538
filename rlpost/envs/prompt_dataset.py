"""A prompt dataset as an environment of the table: GSM8K, the arithmetic and digit tasks,
a JSONL file of prompts with reward functions (`env.name` gsm8k | arithmetic | digit |
jsonl). Each prompt is a one-turn episode (`rlpost.envs.single_turn`); tasks are drawn
from the dataset in the data cursor's order (`protocol.EnvTasks.pool`), each epoch
shuffled when `shuffle`.

The `env` block's fields (one config class per dataset, the same fields):
  data_dir: GSM8K's jsonl directory ("": the Hugging Face hub); template: fewshot | chat |
  plain (`data.prompts.TEMPLATES`); fewshot: solved examples in the prompt; shuffle: each
  epoch; digit: the digit task's target character; path / rewards: the jsonl dataset's
  prompt file and its reward functions (comma-separated MODULE:FUNCTION, each
  `(prompts, completions, answers) -> list[float]`); max_prompt_tokens: longer prompts
  never reach the device, on_too_long: what happens to them (`data.limits`); checker:
  exact | math_verify (`rewards.checkers`), how an answer is checked: GSM8K's and
  arithmetic's answer reward (check_numbers, 1.5) and answer_accuracy, a JSONL dataset's
  answer_accuracy flag (its <answer> span against the record's "answer").
"""

import dataclasses
import os
import unicodedata
from typing import ClassVar

from rlpost import rewards as rewards_lib
from rlpost.data import limits
from rlpost.data import prompts as prompts_lib
from rlpost.data import tasks as tasks_lib
from rlpost.envs import protocol
from rlpost.rewards import checkers
from rlpost.envs import single_turn


@dataclasses.dataclass(frozen=True)
class PromptsConfig:
  """The fields of every prompt dataset's `env` block (module docstring); `source` is the
  dataset, the environment's name."""

  source: ClassVar[str] = "gsm8k"
  data_dir: str = ""
  template: str = "fewshot"
  fewshot: int = 2
  shuffle: bool = True
  digit: str = "7"
  path: str = ""
  rewards: str = ""
  max_prompt_tokens: int = 2048
  on_too_long: str = "skip"
  checker: str = "exact"

  def __post_init__(self):
    checkers.check(self.checker)
    if self.max_prompt_tokens < 1:
      _bad("max_prompt_tokens", self.max_prompt_tokens, "must be >= 1 token")
    if self.on_too_long not in limits.ON_TOO_LONG:
      _bad("on_too_long", self.on_too_long, f"use one of {limits.ON_TOO_LONG}")
    if self.fewshot < 0:
      _bad("fewshot", self.fewshot, "must be >= 0 worked examples in the prompt")
    if self.template not in prompts_lib.TEMPLATES:
      _bad("template", self.template, f"use one of {tuple(prompts_lib.TEMPLATES)}")
    if self.source == "digit":
      tasks_lib.check_digit(self.digit)
    if self.source == "jsonl":
      self._check_prompt_file()
      return
    for field in ("path", "rewards"):
      if getattr(self, field):
        _bad(
          field,
          getattr(self, field),
          f"is read only with env.name='jsonl' (the dataset is {self.source!r}): set "
          f"env.name to 'jsonl' or clear {field}",
        )

  def _check_prompt_file(self):
    """The jsonl dataset's prompt file and reward functions, before any model loads."""
    if not self.path:
      _bad("path", "", "env.name='jsonl' needs a prompt file: --config.env.path=FILE")
    if not os.path.isfile(self.path):
      _bad("path", self.path, "no such file; check the path")
    try:
      rewards_lib.load_reward_fns(self.rewards)
    except ValueError as err:
      _bad("rewards", self.rewards, str(err))
    if self.template == "fewshot":
      _bad(
        "template",
        self.template,
        "shows GSM8K's solved examples and instructions, which a prompt file does not "
        "have: use 'plain' (the prompt as written) or 'chat' (the prompt as a user turn)",
      )


def _bad(field: str, value, fix: str):
  """The error `env_table.env_config` names as config.env.<field>."""
  raise ValueError(f"{field}={value!r}: {fix}")


def config_class(source: str) -> type:
  """The `env` block's config class of dataset `source` (one of `data.tasks.SOURCES`)."""
  return type(f"{source.capitalize()}Config", (PromptsConfig,), {"source": source})


def build(config: PromptsConfig, run: protocol.RunInfo) -> protocol.EnvTasks:
  """The dataset's training problems (those within `max_prompt_tokens` as the template
  renders them for `run.tokenizer`) as one-turn episodes; seed s is problem s."""
  task = with_checker(tasks_lib.load_task(config, "train", run.seed), config)
  task, _ = limits.prompts_within(
    task, config.template, run.tokenizer, config.max_prompt_tokens, config.on_too_long
  )
  return tasks(task, config.template, run.tokenizer, config.shuffle)


def with_checker(task: tasks_lib.Task, config: PromptsConfig) -> tasks_lib.Task:
  """`task` with its answers checked by `config.checker` (module docstring); exact leaves
  every task as it is (GSM8K's and arithmetic's own numeric check; a prompt file without
  an accuracy flag); math_verify adds a prompt file's `answer_accuracy`."""
  check = checkers.get(config.checker)
  accuracy = lambda completion, truth: (
    checkers.answer_reward(check)([""], [completion], [truth])[0] > 0
  )
  if config.source == "digit" or config.checker == "exact":
    return task  # a prompt file's metrics as before: its reward functions alone
  if config.source == "jsonl":
    return task._replace(accuracy_fns={"answer_accuracy": accuracy})
  numbers = lambda p, c, a: [1.5 * v for v in checkers.answer_reward(check)(p, c, a)]
  fns = {k: (numbers if k == "check_numbers" else fn) for k, fn in task.reward_fns.items()}
  return task._replace(
    reward_fns=fns, accuracy_fns={**task.accuracy_fns, "answer_accuracy": accuracy}
  )


def tasks(
  task: tasks_lib.Task, template: str, tokenizer, shuffle: bool = False
) -> protocol.EnvTasks:
  """A loaded task (`data.tasks.Task`) as one-turn episodes under a data template (fewshot |
  chat | plain) in the tokenizer's chat format; seed s is problem s of `task.problems`."""
  env, scaffold_kind = single_turn.make_env(task, template, tokenizer)
  problems = task.problems
  pick = lambda seeds: [problems[s] for s in seeds]
  return protocol.EnvTasks(
    env,
    pick,
    pick,
    pool=len(problems),
    shuffle=shuffle,
    scaffold=scaffold_kind,
    report=protocol.CompletionReport(tuple(task.reward_fns), tuple(task.accuracy_fns)),
    content_key=lambda problem, seed: normalized_question(problem.question),
  )


def normalized_question(text: str) -> str:
  """A question as content, for finding the same problem twice: Unicode NFKC, lower case,
  every run of whitespace one space, no leading or trailing space. Punctuation and digits
  stay ("3 apples" and "30 apples" differ)."""
  return " ".join(unicodedata.normalize("NFKC", text).lower().split())
