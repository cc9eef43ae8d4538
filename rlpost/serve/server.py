"""The HTTP side: routes, limits, JSON and SSE, on the standard library's server.

Why `http.server.ThreadingHTTPServer`: the work is one model owned by one scheduler
thread, so the HTTP layer only parses JSON and waits on futures; a thread per connection
does that without an event loop, and the standard library adds no dependency to the
library (uvicorn + starlette would add two, and an async bridge to the scheduler thread).
SSE is plain writes on the socket. The accept queue is `ServerConfig.accept_queue`
(socketserver's default of 5 refuses bursts of agents).

Limits: bodies over `max_body_bytes` get 413 unread; at most `max_concurrent` requests
are in flight (429 beyond); a request waits at most `request_timeout_s` (504); a socket
idle for `read_timeout_s` is closed. A client that goes away is noticed (its socket reads
EOF, or a stream's write fails) and its request is dropped: not decoded if it waits, its
rows stopped and their slots freed at the next chunk if they decode.

A stream (`stream=true`) writes its chunks as the scheduler hands over tokens, after each
decode chunk (`streaming.py` holds back what could start a stop string or a tool call);
a request with `top_logprobs` streams when its choice ends (the alternatives come from
one forward over the whole choice).
"""

import contextlib
import dataclasses
import http.server
import ipaddress
import json
import threading
from typing import NamedTuple

from absl import logging

from rlpost.serve import request_bodies, responses, sessions, streaming, waiting
from rlpost.serve import scheduler as scheduler_lib

LOOPBACK = ("localhost",)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
  """host/port (0: any free port); api_key ("" = none: clients' `Authorization: Bearer
  KEY` is not checked); allow_remote: a non-loopback host is refused unless True; the
  limits of the module docstring."""

  host: str = "127.0.0.1"
  port: int = 8000
  api_key: str = ""
  allow_remote: bool = False
  max_body_bytes: int = 1 << 20
  max_concurrent: int = 256
  request_timeout_s: float = 600.0
  read_timeout_s: float = 60.0
  accept_queue: int = 1024

  def __post_init__(self):
    if not self.allow_remote and not is_loopback(self.host):
      raise ValueError(
        f"ServerConfig.host={self.host!r} is not a loopback address: the endpoint would serve "
        "the policy to the network. Use 127.0.0.1, or set allow_remote=True (and an api_key)"
      )
    for name in ("max_body_bytes", "max_concurrent", "accept_queue"):
      if getattr(self, name) < 1:
        raise ValueError(f"ServerConfig.{name}={getattr(self, name)} must be >= 1")
    for name in ("request_timeout_s", "read_timeout_s"):
      if not getattr(self, name) > 0:
        raise ValueError(f"ServerConfig.{name}={getattr(self, name)} must be > 0 seconds")


def is_loopback(host: str) -> bool:
  if host in LOOPBACK:
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


@dataclasses.dataclass(frozen=True, eq=False)
class App:
  """What a handler reads: the engine, the running scheduler, the settings, the in-flight
  slots, the sessions' records."""

  engine: object
  scheduler: scheduler_lib.Scheduler
  config: ServerConfig
  slots: threading.BoundedSemaphore
  recorder: sessions.Recorder


class _Handler(http.server.BaseHTTPRequestHandler):
  """One connection's requests (the standard library's handler API); `app` is set on a
  subclass per server (`_handler_for`)."""

  protocol_version = "HTTP/1.1"
  app: App

  def setup(self):
    self.timeout = self.app.config.read_timeout_s
    super().setup()

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    logging.debug("serve: " + format, *args)

  def _send_json(self, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def _error(self, e: request_bodies.ApiError) -> None:
    self._send_json(e.status, e.body())

  def _authorized(self) -> bool:
    key = self.app.config.api_key
    if key and self.headers.get("Authorization", "") != f"Bearer {key}":
      self._error(
        request_bodies.ApiError(
          401,
          "a valid API key is required (Authorization: Bearer KEY)",
          code="invalid_api_key",
          kind="authentication_error",
        )
      )
      return False
    return True

  def do_GET(self):
    if not self._authorized():
      return
    name = self.app.engine.name
    card = {
      "id": name,
      "object": "model",
      "created": 0,
      "owned_by": "rlpost",
      "max_model_len": self.app.engine.context,
    }
    _, path = sessions.split_path(self.path)
    if path.rstrip("/") == "/v1/models":
      self._send_json(200, {"object": "list", "data": [card]})
    elif path == f"/v1/models/{name}":
      self._send_json(200, card)
    elif path.startswith("/v1/models/"):
      self._error(
        request_bodies.ApiError(
          404, f"The model {path[11:]!r} does not exist", param="model", code="model_not_found"
        )
      )
    else:
      self._error(_not_found(self.path))

  def do_POST(self):
    if not self._authorized():
      return self._discard_body()  # the connection stays usable for the next request
    parse = {
      "/v1/chat/completions": request_bodies.parse_chat,
      "/v1/completions": request_bodies.parse_completion,
    }
    session, path = sessions.split_path(self.path)
    if path not in parse:
      self._discard_body()
      return self._error(_not_found(self.path))
    try:
      body = self._read_json()
    except request_bodies.ApiError as e:
      return self._error(e)
    if not self.app.slots.acquire(blocking=False):
      return self._error(
        request_bodies.ApiError(
          429,
          f"the server has {self.app.config.max_concurrent} requests in flight; retry later",
          code="rate_limit_exceeded",
        )
      )
    try:
      self._generate(body, parse[path], path == "/v1/chat/completions", session)
    except request_bodies.ApiError as e:
      self._error(e)
    except (BrokenPipeError, ConnectionResetError):
      self.close_connection = True
    except Exception as e:  # noqa: BLE001  (the server goes on)
      logging.exception("serve: request failed")
      self._error(request_bodies.ApiError(500, f"internal error: {type(e).__name__}: {e}"))
    finally:
      self.app.slots.release()

  def _discard_body(self) -> None:
    length = self.headers.get("Content-Length")
    if length and length.isdigit() and int(length) <= self.app.config.max_body_bytes:
      self.rfile.read(int(length))
    else:
      self.close_connection = True

  def _read_json(self) -> dict:
    length = self.headers.get("Content-Length")
    if length is None or not length.isdigit():
      self.close_connection = True
      raise request_bodies.ApiError(
        411, "a Content-Length header is required", code="length_required"
      )
    limit = self.app.config.max_body_bytes
    if int(length) > limit:
      self.close_connection = True  # the body stays unread
      raise request_bodies.ApiError(
        413,
        f"the body has {length} bytes; this server takes at most {limit}",
        code="request_too_large",
      )
    raw = self.rfile.read(int(length))
    try:
      body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise request_bodies.ApiError(
        400, f"the body is not valid JSON: {e}", code="invalid_json"
      ) from e
    if not isinstance(body, dict):
      raise request_bodies.ApiError(
        400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_json"
      )
    return body

  def _generate(self, body: dict, parse, chat: bool, session: str | None) -> None:
    engine = self.app.engine
    gen = parse(body, engine)
    ticket = scheduler_lib.submit(self.app.scheduler, gen, session)
    if gen.stream:
      choices = self._stream(gen, ticket, chat)
    else:
      choices = waiting.wait(ticket, self.connection, self.app.config.request_timeout_s)
    if choices is None:  # the client went away (its rows stop at the next chunk)
      self.close_connection = True
      return
    if session is not None:
      c = choices[0]
      turn = sessions.Turn(gen.prompt_ids, tuple(c.token_ids), tuple(c.logprobs))
      sessions.record(self.app.recorder, session, turn)
    if not gen.stream:
      build = responses.chat_response if chat else responses.completion_response
      self._send_json(200, build(engine.tokenizer, gen, engine.name, choices))

  def _event(self, chunk) -> None:
    self.wfile.write(
      b"data: " + (chunk if isinstance(chunk, bytes) else json.dumps(chunk).encode())
    )
    self.wfile.write(b"\n\n")
    self.wfile.flush()

  def _open_stream(self) -> None:
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Cache-Control", "no-cache")
    self.send_header("Connection", "close")
    self.end_headers()
    self.close_connection = True

  def _stream(self, gen, ticket, chat: bool):
    """Writes the request's SSE stream as its tokens are decoded; returns its choices, or
    None when the client went away (its rows are then dropped)."""
    try:
      return self._stream_events(gen, ticket, chat)
    except (BrokenPipeError, ConnectionResetError):
      waiting.abandon(ticket)
      raise

  def _stream_events(self, gen, ticket, chat: bool):
    tok, timeout = self.app.engine.tokenizer, self.app.config.request_timeout_s
    head = responses.stream_head(gen, self.app.engine.name, chat)
    held, sent = streaming.holds(gen), [streaming.Sent() for _ in range(gen.n)]
    choices, opened = [None] * gen.n, False
    for kind, index, payload in waiting.updates(ticket, gen.n, self.connection, timeout):
      if kind == "gone":
        return None
      if not opened:
        self._open_stream()
        if chat:
          self._event(responses.role_chunk(head, gen))
        opened = True
      if kind == "tokens" and not gen.top_logprobs:  # alternatives come with the choice
        ids, logprobs = payload
        piece = streaming.progress(tok, sent[index], ids, held)
        if piece is not None:
          lo, hi, text = piece
          part = _Part(ids[lo:hi], logprobs[lo:hi], None)
          self._event(responses.piece_chunk(tok, head, gen, index, part, text, chat))
      elif kind == "done":
        choices[index] = payload
        lo, hi, text = streaming.rest(sent[index], payload)
        if text or hi > lo:
          top = payload.top and payload.top[lo:hi]
          part = _Part(payload.token_ids[lo:hi], payload.logprobs[lo:hi], top)
          self._event(responses.piece_chunk(tok, head, gen, index, part, text, chat))
        self._event(responses.last_chunk(head, payload, chat))
    if gen.include_usage:
      self._event(responses.usage_chunk(head, gen, choices))
    self._event(b"[DONE]")
    return choices


class _Part(NamedTuple):
  token_ids: tuple
  logprobs: tuple
  top: list | None


def _not_found(path: str) -> request_bodies.ApiError:
  return request_bodies.ApiError(
    404,
    f"no route {path!r}: use /v1/models, /v1/chat/completions or /v1/completions",
    code="not_found",
  )


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True
  allow_reuse_address = True


def _handler_for(app: App):
  return type("Handler", (_Handler,), {"app": app})


@dataclasses.dataclass(frozen=True, eq=False)
class Endpoint:
  """A running endpoint: its base URL (`http://HOST:PORT/v1`), the sessions' recorder
  (`sessions.take`), its scheduler (`stats`: chunks, admissions, prefilled tokens, cache hits) and API key."""

  url: str
  recorder: sessions.Recorder
  scheduler: scheduler_lib.Scheduler
  api_key: str = ""

  def session_url(self, session: str) -> str:
    """The base URL whose requests are recorded under `session`."""
    return self.url[: -len("/v1")] + f"/sessions/{session}/v1"


@contextlib.contextmanager
def serve_in_thread(engine, config: ServerConfig, batch: scheduler_lib.BatchConfig):
  """Serves `engine` on a background thread; yields its `Endpoint`. Leaving the block
  stops the server and its scheduler."""
  scheduler = scheduler_lib.start(engine, batch)
  slots = threading.BoundedSemaphore(config.max_concurrent)
  app = App(engine, scheduler, config, slots, sessions.Recorder())
  server_cls = type("Server", (_Server,), {"request_queue_size": config.accept_queue})
  try:
    server = server_cls((config.host, config.port), _handler_for(app))
  except BaseException:
    scheduler_lib.stop(scheduler)
    raise
  thread = threading.Thread(
    target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
  )
  thread.start()
  host, port = server.server_address[:2]
  try:
    yield Endpoint(f"http://{host}:{port}/v1", app.recorder, scheduler, config.api_key)
  finally:
    server.shutdown()
    server.server_close()
    thread.join()
    scheduler_lib.stop(scheduler)
