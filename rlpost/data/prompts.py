"""Prompt texts for RL on math problems: the chat template or plain-text few-shot.

The packaged Gemma 3 270M is the base model, which does not follow the chat
format by itself; a plain-text few-shot prompt shows it the tag format
instead, and ends with the opening reasoning tag so that the model starts
reasoning at once. Rewards see `completion_prefix(template) + completion`:
the text the answer format is defined on.
"""

from rlpost.text import scaffold
from rlpost.text import chat_formats
from rlpost.data.gsm8k import REASONING_START, SYSTEM_PROMPT, Problem, sft_completion

TEMPLATES = ("chat", "fewshot", "plain")
# Multi-token strings that end a completion (applied on the host, see rollout).
STOP_STRINGS = ("</answer>", "\nQuestion:")


def fewshot_prompt(problem: Problem, examples: list[Problem]) -> str:
  """System text, solved examples in the tag format, then the question."""
  shots = "".join(f"Question: {ex.question}\nAnswer: {sft_completion(ex)}\n\n" for ex in examples)
  return (
    f"{SYSTEM_PROMPT}\n\n{shots}Question: {problem.question}\nAnswer: "
    f"{completion_prefix('fewshot')}"
  )


def completion_prefix(template: str) -> str:
  """Text that the prompt already opened and that belongs to the scored answer."""
  return f"{REASONING_START}\n" if template == "fewshot" else ""


def prompt_text(
  problem: Problem,
  template: str,
  examples: list[Problem],
  system: str = SYSTEM_PROMPT,
  tokenizer=None,
) -> str:
  """The prompt as text, without BOS: what reward functions see. `system`: the chat
  template's system text ("": none, then the tokenizer's `default_system`); `tokenizer`:
  whose chat format lays a chat prompt out (None: Gemma's)."""
  if template == "chat":
    if tokenizer is None:
      return chat_formats.prompt_text("gemma", problem.question, system or None)
    return chat_formats.prompt_text(
      tokenizer.chat,
      problem.question,
      system or None,
      tokenizer.default_system,
      tokenizer.system_preamble,
    )
  if template == "fewshot":
    return fewshot_prompt(problem, examples)
  if template == "plain":
    return problem.question
  raise ValueError(f"data.template={template!r} is not one of {TEMPLATES}")


def prompt_observation(
  problem: Problem, template: str, examples: list[Problem], system: str = SYSTEM_PROMPT
) -> tuple[str, str, str | None]:
  """(scaffold, text, system): the prompt as environment text inside a
  `rlpost.text.scaffold`.

  chat: the question as the user turn and the system text (None when empty) as the
  scaffold's system (Gemma: the user turn's opening); fewshot / plain: the whole text
  after BOS, no system.
  """
  if template == "chat":
    return "chat", problem.question, system or None
  return "plain", prompt_text(problem, template, examples, system), None


def prompt_ids(problem: Problem, template: str, examples: list[Problem], tokenizer) -> list[int]:
  """The prompt's token ids (BOS first): the problem's text never becomes control ids.

  Equals `tokenizer.encode(prompt_text(...))` when the text holds no control-token string.
  """
  kind, text, system = prompt_observation(problem, template, examples)
  return scaffold.prompt_ids(tokenizer, kind, text, system)
