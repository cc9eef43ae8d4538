"""Token ids around environment text: the chat scaffolding of a multi-turn stream.

Environment and tool text is DATA: it is encoded with `parse_special=False`,
so a `<end_of_turn>`, `<bos>` or `<start_of_turn>` written in an observation
stays plain text and never becomes a control-token id. Only the scaffolding
written here uses control ids.

Scaffolds (the `template` argument):
  chat   first prompt  <bos><start_of_turn>user\\n{observation}<end_of_turn>\\n<start_of_turn>model\\n
         later turns   [<end_of_turn>]\\n<start_of_turn>user\\n{observation}<end_of_turn>\\n<start_of_turn>model\\n
         (the leading <end_of_turn> only when the model's turn did not end with
         one, e.g. at a tool call's close tag; the "\\n" after the model's own
         <end_of_turn> is scaffolding, so it is not trained on)
  plain  first prompt  <bos>{observation};  later turns  \n{observation}
"""

SCAFFOLDS = ("chat", "plain")


def text_ids(tokenizer, text: str) -> list[int]:
  """Ids of `text` as plain text: control-token strings in it stay text."""
  return list(tokenizer.encode(text, add_bos=False, parse_special=False))


def _check(template: str) -> None:
  if template not in SCAFFOLDS:
    raise ValueError(f"scaffold template={template!r}: use one of {SCAFFOLDS}")


def _user_turn(tokenizer, observation: str) -> list[int]:
  """<start_of_turn>user\\n{observation}<end_of_turn>\\n<start_of_turn>model\\n."""
  sot, eot = tokenizer.start_of_turn_id, tokenizer.end_of_turn_id
  return (
    [sot]
    + text_ids(tokenizer, f"user\n{observation}")
    + [eot]
    + text_ids(tokenizer, "\n")
    + [sot]
    + text_ids(tokenizer, "model\n")
  )


def prompt_ids(tokenizer, template: str, observation: str) -> list[int]:
  """The first prompt of an episode (BOS first), ending where the model writes."""
  _check(template)
  if template == "plain":
    return [tokenizer.bos_id] + text_ids(tokenizer, observation)
  return [tokenizer.bos_id] + _user_turn(tokenizer, observation)


def observation_ids(
  tokenizer, template: str, observation: str, model_closed_turn: bool
) -> list[int]:
  """Ids inserted after a model turn: the observation in its scaffolding.

  model_closed_turn: the turn's last sampled token was <end_of_turn>.
  """
  _check(template)
  if template == "plain":
    return text_ids(tokenizer, f"\n{observation}")
  close = [] if model_closed_turn else [tokenizer.end_of_turn_id]
  return close + text_ids(tokenizer, "\n") + _user_turn(tokenizer, observation)
