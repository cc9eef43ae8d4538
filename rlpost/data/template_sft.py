"""SFT examples laid out by the model's own chat template, loss on the assistant spans only.

An assistant message's span is what the template writes for it: its content and tool calls
in the template's own format, through its end-of-turn token (`Tokenizer.end_of_turn_id`'s
text); never the system, user or tool messages, the tool schemas, or the scaffolding
(role headers, the generation prompt, what follows the end of turn).

Spans come from rendering prefixes (`chat_template.render`, the run's `Layout` variables):
the whole conversation is rendered once (T); for assistant message i, its start is the end
of messages[:i] rendered with the generation prompt (P_i), and its end the last end-of-turn
text of messages[:i+1] rendered alone (F_i). A template that re-renders history does not
make F_i a prefix of T (Qwen3 writes an empty `<think>` block for the last assistant turn
only, and drops earlier turns' reasoning): the span is then located in T, from P_i's end to
the first end-of-turn text after it; the tokens trained on are T's, the final rendering, as
transformers' assistant mask and TRL take them. Where P_i is not a prefix of T (the template
writes the conversation before message i differently once later messages follow, e.g.
Mistral's tool list goes in the last user message), the span is what F_i writes after P_i,
found in T after the longest common prefix of T and P_i and after the previous span (an
end-of-turn text in what the model did not write is marked, so only a template's close can
match). Else (F_i does not extend P_i either: Mistral-Nemo writes the system text into the
last user message only when it ends the conversation; the Hermes template closes a run of
tool messages by looking ahead) the whole conversation is rendered again with message i's
content replaced by a probe text: the span starts where the two renderings part and ends
at the first end-of-turn text after. An assistant message found no way (a template that
writes no content beside tool calls, as Mistral's, in such a conversation) is a
`ChatTemplateError` naming the template and the message index; split the conversation into
one record per assistant turn.

Ids: T cut at the span boundaries, each piece encoded as `template_ids.text_ids` encodes
rendered text (control tokens as ids; control-token text in system, user and tool messages
and the tool schemas marked, so it stays text); the pieces are what a rollout holds, the
prompt through the generation prompt, then what the model writes.
"""

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlpost.text import chat_template, template_ids, template_turns


def _end_of_turn(tokenizer) -> str:
  return {i: s for s, i in tokenizer.special_tokens.items()}[tokenizer.end_of_turn_id]


def _span(text: str, prompt: str, turn: str, eot: str, floor: int) -> tuple[int, int] | None:
  """The [start, end) of an assistant message in the whole rendering `text`, from `prompt`
  (the messages before it and the generation prompt) and `turn` (the messages through it),
  at or after `floor` (the previous span's end); None where it cannot be found."""
  if text.startswith(prompt) and len(prompt) >= floor:
    start = len(prompt)
    end = turn.rfind(eot) if text.startswith(turn) else text.find(eot, start)
    return (start, end + len(eot)) if end >= start else None
  close = turn.rfind(eot)
  if not turn.startswith(prompt) or close < len(prompt):
    return None
  written = turn[len(prompt) : close + len(eot)]
  start = text.find(written, max(floor, len(os.path.commonprefix([text, prompt]))))
  return (start, start + len(written)) if start >= 0 else None


def _probed_span(text: str, probed: str, eot: str, floor: int) -> tuple[int, int] | None:
  """The span of an assistant message from `probed`, the whole conversation rendered with
  that message's content replaced by PROBE: it starts where the two renderings part, ends
  at the first end-of-turn text after; None where they do not part after `floor`."""
  start = len(os.path.commonprefix([text, probed]))
  end = text.find(eot, start)
  return (start, end + len(eot)) if floor <= start < len(text) and end >= 0 else None


def assistant_spans(
  layout: template_turns.Layout,
  tokenizer,
  messages: Sequence[Mapping[str, Any]],
  tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[str, list[tuple[int, int]]]:
  """(the conversation's rendering T, the [start, end) character span in T of each assistant
  message, in order); the module doc says how. Text with control-token marks (U+E000/E001)
  around what the model did not write, as `template_ids.text_ids` reads it."""
  marked, marked_tools = template_ids.marked_inputs(tokenizer, messages, tools)
  source, eot = layout.template.source, _end_of_turn(tokenizer)

  def render(k: int, generation: bool, conversation=marked) -> str:
    return chat_template.render(
      layout.template,
      conversation[:k],
      tools=marked_tools or None,
      add_generation_prompt=generation,
      **dict(layout.variables),
    )

  text, spans = render(len(marked), False), []
  for i, message in enumerate(messages):
    if message["role"] != "assistant":
      continue
    floor = spans[-1][1] if spans else 0
    span = _span(text, render(i, True), render(i + 1, False), eot, floor)
    if span is None:
      probe = [*marked[:i], {**marked[i], "content": template_turns.PROBE}, *marked[i + 1 :]]
      span = _probed_span(text, render(len(marked), False, probe), eot, floor)
    if span is None:
      raise chat_template.ChatTemplateError(
        f"chat template {source}: messages[{i}] (assistant) cannot be found in the whole "
        f"conversation's rendering (no {eot!r}, the tokenizer's end of turn, after it, or "
        "the template writes it differently once later messages follow and writes no "
        "content beside its tool calls): split the conversation into one record per "
        "assistant turn"
      )
    spans.append(span)
  return text, spans


def ids_and_mask(tokenizer, text: str, spans: Sequence[tuple[int, int]]) -> tuple[list, list]:
  """(ids, loss mask 0/1) of rendered `text`: 1 exactly on the ids of the `spans`."""
  ids, mask, pos = [], [], 0
  for start, end in [*spans, (len(text), len(text))]:
    for piece, flag in ((text[pos:start], 0), (text[start:end], 1)):
      new = template_ids.text_ids(tokenizer, piece, add_bos=pos == 0 and flag == 0)
      ids, mask = ids + new, mask + [flag] * len(new)
    pos = end
  return ids, mask


def tokenize(
  record: Mapping[str, Any], tokenizer, layout: template_turns.Layout, max_len: int
) -> tuple[np.ndarray, np.ndarray]:
  """Tokens [T] int32 and loss_mask [T] bool (T <= max_len) of a validated SFT record
  (`{"messages"[, "tools"]}`, `chat.sft_record`) laid out by `layout`'s template.

  Right truncation as `chat.tokenize_sft`: a record whose first assistant token lies at or
  beyond `max_len` raises ValueError."""
  text, spans = assistant_spans(layout, tokenizer, record["messages"], record.get("tools"))
  ids, mask = ids_and_mask(tokenizer, text, spans)
  first = mask.index(1) if 1 in mask else len(mask)
  if first >= max_len:
    raise ValueError(
      f"SFT record's prompt is {first} tokens, so no assistant token fits in "
      f"max_len={max_len}; raise max_len or drop the record "
      f"(it starts {record['messages'][0]['content']!r:.80})"
    )
  return np.asarray(ids[:max_len], np.int32), np.asarray(mask[:max_len], bool)
