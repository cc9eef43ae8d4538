"""OpenAI response bodies (and stream chunks) from choices, with vLLM's token ids:
`prompt_token_ids` on the response, `token_ids` on each choice (and on each chunk: the
ids of that delta). Logprobs are the sampler's: the log-probability of each token under
the distribution it was drawn from (softmax(logits / temperature), within top_p);
`top_logprobs` are log_softmax(logits / temperature) over the whole vocabulary (greedy:
temperature 1)."""

import time
import uuid


def _usage(prompt_len: int, choices) -> dict:
  done = sum(len(c.token_ids) for c in choices)
  return {"prompt_tokens": prompt_len, "completion_tokens": done, "total_tokens": prompt_len + done}


def _token(tokenizer, i: int) -> str:
  return tokenizer.decode([i], skip_special=False)


def _chat_logprobs(tokenizer, c, lo=0, hi=None) -> dict:
  entries = []
  for t in range(lo, len(c.token_ids) if hi is None else hi):
    text = _token(tokenizer, c.token_ids[t])
    top = [
      {"token": _token(tokenizer, i), "logprob": lp, "bytes": list(_token(tokenizer, i).encode())}
      for i, lp in (c.top[t] if c.top else [])
    ]
    entries.append(
      {"token": text, "logprob": c.logprobs[t], "bytes": list(text.encode()), "top_logprobs": top}
    )
  return {"content": entries}


def _message(c) -> dict:
  message = {"role": "assistant", "content": c.content}
  if c.tool_calls:
    message["tool_calls"] = c.tool_calls
  return message


def _head(kind: str, model: str) -> dict:
  prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
  return {
    "id": f"{prefix}-{uuid.uuid4().hex}",
    "object": kind,
    "created": int(time.time()),
    "model": model,
  }


def chat_response(tokenizer, gen, model: str, choices) -> dict:
  body = _head("chat.completion", model)
  body["choices"] = [
    {
      "index": c.index,
      "message": _message(c),
      "finish_reason": c.finish_reason,
      "logprobs": _chat_logprobs(tokenizer, c) if gen.logprobs else None,
      "token_ids": c.token_ids,
    }
    for c in choices
  ]
  body["usage"] = _usage(len(gen.prompt_ids), choices)
  body["prompt_token_ids"] = list(gen.prompt_ids)
  return body


def _completion_logprobs(tokenizer, c) -> dict:
  tokens = [_token(tokenizer, i) for i in c.token_ids]
  offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
  top = [
    {_token(tokenizer, i): lp for i, lp in c.top[t]} if c.top else None for t in range(len(tokens))
  ]
  return {
    "tokens": tokens,
    "token_logprobs": c.logprobs,
    "top_logprobs": top,
    "text_offset": offsets,
  }


def completion_response(tokenizer, gen, model: str, choices) -> dict:
  body = _head("text_completion", model)
  body["choices"] = [
    {
      "index": c.index,
      "text": c.text,
      "finish_reason": c.finish_reason,
      "logprobs": _completion_logprobs(tokenizer, c) if gen.logprobs else None,
      "token_ids": c.token_ids,
    }
    for c in choices
  ]
  body["usage"] = _usage(len(gen.prompt_ids), choices)
  body["prompt_token_ids"] = list(gen.prompt_ids)
  return body


def stream_head(gen, model: str, chat: bool) -> dict:
  """The fields every chunk of one stream shares (one id)."""
  return _head("chat.completion.chunk" if chat else "text_completion", model)


def role_chunk(head: dict, gen) -> dict:
  """A chat stream's first chunk: the assistant role of every choice, the prompt ids."""
  opening = [
    {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    for i in range(gen.n)
  ]
  return {**head, "choices": opening, "prompt_token_ids": list(gen.prompt_ids)}


def piece_chunk(tokenizer, head: dict, gen, index: int, part, text: str, chat: bool) -> dict:
  """A content chunk: `text` and the ids of `part` (an object with token_ids, logprobs,
  top: what these ids were sampled with)."""
  piece = {"index": index, "finish_reason": None, "token_ids": list(part.token_ids)}
  if chat:
    piece["delta"] = {"content": text}
    piece["logprobs"] = _chat_logprobs(tokenizer, part) if gen.logprobs else None
  else:
    piece["text"] = text
  return {**head, "choices": [piece]}


def last_chunk(head: dict, c, chat: bool) -> dict:
  """A choice's last chunk: its finish_reason, and its tool calls when it has some."""
  last = {"index": c.index, "finish_reason": c.finish_reason}
  if c.tool_calls:
    last["delta"] = {"tool_calls": [{"index": j, **call} for j, call in enumerate(c.tool_calls)]}
  elif chat:
    last["delta"] = {}
  else:
    last["text"] = ""
  return {**head, "choices": [last]}


def usage_chunk(head: dict, gen, choices) -> dict:
  return {**head, "choices": [], "usage": _usage(len(gen.prompt_ids), choices)}
