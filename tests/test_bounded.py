"""rlpost.rewards.bounded: scorers run in worker processes with a time limit, and the
scorers that use it (math-verify, reasoning-gym's score_answer) on replies that never
finish parsing."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent import futures

import pytest
from optional_packages import require

from rlpost.envs import protocol
from rlpost.envs import reasoning_gym as rg_env
from rlpost.rewards import bounded
from rlpost.rewards import checkers

_TARGETS = "bounded_targets"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
    return f.read().split()[2] != "Z"  # a zombie has ended


def test_a_worker_serves_calls_with_its_setup_built_once_outside_the_limit():
  """The value comes back; one worker serves consecutive calls; the setup runs once per
  worker and its time (1 s here) is not charged to a 0.5 s limit. Mutation caught: the
  setup rebuilt on every call."""
  setup = (f"{_TARGETS}:counted_setup", (1.0,))
  first = bounded.call(f"{_TARGETS}:with_setup", (1,), "late", timeout_s=0.5, setup=setup)
  second = bounded.call(f"{_TARGETS}:with_setup", (2,), "late", timeout_s=0.5, setup=setup)
  assert first[:2] == (1, 1) and second[:2] == (1, 2) and first[2] == second[2] != os.getpid()


def test_workers_outlive_the_threads_that_call_them_and_a_dead_idle_one_is_replaced(monkeypatch):
  """A rollout's pool threads come and go: a worker first used from a thread that has since
  ended serves the next call (same pid), and when an idle worker has died, the call gets
  its answer from a new one, not the fallback. Mutations caught: the worker started from
  the calling thread (its parent-death signal kills it when that thread ends); a dead idle
  worker's call given the fallback."""
  monkeypatch.setattr(bounded, "_idle", [])  # the thread below starts a worker
  with futures.ThreadPoolExecutor(1) as pool:
    first = pool.submit(bounded.call, "os:getpid", (), None).result()
  assert bounded.call("os:getpid", (), None) == first
  os.kill(first, signal.SIGKILL)
  time.sleep(0.5)
  assert bounded.call("os:getpid", (), "fallback") not in ("fallback", first)


def test_past_the_limit_the_worker_is_killed_and_the_fallback_returned(tmp_path):
  """A target in C code that never returns (9 ** 9 ** 9 ** 9): the caller gets the
  fallback after the limit, that worker is gone, and the next call gets an answer from a
  new one. An exception in the target is raised in the caller with its traceback."""
  pid_path = tmp_path / "pid"
  start = time.monotonic()
  assert bounded.call(f"{_TARGETS}:hang", (str(pid_path),), "fallback", timeout_s=1) == "fallback"
  assert time.monotonic() - start < 30
  assert not _alive(int(pid_path.read_text()))
  assert bounded.call("os.path:join", ("a", "b"), None) == os.path.join("a", "b")
  with pytest.raises(RuntimeError, match="ZeroDivisionError"):
    bounded.call("operator:truediv", (1, 0), None)


def test_a_worker_dies_with_its_parent(tmp_path):
  """Kill -9 the process that called (mid-call, its worker computing forever): the worker
  ends too, not an orphan spending a core. Mutation caught: PR_SET_PDEATHSIG not set."""
  pid_path = tmp_path / "pid"
  script = textwrap.dedent(f"""
    from rlpost.rewards import bounded
    bounded.call("{_TARGETS}:hang", ({str(pid_path)!r},), None, timeout_s=600)
  """)
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([_HERE, *sys.path])}
  parent = subprocess.Popen([sys.executable, "-c", script], env=env)
  deadline = time.monotonic() + 60
  while not pid_path.exists() or not pid_path.read_text():
    assert time.monotonic() < deadline and parent.poll() is None
    time.sleep(0.1)
  worker = int(pid_path.read_text())
  parent.kill()
  parent.wait()
  deadline = time.monotonic() + 10
  while _alive(worker) and time.monotonic() < deadline:
    time.sleep(0.1)
  try:
    assert not _alive(worker)
  finally:
    if _alive(worker):  # a failing run leaves no orphan
      os.kill(worker, signal.SIGKILL)


@pytest.mark.slow
def test_math_verify_and_score_answer_give_up_on_a_reply_that_never_parses(monkeypatch):
  """math-verify on "9^9^9^9" and reasoning-gym countdown's score_answer on "9**9**9**9"
  compute the number (hours); both score 0 after the limit, and ordinary answers are still
  judged. Mutation caught: math_verify called in this process."""
  require("math_verify")
  rg = require("reasoning_gym")
  monkeypatch.setattr(bounded, "TIMEOUT_S", 2.0)
  start = time.monotonic()
  assert checkers.math_verify("9^9^9^9", "5") is False
  assert checkers.math_verify("\\frac{1}{2}", "0.5") is True
  tasks = rg_env.build(rg_env.ReasoningGymConfig(task="countdown", pool=4), protocol.RunInfo())
  state = tasks.train_tasks([0])[0]
  assert tasks.env.step(state, "<answer>9**9**9**9</answer>").reward == 0.0
  gold = rg.create_dataset("countdown", seed=0, size=4)[0]["answer"]
  assert tasks.env.step(state, f"<answer>{gold}</answer>").reward == 1.0
  assert time.monotonic() - start < 60
