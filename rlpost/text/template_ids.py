"""Chat-template text as token ids, and the check that a re-rendered conversation extends
the tokens that were sampled.

`text_ids`: the control tokens the rendered text holds (`Tokenizer.special_tokens`) become
their ids; the text between two of them is encoded as one piece of plain text
(`parse_special=False`), as `chat_formats` lays turns out. `conversation_ids` renders with
the control-token text inside the inputs the model did not write (system, user and tool
messages, tool schemas) marked first, so it stays text, as in `chat_formats` (transformers'
`sanitize_control_tokens` does the same); what an assistant message holds is the model's own
output and keeps its control tokens as ids. The marks are two private-use characters
(U+E000, U+E001), removed from the inputs beforehand; a template that cuts a marked token
apart (a `split`) leaves lone marks, which are dropped.

BOS: a template that writes BOS (Gemma, Llama 3) keeps its one; one that does not gets it
prepended only when the tokenizer uses BOS (`Tokenizer.uses_bos`); never two.

Token in, token out: a multi-turn episode trains on the tokens that were sampled, never on a
re-rendering. A template may render history differently from what was sampled (Qwen3 drops
earlier turns' `<think>` blocks; Gemma and Llama 3 strip contents): `prefix_mismatch` says
when the re-rendered prompt of turn k+1 does not extend turn k's tokens (the rollout counts it
as `template/prefix_mismatch`); the episode still keeps its sampled tokens.
"""

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlpost.text import chat_template

OPEN, CLOSE = "\ue000", "\ue001"


@functools.lru_cache(maxsize=16)
def _patterns(tokenizer) -> tuple[re.Pattern, re.Pattern]:
  """(any control-token text, a marked control token | a control token | a lone mark)."""
  texts = sorted(tokenizer.special_tokens, key=len, reverse=True)
  control = "|".join(map(re.escape, texts)) or "(?!)"
  marked = re.compile(f"{OPEN}({control}){CLOSE}|({control})|[{OPEN}{CLOSE}]")
  return re.compile(control), marked


def _mark(value, control: re.Pattern):
  """`value` (a string, or lists / dicts of them) with control-token text wrapped in marks."""
  if isinstance(value, str):
    value = value.replace(OPEN, "").replace(CLOSE, "")
    return control.sub(lambda m: f"{OPEN}{m.group()}{CLOSE}", value)
  if isinstance(value, Mapping):
    return {k: _mark(v, control) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_mark(v, control) for v in value]
  return value


def text_ids(tokenizer, text: str, add_bos: bool = True) -> list[int]:
  """Ids of rendered chat text: control tokens as ids (marked ones, and every span between
  two unmarked ones, as plain text); BOS as the module doc says (`add_bos` False: a piece
  after the start of a conversation, no BOS added)."""
  _, pattern = _patterns(tokenizer)
  ids, plain, pos = [], [], 0
  for match in pattern.finditer(text):
    plain.append(text[pos : match.start()])
    pos = match.end()
    if match.group(1) is not None:
      plain.append(match.group(1))
    elif match.group(2) is not None:
      ids += tokenizer.encode("".join(plain), add_bos=False, parse_special=False)
      ids.append(tokenizer.special_tokens[match.group(2)])
      plain = []
  plain.append(text[pos:])
  ids += tokenizer.encode("".join(plain), add_bos=False, parse_special=False)
  if add_bos and tokenizer.uses_bos and ids[:1] != [tokenizer.bos_id]:
    ids.insert(0, tokenizer.bos_id)
  return ids


def marked_inputs(tokenizer, messages: Sequence[Mapping[str, Any]], tools=None):
  """(messages, tools) with control-token text marked outside assistant messages."""
  control, _ = _patterns(tokenizer)
  marked = [m if m.get("role") == "assistant" else _mark(m, control) for m in messages]
  return marked, (_mark(tools, control) if tools else tools)


def conversation_ids(
  template: chat_template.ChatTemplate,
  tokenizer,
  messages: Sequence[Mapping[str, Any]],
  *,
  tools: Sequence[Mapping[str, Any]] | None = None,
  add_generation_prompt: bool = False,
  **kwargs,
) -> list[int]:
  """The conversation's ids as the template lays it out (`chat_template.render`'s
  arguments), control-token text in what the model did not write kept as text."""
  chat_template.check_conversation(messages, tools)
  messages, tools = marked_inputs(tokenizer, messages, tools)
  text = chat_template.render(
    template, messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
  )
  return text_ids(tokenizer, text)


def prefix_mismatch(previous_ids: Sequence[int], rerendered_ids: Sequence[int]) -> bool:
  """True when `rerendered_ids` (the re-rendered conversation of turn k+1) does not start
  with `previous_ids` (turn k's prompt and sampled tokens): the template rewrote history."""
  previous, rerendered = list(previous_ids), list(rerendered_ids)
  return rerendered[: len(previous)] != previous
