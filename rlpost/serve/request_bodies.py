"""Request bodies -> `Generation`, checked; `ApiError` names the field, value and fix.

Fields this server does not know are ignored, as vLLM does (clients send extras such as
`user`, `metadata`, `store`); a known field asking for behaviour it lacks (`logit_bias`,
penalties, a forced `tool_choice`) is refused with a 400 naming it rather than ignored.
"""

import dataclasses
import math
import secrets

from rlpost.serve import chat, scoring

ROLES = ("system", "user", "assistant", "tool")
MAX_N = 64
MAX_STOPS = 4


class ApiError(Exception):
  """An OpenAI-style error: HTTP status, message, type, param, code."""

  def __init__(self, status: int, message: str, param=None, code=None, kind=None):
    super().__init__(message)
    self.status, self.message, self.param, self.code = status, message, param, code
    self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

  def body(self) -> dict:
    return {
      "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
    }


def bad(param: str, value, fix: str) -> ApiError:
  return ApiError(400, f"{param}={value!r}: {fix}", param=param, code="invalid_value")


@dataclasses.dataclass(frozen=True)
class Generation:
  """One request as the scheduler sees it: prompt ids, n choices, new-token cap,
  sampling settings, stop strings (`keep_stops`: kept in the text, the tool-call close),
  the seed, logprob reporting, streaming, and the enabled tools (OpenAI dicts)."""

  prompt_ids: tuple[int, ...]
  n: int
  max_tokens: int
  temperature: float
  top_p: float
  stop: tuple[str, ...]
  seed: int
  logprobs: bool
  top_logprobs: int
  stream: bool
  include_usage: bool
  tools: tuple = ()
  keep_stops: tuple[str, ...] = ()
  chat: object = None  # chat.ChatSetup: how the completion's tool calls are read


def _number(body, name, default, lo, hi):
  value = body.get(name, default)
  value = default if value is None else value
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise bad(name, value, f"must be a number in [{lo}, {hi}]")
  if not lo <= value <= hi:
    raise bad(name, value, f"must be in [{lo}, {hi}]")
  return value


def _int(body, name, default, lo, hi):
  value = _number(body, name, default, lo, hi)
  if not isinstance(value, int) and not float(value).is_integer():
    raise bad(name, value, "must be a whole number")
  return int(value)


def _refuse_unsupported(body) -> None:
  for name in ("presence_penalty", "frequency_penalty"):
    if body.get(name) not in (None, 0, 0.0):
      raise bad(name, body[name], "is not supported by this server; leave it 0")
  if body.get("logit_bias"):
    raise bad("logit_bias", body["logit_bias"], "is not supported by this server; leave it out")


def _stops(body) -> tuple[str, ...]:
  stop = body.get("stop")
  stops = () if stop is None else (stop,) if isinstance(stop, str) else stop
  if not isinstance(stops, (list, tuple)) or len(stops) > MAX_STOPS:
    raise bad("stop", stop, f"must be a string or a list of at most {MAX_STOPS} strings")
  if not all(isinstance(s, str) and s for s in stops):
    raise bad("stop", stop, "every stop sequence must be a non-empty string")
  return tuple(stops)


def _budget(body, engine, prompt_len: int, names: tuple[str, ...]) -> int:
  """The new-token cap: the first of `names` given, else what the context leaves."""
  room = engine.context - prompt_len
  if room < 1:
    raise ApiError(
      400,
      f"the prompt has {prompt_len} tokens; this model's context is {engine.context} tokens "
      "(prompt + completion): shorten the messages",
      param="messages",
      code="context_length_exceeded",
    )
  for name in names:
    if body.get(name) is not None:
      value = _int(body, name, None, 1, engine.max_tokens)
      if value > room:
        raise ApiError(
          400,
          f"{name}={value} with a {prompt_len}-token prompt exceeds this model's context of "
          f"{engine.context} tokens: ask for at most {room}",
          param=name,
          code="context_length_exceeded",
        )
      return value
  return min(room, engine.max_tokens)


def _common(body, engine, prompt_ids, budget_names, **extra) -> Generation:
  _refuse_unsupported(body)
  options = body.get("stream_options") or {}
  seed = body.get("seed")
  if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
    raise bad("seed", seed, "must be an integer")
  if len(prompt_ids) == 0:
    raise bad("prompt", "", "must hold at least one token")
  return Generation(
    prompt_ids=tuple(prompt_ids),
    n=_int(body, "n", 1, 1, MAX_N),
    max_tokens=_budget(body, engine, len(prompt_ids), budget_names),
    temperature=float(_number(body, "temperature", 1.0, 0.0, 2.0)),
    top_p=float(_number(body, "top_p", 1.0, 1e-6, 1.0)),
    stop=_stops(body),
    seed=secrets.randbits(31) if seed is None else seed,
    stream=bool(body.get("stream", False)),
    include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
    **extra,
  )


def check_model(body, engine) -> None:
  model = body.get("model")
  if not isinstance(model, str) or not model:
    raise bad("model", model, f"name the model to use: {engine.name!r}")
  if model != engine.name:
    raise ApiError(
      404,
      f"The model {model!r} does not exist; this server serves {engine.name!r}",
      param="model",
      code="model_not_found",
    )


def _content(message, i: int) -> str | None:
  content = message.get("content")
  if content is None or isinstance(content, str):
    return content
  if isinstance(content, list) and all(
    isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    for p in content
  ):
    return "".join(p["text"] for p in content)
  raise bad(f"messages[{i}].content", content, "must be a string or a list of text parts")


def _messages(body) -> list[dict]:
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise bad("messages", messages, "must be a non-empty list of {role, content} objects")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or m.get("role") not in ROLES:
      raise bad(
        f"messages[{i}].role", m.get("role") if isinstance(m, dict) else m, f"use one of {ROLES}"
      )
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
      raise bad(f"messages[{i}].tool_calls", calls, "must be a list of tool call objects")
    out.append({"role": m["role"], "content": _content(m, i), "tool_calls": calls})
  return out


def _tools(body) -> tuple:
  tools = body.get("tools") or []
  choice = body.get("tool_choice")
  if choice not in (None, "auto", "none"):
    raise bad("tool_choice", choice, "this server supports 'auto' and 'none'")
  if not isinstance(tools, list) or not all(
    isinstance(t, dict)
    and isinstance(t.get("function"), dict)
    and isinstance(t["function"].get("name"), str)
    for t in tools
  ):
    raise bad("tools", tools, "must be a list of {type: function, function: {name, ...}}")
  return () if choice == "none" else tuple(tools)


def parse_chat(body, engine) -> Generation:
  """A /v1/chat/completions body -> Generation (prompt ids through `chat.prompt_ids`)."""
  check_model(body, engine)
  messages, tools = _messages(body), _tools(body)
  try:
    ids = chat.prompt_ids(engine.tokenizer, messages, tools, engine.chat)
  except ValueError as e:
    raise bad("messages", [m["role"] for m in messages], str(e)) from e
  logprobs = bool(body.get("logprobs") or False)
  top = _int(body, "top_logprobs", 0, 0, scoring.MAX_TOP_LOGPROBS)
  if top and not logprobs:
    raise bad("top_logprobs", top, "needs logprobs=true")
  return _common(
    body,
    engine,
    ids,
    ("max_completion_tokens", "max_tokens"),
    logprobs=logprobs,
    top_logprobs=top,
    tools=tools,
    keep_stops=chat.stop_strings(tools, engine.chat),
    chat=engine.chat,
  )


def _prompt_ids(body, engine) -> list[int]:
  prompt = body.get("prompt")
  if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
    prompt = prompt[0]
  if isinstance(prompt, str):
    return engine.tokenizer.encode(prompt)
  vocab = engine.model_config.vocab_size
  if isinstance(prompt, list) and all(
    isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in prompt
  ):
    return prompt
  raise bad("prompt", prompt, f"must be one string or one list of token ids in [0, {vocab})")


def parse_completion(body, engine) -> Generation:
  """A /v1/completions body -> Generation (a string prompt is encoded with BOS)."""
  check_model(body, engine)
  for name in ("echo", "suffix", "best_of"):
    if body.get(name) not in (None, False, 1):
      raise bad(name, body[name], "is not supported by this server; leave it out")
  top = body.get("logprobs")
  top = 0 if top is None else _int(body, "logprobs", 0, 0, 5)
  return _common(
    body,
    engine,
    _prompt_ids(body, engine),
    ("max_tokens",),
    logprobs=body.get("logprobs") is not None,
    top_logprobs=top,
  )
