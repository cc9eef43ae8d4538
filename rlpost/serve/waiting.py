"""How a handler waits for its request: its result, or a stream's updates, until the
client goes away (its socket reads EOF) or the request times out."""

import queue
import select
import socket
import time

from rlpost.serve import request_bodies


def client_gone(connection: socket.socket) -> bool:
  """Whether the peer closed its side (readable with nothing to read)."""
  readable, _, _ = select.select([connection], [], [], 0)
  if not readable:
    return False
  try:
    return connection.recv(1, socket.MSG_PEEK) == b""
  except OSError:
    return True


def wait(future, connection, timeout_s: float):
  """The future's result; None when the client went away first (the request is dropped:
  not decoded if it waits, its rows stopped if they decode); ApiError 504 after
  `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      return future.result(timeout=0.05)
    except TimeoutError:
      pass
    if client_gone(connection):
      abandon(future)
      return None
    if time.monotonic() > deadline:
      abandon(future)
      raise _timed_out(timeout_s)


def updates(ticket, n: int, connection, timeout_s: float):
  """A streaming request's updates until its `n` choices are done; ("gone", None, None)
  when the client went away first. Raises the request's error, or ApiError 504."""
  deadline, done = time.monotonic() + timeout_s, 0
  while done < n:
    if client_gone(connection):
      abandon(ticket)
      yield ("gone", None, None)
      return
    try:
      update = ticket.updates.get(timeout=0.05)
    except queue.Empty:
      if ticket.done() and ticket.exception() is not None:
        raise ticket.exception()  # pylint: disable=raising-bad-type
      if time.monotonic() > deadline:
        abandon(ticket)
        raise _timed_out(timeout_s)
      continue
    done += update[0] == "done"
    yield update


def abandon(future) -> None:
  """Drops a request: not decoded if it waits, its rows stopped at the next chunk if not."""
  future.cancel()
  gone = getattr(future, "gone", None)
  if gone is not None:
    gone.set()


def _timed_out(timeout_s: float) -> request_bodies.ApiError:
  """The 504 of a request that waited past `request_timeout_s`."""
  return request_bodies.ApiError(
    504, f"no result within {timeout_s} s (request_timeout_s)", code="timeout", kind="server_error"
  )
