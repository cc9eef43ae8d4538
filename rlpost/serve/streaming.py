"""A choice's text while it is decoded: what a stream may send now, what it holds back.

Text is held back from the first place a stop string or a tool call could begin (a whole
occurrence, or an end of the text that starts one) and while its last character is
incomplete (U+FFFD); when the choice ends, its final text (`finish.Choice`: stop strings
cut, tool calls parsed) flushes the rest. A chunk's `token_ids` are the tokens whose
text has been sent; the ids held back go with the flush, so a stream's ids and text add
up to the whole response's.
"""

import dataclasses

from rlpost.serve import chat

INCOMPLETE = "\ufffd"


@dataclasses.dataclass
class Sent:
  """What a choice's stream has sent: its text and how many of its token ids."""

  text: str = ""
  ids: int = 0


def holds(gen) -> tuple[str, ...]:
  """The strings whose beginnings are held back: stop strings, and with tools the
  tool-call close and the format's call openers."""
  openers = chat.call_openers(gen.tools, gen.chat) if gen.tools else ()
  return tuple(gen.stop) + tuple(gen.keep_stops) + openers


def safe_end(text: str, held: tuple[str, ...]) -> int:
  """How much of `text` may be sent: up to the first place one of `held` could begin."""
  end = len(text)
  for h in held:
    at = text.find(h)
    if at >= 0:
      end = min(end, at)
    for k in range(min(len(h) - 1, len(text)), 0, -1):
      if text.endswith(h[:k]):
        end = min(end, len(text) - k)
        break
  while end and text[end - 1] == INCOMPLETE:
    end -= 1
  return end


def progress(tokenizer, sent: Sent, ids, held: tuple[str, ...]) -> tuple[int, int, str] | None:
  """(first id, end id, text) newly safe to send of a choice whose tokens so far are
  `ids`, or None; `sent` is advanced."""
  text = tokenizer.decode(list(ids))
  safe = text[: safe_end(text, held)]
  if len(safe) <= len(sent.text) or not safe.startswith(sent.text):
    return None
  hi = len(ids)
  while hi > sent.ids and not safe.startswith(tokenizer.decode(list(ids[:hi]))):
    hi -= 1
  piece = (sent.ids, hi, safe[len(sent.text) :])
  sent.text, sent.ids = safe, hi
  return piece


def rest(sent: Sent, choice) -> tuple[int, int, str]:
  """(first id, end id, text) left to send when `choice` has ended: its final text (the
  content before its tool calls when it has some) past what was sent."""
  final = (choice.content or "") if choice.tool_calls else choice.text
  text = final[len(sent.text) :] if final.startswith(sent.text) else ""
  lo = min(sent.ids, len(choice.token_ids))
  sent.text, sent.ids = final, len(choice.token_ids)
  return lo, len(choice.token_ids), text
