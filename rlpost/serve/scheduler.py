"""The one thread that owns the model: rows join and leave a running batch (continuous
batching).

Requests wait in a queue. The loop: take what has arrived (when fewer than half the
slots decode, also those following it within `batch_window_ms` of each other, at most
`max_wait_ms`: a burst of agents is admitted in one prefill and decodes in step), admit waiting choices into
free slots (`pool.admit`), run one chunk of `chunk_steps` decode steps, hand each
request its new tokens (`Ticket.updates`: what a stream writes as it goes), and finish
the rows that ended: a stop id, the budget, a stop string in their text (found after
each chunk, so the slot is freed at once) or a caller that went away (`Ticket.gone`).

Rows are grouped by their sampler setting (temperature, top_p: static in the sampler),
one slot pool each (`pool.Pool`, `max_batch` slots rounded up to a power of two); pools
take turns chunk by chunk. A request's `n` choices are rows; choice 0 of a request
under a session may continue that session's kept slot.
"""

import concurrent.futures
import dataclasses
import queue
import threading
import time

from rlpost.serve import engine as engine_lib
from rlpost.serve import finish
from rlpost.serve import pool as pool_lib

MAX_POOLS = 4  # settings with slots at once; an idle pool is dropped for a new one


@dataclasses.dataclass(frozen=True)
class BatchConfig:
  """max_batch: row slots per setting (rounded up to a power of two); batch_window_ms /
  max_wait_ms: when nothing decodes, how long a first request waits for companions (a
  gap of batch_window_ms closes the group, max_wait_ms caps it); chunk_steps: decode
  steps per jitted call (a request's tokens reach it, and new rows join, between chunks)."""

  max_batch: int = 32
  batch_window_ms: float = 20.0
  max_wait_ms: float = 200.0
  chunk_steps: int = 8

  def __post_init__(self):
    if self.max_batch < 1:
      raise ValueError(f"BatchConfig.max_batch={self.max_batch} must be >= 1 row")
    if self.chunk_steps < 1:
      raise ValueError(f"BatchConfig.chunk_steps={self.chunk_steps} must be >= 1 step")
    if not self.batch_window_ms >= 0:
      raise ValueError(f"BatchConfig.batch_window_ms={self.batch_window_ms} must be >= 0")
    if not self.max_wait_ms >= self.batch_window_ms:
      raise ValueError(
        f"BatchConfig.max_wait_ms={self.max_wait_ms} must be >= batch_window_ms="
        f"{self.batch_window_ms}"
      )


class Ticket(concurrent.futures.Future):
  """A submitted request: the future of its [finish.Choice], `updates` (("tokens", index,
  (ids, logprobs) so far) after each chunk of a streaming request, ("done", index, Choice) when a choice ends), `gone` (set
  by the caller that went away: its rows stop at the next chunk) and its `session`."""

  def __init__(self, session: str | None = None):
    super().__init__()
    self.updates = queue.Queue()
    self.gone = threading.Event()
    self.session = session


@dataclasses.dataclass(frozen=True, eq=False)
class Awaited:
  """The sessions whose first request a batch waits for (`expect`; `lock` guards them)."""

  sessions: set = dataclasses.field(default_factory=set)
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass(frozen=True, eq=False)
class Scheduler:
  """A running scheduler: its inbox, its thread, the event that stops it, its counters
  (`stats`: chunks, admissions, prefilled_tokens, cache_hits, cache_misses, max_live
  rows, cancelled rows, compactions) and the sessions it awaits (`expect`)."""

  inbox: queue.Queue
  thread: threading.Thread
  stopping: threading.Event
  stats: dict
  awaited: Awaited


def start(engine, config: BatchConfig) -> Scheduler:
  inbox, stopping, stats, awaited = (
    queue.Queue(),
    threading.Event(),
    pool_lib.new_stats(),
    Awaited(),
  )
  thread = threading.Thread(
    target=_loop,
    args=(engine, config, inbox, stopping, stats, awaited),
    name="rlpost-serve",
    daemon=True,
  )
  thread.start()
  return Scheduler(inbox, thread, stopping, stats, awaited)


def expect(scheduler: Scheduler, sessions) -> None:
  """Announces episodes about to start: until each of `sessions` has sent its first request
  (or is `forget`-ten), a batch being collected waits for it (at most max_wait_ms), so
  agents started together are admitted together however their requests are spaced."""
  with scheduler.awaited.lock:
    scheduler.awaited.sessions.update(sessions)


def forget(scheduler: Scheduler, session: str) -> None:
  """`session` is no longer awaited (its first request came, or its episode ended)."""
  with scheduler.awaited.lock:
    scheduler.awaited.sessions.discard(session)


def stop(scheduler: Scheduler) -> None:
  scheduler.stopping.set()
  scheduler.thread.join()


def submit(scheduler: Scheduler, gen, session: str | None = None) -> Ticket:
  """Queues request `gen` (request_bodies.Generation); see `Ticket`."""
  ticket = Ticket(session)
  scheduler.inbox.put((gen, ticket))
  if session is not None:
    forget(scheduler, session)  # after the put: a batch never closes between the two
  return ticket


def _collect(inbox: queue.Queue, config: BatchConfig, stopping, awaited: Awaited) -> list:
  """The next group of (gen, future) when nothing decodes: the first waiting request, then
  more (`_more`). Cancelled futures are dropped."""
  while not stopping.is_set():
    try:
      batch = [inbox.get(timeout=0.05)]
      break
    except queue.Empty:
      continue
  else:
    return []
  return _running(_more(inbox, config, batch, awaited))


def _more(inbox: queue.Queue, config: BatchConfig, batch: list, awaited: Awaited) -> list:
  """`batch` and the requests that follow it until none has arrived for batch_window_ms
  and no awaited session's first request is missing, max_wait_ms have passed, or
  max_batch rows wait."""
  first = last = time.monotonic()
  window, cap = config.batch_window_ms / 1000, first + config.max_wait_ms / 1000
  while sum(g.n for g, _ in batch) < config.max_batch:
    now = time.monotonic()
    if now >= cap or (now >= last + window and not awaited.sessions):
      break
    wait = last + window - now if now < last + window else max(window, 0.005)  # awaited: poll
    try:
      batch.append(inbox.get(timeout=min(wait, cap - now)))
    except queue.Empty:
      continue
    last = time.monotonic()
  return batch


def _drain(inbox: queue.Queue, config: BatchConfig, live: int, awaited: Awaited) -> list:
  """What arrived while rows decode; when fewer than half the slots decode, the requests
  that follow it too (`_more`: agents whose turns end together join together, not one
  chunk apart)."""
  out = []
  while True:
    try:
      out.append(inbox.get_nowait())
    except queue.Empty:
      break
  if out and live < config.max_batch // 2:
    out = _more(inbox, config, out, awaited)
  return _running(out)


def _running(batch: list) -> list:
  return [(g, f) for g, f in batch if f.set_running_or_notify_cancel()]


@dataclasses.dataclass(eq=False)
class _Request:
  """A request in flight: its Generation, ticket, settings, and choices as they end."""

  gen: object
  ticket: Ticket
  settings: tuple
  choices: list


def _loop(engine, config, inbox, stopping, stats, awaited) -> None:
  try:  # once, while the first requests arrive (`engine_lib.for_decoding`)
    decoding = engine_lib.for_decoding(engine)
  except Exception:  # noqa: BLE001  (tried again at the first turn, whose requests get its error)
    decoding = None
  pools, waiting = {}, []
  while not stopping.is_set():
    live = sum(len(pool_lib.live(p)) for p in pools.values())
    if waiting or live:
      arrived = _drain(inbox, config, live, awaited)
    else:
      arrived = _collect(inbox, config, stopping, awaited)
    for gen, ticket in arrived:
      request = _Request(gen, ticket, _settings(engine, gen), [None] * gen.n)
      session = ticket.session
      for i in range(gen.n):
        row = engine_lib.row_id(gen.seed, i)
        waiting.append(
          pool_lib.Job(gen.prompt_ids, gen.max_tokens, row, session if i == 0 else None, request, i)
        )
    try:
      decoding = decoding or engine_lib.for_decoding(engine)
      waiting = _turn(engine, decoding, config, pools, waiting, stats)
    except Exception as e:  # noqa: BLE001  (a bug answers 500s; the loop goes on)
      _fail_all(pools, waiting, e)
      pools, waiting = {}, []


def _turn(engine, decoding, config, pools: dict, waiting: list, stats: dict) -> list:
  """Drops abandoned jobs, admits waiting ones, runs one chunk per pool (with `decoding`,
  the engine in the decode layout); returns the jobs still waiting."""
  waiting = [j for j in waiting if not _gone(j.owner)]
  for settings in {j.owner.settings for j in waiting}:
    if settings not in pools:
      _make_room(pools)
      rows = engine_lib.bucket(config.max_batch, 1)
      pools[settings] = pool_lib.new_pool(decoding, *settings, rows, stats)
  left = []
  for settings, pool in pools.items():
    mine = [j for j in waiting if j.owner.settings == settings]
    if mine:
      left += pool_lib.admit(decoding, pool, mine)
      _send_tokens(pool, [i for i in pool_lib.live(pool) if pool.lanes[i].job in mine])
  for pool in pools.values():
    gone = [i for i in pool_lib.live(pool) if _gone(pool.lanes[i].job.owner)]
    stats["cancelled"] += len(gone)
    pool_lib.release(pool, gone, cancel=True)
    if pool_lib.live(pool):
      ended = pool_lib.step(decoding, pool, config.chunk_steps)
      _deliver(engine, pool, ended)
  return sorted(left, key=waiting.index)


def _make_room(pools: dict) -> None:
  if len(pools) >= MAX_POOLS:
    for settings in [s for s, p in pools.items() if not pool_lib.live(p)][:1]:
      del pools[settings]


def _gone(request: _Request) -> bool:
  return request.ticket.gone.is_set() or request.ticket.done()


def _deliver(engine, pool, ended: list[int]) -> None:
  """Sends each live row's tokens to its request; finishes the rows that ended or whose
  text holds a stop string."""
  cut = []
  for i in pool_lib.live(pool):
    lane = pool.lanes[i]
    request = lane.job.owner
    stops = request.gen.stop + request.gen.keep_stops
    if i not in ended and stops and finish.first_stop(engine.tokenizer, lane.ids, stops):
      cut.append(i)
  _send_tokens(pool, [i for i in pool_lib.live(pool) if i not in ended + cut])
  for i in ended + cut:
    lane = pool.lanes[i]
    _finish_choice(engine, pool, lane.job.owner, lane.job.index, lane)
  pool_lib.release(pool, ended, cancel=False)
  pool_lib.release(pool, cut, cancel=True)


def _send_tokens(pool, lanes: list[int]) -> None:
  """Hands each streaming request of `lanes` its choice's tokens so far (token 0 comes
  with the admission: a stream's first content waits for no decode chunk)."""
  for i in lanes:
    lane = pool.lanes[i]
    if lane.job.owner.gen.stream:
      update = (tuple(lane.ids), tuple(lane.logprobs))
      lane.job.owner.ticket.updates.put(("tokens", lane.job.index, update))


def _finish_choice(engine, pool, request: _Request, index: int, lane) -> None:
  gen = request.gen
  ids = lane.ids[: gen.max_tokens]
  stopped = bool(ids) and ids[-1] in pool.config.stop_ids
  top = engine_lib.top_alternatives(engine, gen, ids, pool.config) if gen.top_logprobs else None
  out = engine_lib.RowOutput(ids, lane.logprobs[: len(ids)], top, stopped)
  choice = finish.finish(engine.tokenizer, gen, index, out)
  request.choices[index] = choice
  request.ticket.updates.put(("done", index, choice))
  if all(c is not None for c in request.choices):
    request.ticket.set_result(request.choices)


def _fail_all(pools: dict, waiting: list, error: Exception) -> None:
  owners = {id(j.owner): j.owner for j in waiting}
  for p in pools.values():
    owners.update({id(lane.job.owner): lane.job.owner for lane in p.lanes if lane.job})
  for request in owners.values():
    if not request.ticket.done():
      request.ticket.set_exception(error)


def _settings(engine, gen) -> tuple[float, float]:
  """(temperature, top_p) a request samples at: the engine's fixed temperature when set."""
  if engine.temperature is not None:
    return (engine.temperature, 1.0) if engine.temperature > 0 else (0.0, 1.0)
  return (gen.temperature, gen.top_p) if gen.temperature > 0 else (0.0, 1.0)
