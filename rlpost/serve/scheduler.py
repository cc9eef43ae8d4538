"""The one thread that owns the model: concurrent requests decoded in batched calls.

Requests wait in a queue. The scheduler takes the first, then keeps taking while they
arrive (each within `batch_window_ms` of the last, for at most `max_wait_ms`) or until
`max_batch` rows are waiting, whichever comes first; it groups
the rows by their sampler settings (temperature, top_p: static in the sampler) and runs
`engine.generate` once per group (at most `max_batch` rows a call). A request's `n`
choices are rows of its batch. A request whose caller gave up (timeout, disconnect)
before its batch started is dropped, so its rows are never decoded.
"""

import concurrent.futures
import dataclasses
import itertools
import queue
import threading
import time

from rlpost.serve import engine as engine_lib
from rlpost.serve import finish


@dataclasses.dataclass(frozen=True)
class BatchConfig:
  """max_batch: rows per sampler call; batch_window_ms: a batch closes when no request has
  arrived for this long (a lone request waits this long for companions); max_wait_ms:
  and at the latest this long after its first request (a burst of agents, whose requests
  trickle in over a few milliseconds, stays one batch)."""

  max_batch: int = 32
  batch_window_ms: float = 20.0
  max_wait_ms: float = 200.0

  def __post_init__(self):
    if self.max_batch < 1:
      raise ValueError(f"BatchConfig.max_batch={self.max_batch} must be >= 1 row")
    if not self.batch_window_ms >= 0:
      raise ValueError(f"BatchConfig.batch_window_ms={self.batch_window_ms} must be >= 0")
    if not self.max_wait_ms >= self.batch_window_ms:
      raise ValueError(
        f"BatchConfig.max_wait_ms={self.max_wait_ms} must be >= batch_window_ms="
        f"{self.batch_window_ms}"
      )


@dataclasses.dataclass(frozen=True, eq=False)
class Scheduler:
  """A running scheduler: its inbox, its thread, the event that stops it, and a count of
  sampler calls (`calls[0]`, for tests and benchmarks)."""

  inbox: queue.Queue
  thread: threading.Thread
  stopping: threading.Event
  calls: list


def start(engine, config: BatchConfig) -> Scheduler:
  inbox, stopping, calls = queue.Queue(), threading.Event(), [0]
  thread = threading.Thread(
    target=_loop, args=(engine, config, inbox, stopping, calls), name="rlpost-serve", daemon=True
  )
  thread.start()
  return Scheduler(inbox, thread, stopping, calls)


def stop(scheduler: Scheduler) -> None:
  scheduler.stopping.set()
  scheduler.thread.join()


def submit(scheduler: Scheduler, gen) -> concurrent.futures.Future:
  """Queues request `gen` (request_bodies.Generation); the future's result is its [finish.Choice]."""
  future = concurrent.futures.Future()
  scheduler.inbox.put((gen, future))
  return future


def _collect(inbox: queue.Queue, config: BatchConfig, stopping: threading.Event) -> list:
  """The next batch of (gen, future): the first waiting request, then more until none has
  arrived for batch_window_ms, max_wait_ms have passed since the first, or max_batch rows
  wait."""
  while not stopping.is_set():
    try:
      batch = [inbox.get(timeout=0.05)]
      break
    except queue.Empty:
      continue
  else:
    return []
  first = last = time.monotonic()
  while sum(g.n for g, _ in batch) < config.max_batch:
    close = min(last + config.batch_window_ms / 1000, first + config.max_wait_ms / 1000)
    try:
      batch.append(inbox.get(timeout=max(0.0, close - time.monotonic())))
    except queue.Empty:
      break
    last = time.monotonic()
  return [(g, f) for g, f in batch if f.set_running_or_notify_cancel()]


def _loop(engine, config, inbox, stopping, calls) -> None:
  while not stopping.is_set():
    batch = _collect(inbox, config, stopping)
    try:
      _run(engine, config, batch, calls)
    except Exception as e:  # noqa: BLE001  (a bug answers 500s; the loop goes on)
      for _, future in batch:
        if not future.done():
          future.set_exception(e)


def _run(engine, config, batch: list, calls: list) -> None:
  """Decodes every request of `batch` (a sampler call per settings group and max_batch
  rows) and resolves each future with its choices or the error of its call."""
  groups = {}
  for job, (gen, _) in enumerate(batch):
    key = _settings(engine, gen)
    for i in range(gen.n):
      row = engine_lib.Row(
        gen.prompt_ids, gen.max_tokens, engine_lib.row_id(gen.seed, i), gen.top_logprobs
      )
      groups.setdefault(key, []).append((job, i, row))
  outputs, failed = {}, {}
  for (temperature, top_p), rows in groups.items():
    for chunk in _chunks(rows, config.max_batch):
      try:
        outs = engine_lib.generate(engine, [r for _, _, r in chunk], temperature, top_p)
        calls[0] += 1
      except Exception as e:  # noqa: BLE001  (its requests fail; the others go on)
        failed.update({job: e for job, _, _ in chunk})
        continue
      outputs.update({(job, i): out for (job, i, _), out in zip(chunk, outs)})
  for job, (gen, future) in enumerate(batch):
    if job in failed:
      future.set_exception(failed[job])
    else:
      future.set_result(
        [finish.finish(engine.tokenizer, gen, i, outputs[job, i]) for i in range(gen.n)]
      )


def _settings(engine, gen) -> tuple[float, float]:
  """(temperature, top_p) a request samples at: the engine's fixed temperature when set."""
  if engine.temperature is not None:
    return (engine.temperature, 1.0) if engine.temperature > 0 else (0.0, 1.0)
  return (gen.temperature, gen.top_p) if gen.temperature > 0 else (0.0, 1.0)


def _chunks(rows: list, size: int):
  it = iter(rows)
  while chunk := list(itertools.islice(it, size)):
    yield chunk
