"""Agents written against the `openai` client, played as episodes through the endpoint.

An agent is user code `run(client, task) -> reward` (a plain function given an
`openai.OpenAI`, or an `async def` given an `openai.AsyncOpenAI`) named `module:function`.
Each episode gets its own session URL (`Endpoint.session_url`), so the endpoint records
exactly the tokens it sampled for it; `play` runs a batch of episodes on threads (their
requests meet in the scheduler's batches) and returns, per episode, the reward and the
session's trainable segments (`sessions.segments`). An agent that raises, runs past
`timeout_s` or returns a reward that is not a finite number ends its episode with a named
error and weight 0; the others go on. (A timed-out agent's thread cannot be stopped: its
session is closed, so its later requests are answered but not recorded.) The scheduler
awaits every episode's first request (`scheduler.expect`): a batch being collected waits
for them (up to its max_wait_ms), so the first turns, started together, decode together.

The `openai` package is needed here (the `dev` extra has it).
"""

import asyncio
import concurrent.futures
import dataclasses
import inspect
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from rlpost import references
from rlpost.serve import scheduler
from rlpost.serve import sessions


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """agent: `module:function`; timeout_s: an episode's wall-clock limit; threads: episodes
  played at once."""

  agent: str
  timeout_s: float = 300.0
  threads: int = 32

  def __post_init__(self):
    if not self.timeout_s > 0:
      raise ValueError(f"AgentConfig.timeout_s={self.timeout_s} must be > 0 seconds")
    if self.threads < 1:
      raise ValueError(f"AgentConfig.threads={self.threads} must be >= 1")


@dataclasses.dataclass(frozen=True)
class Episode:
  """One agent episode: its task, reward (0 on error), weight (1, or 0 when the episode
  failed), error text or None, the session's segments and prefix breaks."""

  task: Any
  reward: float
  weight: float
  error: str | None
  segments: tuple
  prefix_breaks: int


def load(reference: str) -> Callable:
  """`module:function` -> the agent's function; ValueError naming the reference and the fix."""
  return references.function_at(reference, "agent", "run(client, task) -> reward")


def _run_one(endpoint, agent: Callable, task, session: str, shared) -> float:
  """One episode: a sync agent gets `shared` (one `openai.OpenAI` for the whole batch: a
  client costs ~20 ms to make) pointed at its session; an async one its own
  `openai.AsyncOpenAI` (an async client is bound to its episode's event loop)."""
  import openai  # pylint: disable=g-import-not-at-top  # only agent episodes need it

  url, key = endpoint.session_url(session), endpoint.api_key or "-"
  try:
    if inspect.iscoroutinefunction(agent):
      client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
      return asyncio.run(agent(client, task))
    return agent(shared.with_options(base_url=url), task)
  finally:
    scheduler.forget(endpoint.scheduler, session)  # an episode that never asked


def _shared_client(endpoint, agent: Callable):
  """The one sync client of a batch of episodes, or None for an async agent."""
  if inspect.iscoroutinefunction(agent):
    return None
  import openai  # pylint: disable=g-import-not-at-top

  return openai.OpenAI(base_url=endpoint.url, api_key=endpoint.api_key or "-", max_retries=0)


def _reward(future, wait_s: float, timeout_s: float) -> tuple[float, str | None]:
  try:
    value = future.result(timeout=wait_s)
  except concurrent.futures.TimeoutError:
    return 0.0, f"agent timed out after {timeout_s} s (timeout_s)"
  except Exception as e:  # noqa: BLE001  (user code: any failure ends its episode only)
    return 0.0, f"agent raised {type(e).__name__}: {e}"
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    return 0.0, f"agent returned reward {value!r}; it must be a finite number"
  return float(value), None


def play(endpoint, agent: Callable, tasks: list, config: AgentConfig) -> list[Episode]:
  """Plays one episode per task (repeat a task for a group) on up to `config.threads`
  threads; each wave of `threads` episodes has `timeout_s`. Returns the episodes in
  `tasks`' order."""
  run = uuid.uuid4().hex[:12]
  names = [f"{run}-{i}" for i in range(len(tasks))]
  pool = concurrent.futures.ThreadPoolExecutor(config.threads, thread_name_prefix="agent")
  shared = _shared_client(endpoint, agent)
  scheduler.expect(endpoint.scheduler, names[: config.threads])  # the first wave starts together
  try:
    futures = [pool.submit(_run_one, endpoint, agent, t, s, shared) for t, s in zip(tasks, names)]
    waves = -(-len(tasks) // config.threads)
    deadline = time.monotonic() + config.timeout_s * waves
    episodes = []
    for task, session, future in zip(tasks, names, futures):
      reward, error = _reward(future, max(0.0, deadline - time.monotonic()), config.timeout_s)
      segments, breaks = sessions.segments(sessions.take(endpoint.recorder, session, close=True))
      weight = 0.0 if error else 1.0
      episodes.append(Episode(task, reward, weight, error, tuple(segments), breaks))
    return episodes
  finally:
    pool.shutdown(wait=False, cancel_futures=True)
    if shared is not None and all(f.done() for f in futures):
      shared.close()  # a timed-out agent may still be using it
