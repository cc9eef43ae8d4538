"""Scorers that may never return, run with a time limit in worker processes.

A reward parses text the policy wrote. A third-party parser can spend hours on a reply:
math-verify on "9^9^9^9" (sympy builds the number), reasoning-gym's coin_flip scorer on
"1e999999999". Python cannot stop that in the caller: SIGALRM works on the main thread
only (rollout steps run on a thread pool) and is not seen while C code runs (a big-int
power), and a thread cannot be killed. So `call` sends the work to a worker process
(`python -m rlpost.rewards.bounded`, a fresh interpreter that imports only the target)
and waits `timeout_s` seconds: past that the worker is killed, the next call starts a new
one, and the caller gets `fallback` (logged). A reward that timed out depends on the
machine's speed; no ordinary reply comes near the limit.

`target` is "module:function"; `setup` (optional, "module:function" and its args) builds
what the target needs once per worker (e.g. a generator: reasoning-gym's acre takes 26 s),
outside the time limit (SETUP_TIMEOUT_S), and is passed as the target's first argument.
At most MAX_WORKERS run at once (callers beyond wait); an idle one serves the next call; a
worker ends after MAX_CALLS calls or when its pipe closes (its parent ended).
"""

import ctypes
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from concurrent import futures
from multiprocessing import connection

from absl import logging

TIMEOUT_S = 10.0  # per call (math-verify's own limits, off in a thread: 5 s parse + 5 s verify)
SETUP_TIMEOUT_S = 600.0  # importing the target and building its setup, once per worker
MAX_WORKERS = max(1, min(4, os.cpu_count() or 1))
MAX_CALLS = 10_000  # then the worker is retired (a scorer's caches do not grow forever)

_idle: list = []  # workers waiting for a call
_lock = threading.Lock()
_slots = threading.BoundedSemaphore(MAX_WORKERS)
_spawner = futures.ThreadPoolExecutor(1, thread_name_prefix="bounded-spawner")


class _Worker:
  """One worker process and this end of its socket pair."""

  def __init__(self):
    ours, theirs = socket.socketpair()
    path = os.pathsep.join(p for p in sys.path if p)  # the caller's modules import there too
    self.process = subprocess.Popen(
      [sys.executable, "-m", "rlpost.rewards.bounded", str(theirs.fileno()), str(os.getpid())],
      pass_fds=(theirs.fileno(),),
      stdin=subprocess.DEVNULL,
      env={**os.environ, "PYTHONPATH": path},
    )
    theirs.close()
    self.conn = connection.Connection(ours.detach())
    self.calls = 0

  def close(self):
    self.conn.close()
    self.process.kill()
    self.process.wait()


def _take() -> _Worker:
  """An idle worker, or a new one started by `_spawner`'s thread (it lives as long as this
  process: a worker's parent-death signal follows the thread that started it, and a
  rollout's pool threads come and go)."""
  with _lock:
    if _idle:
      return _idle.pop()
  return _spawner.submit(_Worker).result()


def _give_back(worker: _Worker) -> None:
  if worker.calls >= MAX_CALLS:
    worker.close()
    return
  with _lock:
    _idle.append(worker)


def _reply(worker: _Worker, wait_s: float):
  """The worker's next message, or None when none came in `wait_s` or it died."""
  try:
    return worker.conn.recv() if worker.conn.poll(wait_s) else None
  except (EOFError, OSError):
    return None


def _run(target: str, args: tuple, setup, timeout_s: float):
  """(message, worker): ("ok" | "error", value), or None when the target ran past
  `timeout_s` or its worker died while running it, or "dead" when the worker was gone
  before it started (an idle one that ended); the worker is closed unless it answered."""
  worker = _take()
  worker.calls += 1
  try:
    worker.conn.send((target, args, setup))
  except OSError:
    worker.close()
    return "dead"
  except BaseException:  # arguments that do not pickle: the caller's error
    worker.close()
    raise
  ready = _reply(worker, SETUP_TIMEOUT_S)
  if ready is None:
    ended = worker.process.poll() is not None  # before this call's work began
    worker.close()
    return "dead" if ended else None
  done = _reply(worker, timeout_s) if ready == ("ready",) else ready
  if done is None:
    worker.close()
  else:
    _give_back(worker)
  return done


def call(target: str, args: tuple, fallback, timeout_s: float | None = None, setup=None):
  """`target(*args)` (or `target(setup_value, *args)`, `setup` = ("module:function",
  args)) in a worker; `fallback` when it runs past `timeout_s` (None: TIMEOUT_S) or its
  worker dies running it. An exception in the target or its setup is raised here as
  RuntimeError with the worker's traceback."""
  timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
  with _slots:
    done = _run(target, args, setup, timeout_s)
    if done == "dead":  # not this call's doing: once more, on a new worker
      done = _run(target, args, setup, timeout_s)
  if done is None or done == "dead":
    logging.warning(
      "%s ran past %.0f s (or its worker died) on %.80r: %r instead",
      target,
      timeout_s,
      args,
      fallback,
    )
    return fallback
  status, value = done
  if status == "error":
    raise RuntimeError(f"{target} raised in its worker process:\n{value}")
  return value


def _function(target: str):
  module, _, name = target.partition(":")
  return getattr(importlib.import_module(module), name)


def _die_with(parent: int) -> None:
  """SIGKILL this worker when its parent ends (Linux), even in the middle of C code."""
  try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (AttributeError, OSError):  # not Linux: the closed pipe ends the loop instead
    pass
  if os.getppid() != parent:  # it ended before the line above
    os._exit(1)


def _serve(fd: int, parent: int) -> None:
  """The worker's loop: (target, args, setup) -> ("ready",), then ("ok", value) or
  ("error", traceback); setups are kept by their description."""
  _die_with(parent)
  conn = connection.Connection(fd)
  setups = {}
  for _ in range(MAX_CALLS):
    try:
      target, args, setup = conn.recv()
    except (EOFError, OSError):
      return
    try:
      fn = _function(target)
      if setup is not None and setup not in setups:
        setups[setup] = _function(setup[0])(*setup[1])
      pre = (setups[setup],) if setup is not None else ()
    except Exception:  # pylint: disable=broad-except  (told to the caller)
      conn.send(("error", traceback.format_exc()))
      continue
    conn.send(("ready",))
    try:
      conn.send(("ok", fn(*pre, *args)))
    except Exception:  # pylint: disable=broad-except  (told to the caller)
      conn.send(("error", traceback.format_exc()))


if __name__ == "__main__":
  _serve(int(sys.argv[1]), int(sys.argv[2]))
