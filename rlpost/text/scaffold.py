"""Token ids around environment text: the chat scaffolding of a multi-turn stream.

Environment and tool text is DATA: it is encoded with `parse_special=False`,
so a `<end_of_turn>`, `<bos>` or `<start_of_turn>` written in an observation
stays plain text and never becomes a control-token id. Only the scaffolding
written here uses control ids.

Scaffolds (the `template` argument):
  chat   first prompt  [BOS][system turn]user turn{observation}, then the assistant's
                       opening, in the tokenizer's chat format (`chat_formats`: for Gemma
                       <bos><start_of_turn>user\n{observation}<end_of_turn>\n<start_of_turn>model\n)
         later turns   [turn close]{after close}user turn{observation}, the assistant's
                       opening (the turn close only when the model's turn did not end
                       with one, e.g. at a tool call's close tag; what follows a close,
                       Gemma's and ChatML's "\n", is scaffolding, so it is not trained on)
  plain  first prompt  [BOS]{observation};  later turns  \n{observation}
  template  the model's own chat template (`template_turns`, with a `Layout`): the first
         prompt and each observation as the template renders them, tool results as
         `tool` messages (`messages`), the environment's tool schemas in its tool section
The system text is the environment's (`Env.system`), else the tokenizer's default one
(the chat template's, e.g. SmolLM2's), if any.
"""

from rlpost.text import chat_formats
from rlpost.text import template_turns

SCAFFOLDS = ("chat", "plain", "template")


def text_ids(tokenizer, text: str) -> list[int]:
  """Ids of `text` as plain text: control-token strings in it stay text."""
  return list(tokenizer.encode(text, add_bos=False, parse_special=False))


def _check(template: str) -> None:
  if template not in SCAFFOLDS:
    raise ValueError(f"scaffold template={template!r}: use one of {SCAFFOLDS}")


def _layout(layout: template_turns.Layout | None) -> template_turns.Layout:
  if layout is None:
    raise ValueError("the template scaffold needs the chat template's Layout (none was given)")
  return layout


def _user_turn(tokenizer, observation: str) -> list[int]:
  """A user turn holding `observation`, then the assistant's opening."""
  return chat_formats.turn(tokenizer, "user", observation) + chat_formats.generation_prompt(
    tokenizer
  )


def prompt_ids(
  tokenizer,
  template: str,
  observation: str,
  system: str | None = None,
  layout: template_turns.Layout | None = None,
  tools=(),
) -> list[int]:
  """The first prompt of an episode (BOS first if the tokenizer uses one), ending where the
  model writes. `system` (None: the tokenizer's default, if any): chat, a system turn where
  the format has one, else the opening of the user turn; plain, the text's opening;
  template, the template's (`layout`, with the environment's `tools`)."""
  _check(template)
  if template == "template":
    return template_turns.first_prompt_ids(_layout(layout), tokenizer, observation, system, tools)
  if template == "plain":
    text = observation if system is None else f"{system}\n\n{observation}"
    return chat_formats.start(tokenizer) + text_ids(tokenizer, text)
  return chat_formats.opening_turns(
    tokenizer, observation, system
  ) + chat_formats.generation_prompt(tokenizer)


def observation_ids(
  tokenizer,
  template: str,
  observation: str,
  model_closed_turn: bool,
  layout: template_turns.Layout | None = None,
  messages=None,
  tools=(),
) -> list[int]:
  """Ids inserted after a model turn: the observation in its scaffolding.

  model_closed_turn: the turn's last sampled token was the turn close (`end_of_turn_id`).
  layout, messages, tools: the template scaffold's; `messages` (None: the observation as a
    `user` message) the observation as the template renders it (a turn's `tool` results).
  """
  _check(template)
  if template == "template":
    messages = messages or [{"role": "user", "content": observation}]
    return template_turns.observation_ids(
      _layout(layout), tokenizer, messages, model_closed_turn, tools
    )
  if template == "plain":
    return text_ids(tokenizer, f"\n{observation}")
  close = chat_formats.closing(tokenizer)
  return (close[1:] if model_closed_turn else close) + _user_turn(tokenizer, observation)
