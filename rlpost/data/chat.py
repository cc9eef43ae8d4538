"""SFT and DPO records: JSONL loading, validation, and chat-format tokenization.

Record forms (one JSON object per line):
  SFT  {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}
  SFT  {"prompt": str, "completion": str, "system": str (optional)}
  DPO  {"prompt": str, "chosen": str, "rejected": str, "system": str (optional)}

A conversation is an optional first system message, then turns alternating
user / assistant, starting with user and ending with assistant. Records with tool calls,
`tool` messages or `tools` (the OpenAI shape, `rlpost.data.openai_chat`) load too; only the
model's chat template lays them out (`rlpost.data.template_sft`).

The tokenizer's chat format lays it out (`rlpost.text.chat_formats`). Gemma's has no
system role: the system text is prepended to the first user turn, and the assistant
role renders as `model`:

  <bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n
  <start_of_turn>model\n{assistant}<end_of_turn>\n
  <start_of_turn>user\n{user}<end_of_turn>\n ...

ChatML (SmolLM2, Qwen) writes `<|im_start|>{role}\n{content}<|im_end|>\n` with a system
turn (the template's default system text when the record has none), Llama 3 its header
tokens.

Tokenization encodes the format's pieces separately and concatenates them:
each prompt span (everything from the end of one assistant turn up to and
including the assistant's opening) comes from `chat_formats`, as the RL scaffold's
prompts do; only the format writes control ids, and record text (system, user and
assistant content) is encoded with special-token parsing off, so a `<start_of_turn>`
typed in a record stays plain text. Each assistant turn is followed by the turn close id
(`end_of_turn_id`). The loss mask is True exactly on assistant content tokens and the
close ending each assistant turn.
"""

import os
from typing import Any, Sequence

import numpy as np

from rlpost import errors
from rlpost.data.gsm8k import SYSTEM_PROMPT, Problem, sft_completion
from rlpost.data import openai_chat
from rlpost.data.jsonl import read_jsonl, require_str
from rlpost.text import chat_formats

START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"
ROLES = ("system", "user", "assistant")
_ORDER_RULE = (
  "after an optional first system message, turns alternate user/assistant, "
  "starting with user and ending with assistant"
)


def _check_message(msg: Any, i: int, where: str) -> dict[str, str]:
  if not isinstance(msg, dict):
    raise errors.DataError(
      f"{where}: messages[{i}] must be an object with 'role' and 'content', "
      f"got {type(msg).__name__}"
    )
  role = require_str(msg, "role", f"{where}: messages[{i}]")
  content = require_str(msg, "content", f"{where}: messages[{i}]")
  if role not in ROLES:
    raise errors.DataError(f"{where}: messages[{i}] has role {role!r}; valid roles are {ROLES}")
  return {"role": role, "content": content}


def to_messages(record: dict[str, Any], where: str = "record") -> list[dict[str, str]]:
  """Validated message list of an SFT record in either form (module docstring)."""
  if "messages" in record:
    raw = record["messages"]
    if not isinstance(raw, list) or not raw:
      raise errors.DataError(f"{where}: field 'messages' must be a non-empty list, got {raw!r:.60}")
    messages = [_check_message(m, i, where) for i, m in enumerate(raw)]
  elif "prompt" in record and "completion" in record:
    messages = [
      {"role": "user", "content": require_str(record, "prompt", where)},
      {"role": "assistant", "content": require_str(record, "completion", where)},
    ]
    if "system" in record:
      messages.insert(0, {"role": "system", "content": require_str(record, "system", where)})
  else:
    raise errors.DataError(
      f"{where}: an SFT record needs a 'messages' list or 'prompt' and "
      f"'completion' strings; got fields {sorted(record)}"
    )
  first = 1 if messages[0]["role"] == "system" else 0
  for i in range(first, len(messages)):
    expected = "user" if (i - first) % 2 == 0 else "assistant"
    if messages[i]["role"] != expected:
      raise errors.DataError(
        f"{where}: messages[{i}] has role {messages[i]['role']!r}, expected "
        f"{expected!r} ({_ORDER_RULE})"
      )
  if messages[-1]["role"] != "assistant":
    raise errors.DataError(
      f"{where}: the last message has role {messages[-1]['role']!r}, expected "
      f"'assistant' ({_ORDER_RULE})"
    )
  return messages


def dpo_fields(record: dict[str, Any], where: str = "record") -> dict[str, str]:
  """Validated {"prompt", "chosen", "rejected"[, "system"]} strings of a DPO record; a
  pair whose chosen and rejected answers are the same text is an error (it teaches
  nothing, and a preference loss's margin is 0 on it)."""
  fields = {k: require_str(record, k, where) for k in ("prompt", "chosen", "rejected")}
  if "system" in record:
    fields["system"] = require_str(record, "system", where)
  if fields["chosen"] == fields["rejected"]:
    raise errors.DataError(
      f"{where}: 'chosen' and 'rejected' are the same text ({fields['chosen']!r:.60}); "
      "a preference pair needs two different answers: fix or drop the record"
    )
  return fields


def kto_fields(record: dict[str, Any], where: str = "record") -> dict[str, Any]:
  """Validated {"prompt", "completion": str, "label": bool[, "system": str]} of an unpaired
  KTO record (label true: a desirable completion, false: an undesirable one)."""
  fields: dict[str, Any] = {k: require_str(record, k, where) for k in ("prompt", "completion")}
  if "system" in record:
    fields["system"] = require_str(record, "system", where)
  label = record.get("label")
  if not isinstance(label, bool):
    raise errors.DataError(
      f"{where}: field 'label' must be true (a desirable completion) or false (an "
      f"undesirable one), got {label!r:.60}"
    )
  fields["label"] = label
  return fields


def sft_record(obj: Any, where: str = "record") -> dict[str, Any]:
  """The validated `{"messages": [...]}` of an SFT record in any form: one with tool calls,
  tool messages, tools or reasoning keeps them (`openai_chat.record`, `"tools"` if given)."""
  if openai_chat.openai_fields(obj):
    return openai_chat.record(obj, where)
  return {"messages": to_messages(obj, where)}


def load_sft_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """SFT records (`sft_record`); a bad line raises ValueError naming path:line."""
  return [sft_record(obj, where) for where, obj in read_jsonl(path)]


def load_dpo_jsonl(path: str | os.PathLike) -> list[dict[str, str]]:
  """DPO records; a bad line raises ValueError naming path:line and the problem."""
  return [dpo_fields(obj, where) for where, obj in read_jsonl(path)]


def load_kto_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """KTO records (`kto_fields`); a bad line raises ValueError naming path:line."""
  return [kto_fields(obj, where) for where, obj in read_jsonl(path)]


def gsm8k_sft_records(problems: Sequence[Problem]) -> list[dict[str, str]]:
  """Prompt/completion records: SYSTEM_PROMPT, the question, and `sft_completion`."""
  return [
    {"system": SYSTEM_PROMPT, "prompt": p.question, "completion": sft_completion(p)}
    for p in problems
  ]


def exchanges(messages: Sequence[dict[str, str]]) -> tuple[str | None, list[tuple[str, str]]]:
  """(system text or None, [(user text, assistant content)], one per assistant turn) of
  validated messages."""
  system = messages[0]["content"] if messages[0]["role"] == "system" else None
  turns = [m["content"] for m in messages if m["role"] != "system"]
  return system, list(zip(turns[0::2], turns[1::2]))


def _prompt_span(tokenizer, user: str, first: bool, system: str | None = None) -> list[int]:
  """Ids from the end of the previous assistant turn (or after BOS) to the assistant's
  opening: the first one holds the system turn (Gemma: the system text opening the user
  text), later ones start with what follows the previous turn's close (Gemma's `\\n`)."""
  opening = chat_formats.generation_prompt(tokenizer)
  if first:
    turns = chat_formats.opening_turns(tokenizer, user, system)
    return turns[len(chat_formats.start(tokenizer)) :] + opening
  after_close = chat_formats.closing(tokenizer)[1:]
  return after_close + chat_formats.turn(tokenizer, "user", user) + opening


def _encode_response(tokenizer, text: str) -> list[int]:
  return list(tokenizer.encode(text, add_bos=False, parse_special=False)) + [
    tokenizer.end_of_turn_id
  ]


def tokenize_sft(record: dict[str, Any], tokenizer, max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """Tokens and loss mask of an SFT record in the tokenizer's hand-written chat format
  (`chat_formats`; records with tool calls need the template, `template_sft`).

  Truncation policy: the first `max_len` tokens are kept (right truncation),
  so a long final response is cut and loses its closing `<end_of_turn>` (the
  model is not taught to stop where the text was cut). A record whose first
  assistant token would lie at or beyond `max_len` trains on nothing and
  raises ValueError instead.

  Returns:
    tokens [T] int32 (BOS first) and loss_mask [T] bool, T <= max_len.
  """
  if openai_chat.openai_fields(record):
    raise errors.DataError(
      "an SFT record with tool calls, tool messages, tools or reasoning fields needs the "
      "model's chat template to lay them out: set data.layout=template, with model.chat_template=FILE (a .jinja "
      "file or a Hugging Face directory) when the model file carries none"
    )
  ids = chat_formats.start(tokenizer)
  mask = [False] * len(ids)
  system, pairs = exchanges(to_messages(record))
  for k, (user, content) in enumerate(pairs):
    prompt = _prompt_span(tokenizer, user, first=k == 0, system=system)
    response = _encode_response(tokenizer, content)
    ids += prompt + response
    mask += [False] * len(prompt) + [True] * len(response)
  tail = chat_formats.closing(tokenizer)[1:]
  ids, mask = ids + tail, mask + [False] * len(tail)
  first = mask.index(True)
  if first >= max_len:
    raise ValueError(
      f"SFT record's prompt is {first} tokens, so no assistant token fits in "
      f"max_len={max_len}; raise max_len or drop the record "
      f"(prompt starts {record.get('prompt', record.get('messages'))!r:.80})"
    )
  return np.asarray(ids[:max_len], np.int32), np.asarray(mask[:max_len], bool)


def tokenize_dpo(
  record: dict[str, Any], tokenizer, max_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(prompt ids, chosen ids, rejected ids), each [*] int32, of a DPO record.

  prompt = BOS + `<start_of_turn>user\\n[{system}\\n\\n]{prompt}<end_of_turn>\\n
  <start_of_turn>model\\n`; a response = its content tokens + `<end_of_turn>`.
  Truncation policy: each response is cut to `max_len - len(prompt)` tokens
  so that prompt + response fits in `max_len`; a prompt of `max_len` tokens or
  more raises ValueError.
  """
  fields = dpo_fields(record)
  prompt, room = _prompt_and_room(fields, tokenizer, max_len)
  chosen = _encode_response(tokenizer, fields["chosen"])[:room]
  rejected = _encode_response(tokenizer, fields["rejected"])[:room]
  return tuple(np.asarray(x, np.int32) for x in (prompt, chosen, rejected))


def _prompt_and_room(fields: dict[str, Any], tokenizer, max_len: int) -> tuple[list[int], int]:
  """(the record's prompt ids, BOS first; the tokens left for a response in max_len)."""
  prompt = chat_formats.start(tokenizer) + _prompt_span(
    tokenizer, fields["prompt"], first=True, system=fields.get("system")
  )
  room = max_len - len(prompt)
  if room < 1:
    raise ValueError(
      f"the prompt is {len(prompt)} tokens, leaving no room for a response in "
      f"max_len={max_len}; raise max_len or drop the record "
      f"(prompt starts {fields['prompt']!r:.80})"
    )
  return prompt, room


def tokenize_kto(
  record: dict[str, Any], tokenizer, max_len: int
) -> tuple[np.ndarray, np.ndarray, bool]:
  """(prompt ids, completion ids, label) of a KTO record, laid out as `tokenize_dpo`'s."""
  fields = kto_fields(record)
  prompt, room = _prompt_and_room(fields, tokenizer, max_len)
  completion = _encode_response(tokenizer, fields["completion"])[:room]
  return np.asarray(prompt, np.int32), np.asarray(completion, np.int32), fields["label"]


def concat_prompt_response(
  prompt_ids: Sequence[int], response_ids: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [P+R] int32, loss_mask [P+R] bool True on the response): a packable example."""
  tokens = np.concatenate([np.asarray(prompt_ids, np.int32), np.asarray(response_ids, np.int32)])
  mask = np.arange(len(tokens)) >= len(prompt_ids)
  return tokens, mask
