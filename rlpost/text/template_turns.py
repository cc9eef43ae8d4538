"""A multi-turn episode laid out by the model's own chat template, token in / token out.

The scaffold "template" (`rlpost.text.scaffold`) renders with a `Layout` (a
`chat_template.ChatTemplate` and its extra variables, e.g. `date_string`):

  first prompt   the template's rendering of [system?, user(observation)] with the
                 environment's tools and the generation prompt (`template_ids`: control
                 tokens in what the model did not write stay text; one BOS)
  later turns    what the template writes from the end of an assistant turn's content to
                 the next generation prompt: the turn's close, the observation as a `user`
                 message or as `tool` messages (a native tool format's results), the
                 assistant's opening. Found by rendering a probe conversation
                 [user, assistant(PROBE[, the calls the results answer]), observation
                 messages] and cutting at the first end-of-turn text after PROBE (after the
                 assistant's opening where a template writes no content beside calls);
                 when the model closed its turn itself (its last sampled token is the
                 end-of-turn id) that close is not written again.

Nothing sampled is re-rendered: the episode trains on the sampled tokens. `history_ids`
re-renders a row's real conversation so a rollout can count the turns whose re-rendering
does not extend the tokens it holds (`template_ids.prefix_mismatch`, the rollout's
`template/prefix_mismatch`): Qwen3 drops earlier turns' `<think>` blocks, Gemma and Llama 3
strip contents, a model's tool-call JSON is re-rendered in the template's spacing.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from rlpost.text import chat_template
from rlpost.text import template_ids

PROBE = "\ue00aPROBE\ue00a"  # an assistant content no template writes itself


@dataclasses.dataclass(frozen=True)
class Layout:
  """A chat template and the variables every rendering gets (`(name, value)` pairs:
  `date_string`, `enable_thinking`, ...). Hashable: a static part of a rollout's config."""

  template: chat_template.ChatTemplate
  variables: tuple[tuple[str, Any], ...] = ()


def _ids(layout: Layout, tokenizer, messages, tools, add_generation_prompt: bool) -> list[int]:
  return template_ids.conversation_ids(
    layout.template,
    tokenizer,
    messages,
    tools=list(tools) or None,
    add_generation_prompt=add_generation_prompt,
    **dict(layout.variables),
  )


def opening(observation: str, system: str | None) -> list[dict]:
  """The messages of an episode's first prompt."""
  first = [{"role": "system", "content": system}] if system is not None else []
  return first + [{"role": "user", "content": observation}]


def first_prompt_ids(
  layout: Layout, tokenizer, observation: str, system: str | None, tools: Sequence = ()
) -> list[int]:
  """The first prompt's ids (BOS as the template writes it), ending where the model writes."""
  return _ids(layout, tokenizer, opening(observation, system), tools, True)


def _probe(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
  """[user, assistant(PROBE)]; the assistant holds a call per `tool` message answered."""
  assistant = {"role": "assistant", "content": PROBE}
  calls = [
    {
      "id": m.get("tool_call_id", ""),
      "type": "function",
      "function": {"name": m.get("name", ""), "arguments": {}},
    }
    for m in messages
    if m["role"] == "tool"
  ]
  if calls:
    assistant["tool_calls"] = calls
  return [{"role": "user", "content": "?"}, assistant]


def observation_ids(
  layout: Layout,
  tokenizer,
  messages: Sequence[Mapping[str, Any]],
  model_closed_turn: bool,
  tools: Sequence = (),
) -> list[int]:
  """The ids after a model turn: its close (unless `model_closed_turn`), the observation
  `messages` (a `user` message, or `tool` messages) and the assistant's opening."""
  marked, marked_tools = template_ids.marked_inputs(
    tokenizer, _probe(messages) + list(messages), tools
  )
  text = chat_template.render(
    layout.template,
    marked,
    tools=marked_tools or None,
    add_generation_prompt=True,
    **dict(layout.variables),
  )
  after = _content_end(layout, marked, marked_tools, text)
  close_text = {i: s for s, i in tokenizer.special_tokens.items()}[tokenizer.end_of_turn_id]
  start = text.find(close_text, after)
  if start < 0:
    raise chat_template.ChatTemplateError(
      f"chat template {layout.template.source}: writes no {close_text!r} (the tokenizer's "
      "end of turn) after an assistant message, so a turn's end cannot be laid out"
    )
  ids = template_ids.text_ids(tokenizer, text[start:], add_bos=False)
  return ids[1:] if model_closed_turn else ids


def _content_end(layout: Layout, marked, tools, text: str) -> int:
  """Where the probe assistant's content ends in `text`: after PROBE, or (a template that
  writes no content beside tool calls, e.g. Mistral's) after the assistant's opening."""
  if PROBE in text:
    return text.index(PROBE) + len(PROBE)
  opening = chat_template.render(
    layout.template,
    marked[:1],
    tools=tools or None,
    add_generation_prompt=True,
    **dict(layout.variables),
  )
  if not text.startswith(opening):
    raise chat_template.ChatTemplateError(
      f"chat template {layout.template.source}: an assistant turn's text cannot be found in "
      "its rendering (neither its content nor its opening)"
    )
  return len(opening)


def history_ids(
  layout: Layout, tokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence = ()
) -> list[int]:
  """A row's whole conversation re-rendered with the generation prompt (the check of
  `template_ids.prefix_mismatch`)."""
  return _ids(layout, tokenizer, messages, tools, True)


def decode_keeping(tokenizer, ids: Sequence[int], keep: frozenset[int]) -> str:
  """`ids` decoded with the control tokens in `keep` (ids) written as their text (a native
  tool format's markers, e.g. `[TOOL_CALLS]`, `<|python_tag|>`) and the others dropped."""
  if not keep:
    return tokenizer.decode(ids)
  texts = {i: s for s, i in tokenizer.special_tokens.items()}
  out, plain = [], []
  for i in ids:
    if i in keep:
      out += [tokenizer.decode(plain), texts[i]]
      plain = []
    else:
      plain.append(i)
  return "".join(out) + tokenizer.decode(plain)
