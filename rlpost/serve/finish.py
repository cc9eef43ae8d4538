"""A sampled row -> one choice: stop strings, text, tool calls, finish_reason.

Stop strings are found in the decoded text (the scheduler ends a row once its text holds
one, `first_stop`): the tokens are cut after the first token whose text holds a stop
string, and the text before it is kept (for a tool-call close, `Generation.keep_stops`,
through it). The token ids stay exactly the sampled ones (the stop id included when the
row ended on it): a trainer reading `token_ids` trains on what was sampled.
"""

import dataclasses

from rlpost.serve import chat


@dataclasses.dataclass(frozen=True)
class Choice:
  """index; token_ids / logprobs / top (the sampled ones, cut at a stop string); text
  (all of it), content and tool_calls (the text split by `chat.split_tool_calls`);
  finish_reason: stop, length or tool_calls."""

  index: int
  token_ids: list[int]
  logprobs: list[float]
  top: list | None
  text: str
  content: str | None
  tool_calls: list[dict]
  finish_reason: str


def _first_stop(tokenizer, ids, stops, keep) -> tuple[int, str] | None:
  """(tokens kept, text) at the first token whose decoded prefix holds a stop string."""
  for k in range(1, len(ids) + 1):
    text = tokenizer.decode(ids[:k])
    found = [(text.find(s), s) for s in stops if s in text]
    if found:
      at, stop = min(found)
      return k, text[: at + len(stop)] if stop in keep else text[:at]
  return None


def first_stop(tokenizer, ids, stops) -> bool:
  """Whether the text of `ids` holds one of `stops` (the row can end: `finish` cuts it)."""
  text = tokenizer.decode(ids)
  return any(s in text for s in stops)


def finish(tokenizer, gen, index: int, out) -> Choice:
  """Choice `index` of request `gen` from its `engine.RowOutput`."""
  ids, logprobs, top = out.token_ids, out.logprobs, out.top
  reason = "stop" if out.stopped else "length"
  cut = _first_stop(tokenizer, ids, gen.stop + gen.keep_stops, gen.keep_stops)
  if cut is None:
    text = tokenizer.decode(ids)
  else:
    k, text = cut
    ids, logprobs, top, reason = ids[:k], logprobs[:k], top and top[:k], "stop"
  content, calls = chat.split_tool_calls(text, gen.tools, gen.chat)
  return Choice(index, ids, logprobs, top, text, content, calls, "tool_calls" if calls else reason)
