"""The template scaffold's pieces of an RL run: the model's chat template and the tool format.

`rollout.template=template` lays episodes out with the model's own chat template
(`rlpost.text.template_turns`): the model file's (`Tokenizer.chat_template`) or the file
`model.chat_template` names, rendered with `model.date_string`. `tools.format` picks the
call syntax: `library` (any scaffold), `native` (the one the template writes:
`tool_formats.detect`; the library's, with a warning saying so, when the template has no
tool section) or a format by name.
"""

from absl import logging

from rlpost.recipes import common
from rlpost.text import chat_template
from rlpost.text import template_turns
from rlpost.text import tool_formats


def layout(c, tokenizer) -> template_turns.Layout | None:
  """The template scaffold's Layout (None: the run uses another scaffold)."""
  if c.rollout.template != "template":
    return None
  template = chat_template.for_tokenizer(tokenizer, c.model.chat_template)
  if template is None:
    common.fail(
      "rollout.template",
      "template",
      "the model file carries no chat template (e.g. the Gemma 3 270M base GGUF): give one "
      "with --config.model.chat_template=FILE (a .jinja file or a Hugging Face directory), "
      "or use rollout.template=chat (the family's hand-written layout)",
    )
  return template_turns.Layout(template, (("date_string", c.model.date_string),))


def tool_format(c, chat: template_turns.Layout | None) -> str:
  """The tool format of the run's calls (`tools.format` resolved)."""
  name = c.tools.format
  if name != "native":
    return name
  if chat is None:
    common.fail(
      "tools.format", name, "reads the model's chat template: set rollout.template=template"
    )
  try:
    name = tool_formats.detect(chat.template.text)
  except ValueError as e:
    common.fail("tools.format", "native", f"{chat.template.source}: {e}")
  if name == "library" and c.tools.enabled:
    logging.warning(
      "config.tools.format='native': chat template %s has no tool section; the library's "
      "own syntax (<tool>NAME: ARGUMENT</tool>, results as <result>...</result>) is used",
      chat.template.source,
    )
  return name


def markers(name: str, tokenizer) -> tuple[str, ...]:
  """The control tokens of format `name` the vocabulary has: kept in the decoded text."""
  return tuple(t for t in tool_formats.MARKERS[name] if t in tokenizer.special_tokens)
