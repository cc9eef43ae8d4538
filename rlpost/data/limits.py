"""Length limits where prompts enter a run: a prompt longer than the run can ever sample
from never reaches the device (a 10 MB line would otherwise be padded, prefilled and run
out of memory minutes later).

`on_too_long` says what happens to one: "skip" leaves it out and counts it (logged, with
where the first one came from), "error" stops with a DataError naming its file and line.
"""

import logging

from rlpost import errors
from rlpost.data import prompts as prompts_lib
from rlpost.data import tasks as tasks_lib
from rlpost.text import scaffold

ON_TOO_LONG = ("skip", "error")
# A prompt's tokens are at most its UTF-8 bytes (byte-level and SentencePiece pieces cover
# at least one byte each) plus BOS and the scaffold's few control tokens: prompts within
# this many bytes of the limit are counted exactly, the rest never need tokenizing.
_CONTROL_TOKENS = 16


def prompts_within(
  task: tasks_lib.Task, template: str, tokenizer, max_tokens: int, on_too_long: str
) -> tuple[tasks_lib.Task, int]:
  """(`task` without its prompts longer than `max_tokens` tokens as `template` renders
  them, how many were left out). on_too_long "error": DataError at the first one; a
  task left with no prompt is a DataError either way."""
  kept, dropped = [], []
  for i, problem in enumerate(task.problems):
    kind, text, system = prompts_lib.prompt_observation(
      problem, template, task.examples, task.system
    )
    if (
      len((system or "").encode("utf-8")) + len(text.encode("utf-8")) + _CONTROL_TOKENS > max_tokens
    ):
      length = len(scaffold.prompt_ids(tokenizer, kind, text, system))
      if length > max_tokens:
        if on_too_long == "error":
          raise errors.DataError(
            f"{task.where_of(i)}: the prompt is {length} tokens, above "
            f"env.max_prompt_tokens={max_tokens}; raise that limit, shorten the record, or "
            "set env.on_too_long='skip' to leave such prompts out"
          )
        dropped.append(i)
        continue
    kept.append(i)
  if not kept:
    raise errors.DataError(
      f"every one of the {len(task.problems)} prompts is longer than "
      f"env.max_prompt_tokens={max_tokens} tokens (first: {task.where_of(0)}); raise the limit"
    )
  if not dropped:
    return task, 0
  message = (
    f"env: left out {len(dropped)} of {len(task.problems)} prompts longer than "
    f"env.max_prompt_tokens={max_tokens} tokens (first: {task.where_of(dropped[0])}); "
    "env.on_too_long='error' stops at such a prompt instead"
  )
  logging.warning(message)
  print(message, flush=True)
  where = None if task.where is None else (lambda i: task.where(kept[i]))
  return task._replace(problems=[task.problems[i] for i in kept], where=where), len(dropped)
