"""The host side of a slot pool: which request each slot decodes, and what it keeps.

One `Pool` per sampler setting (temperature, top_p are static in the sampler); it is
owned by the scheduler thread alone (its fields change as rows join and leave). A
`Lane` is one slot's record: the job it decodes (a request's choice), the tokens its
cache columns hold (`cached`: the prompt and every emitted token but the last, which is
never run through the model) and the session it is kept for after its job ends.

Admission (`admit`): a job whose session's lane still holds a prefix of its prompt
continues there, prefilling only the rest (a cache hit); any other takes a free lane, or
the least recently used kept one (a miss). The new tokens go in the columns just before
the new write index, which moves past every kept history it has to (the other rows'
skipped columns stay unattended). When a chunk or an admission would pass the last
column, `slots.compact` packs the histories and resizes the pool (a power of two).
"""

import dataclasses
import time

import jax
import numpy as np

from rlpost.serve import engine as engine_lib
from rlpost.serve import slots as slots_lib

# A pool's columns: a power of two from here (few programs to compile). Every step reads
# every column of its rows' cache: from 256, Gemma 3 270M's agent episodes (64 + 24
# tokens) decoded 8 rows at ~185 ms a step, from 128 the iteration's rollout took 1.19x
# the Env's instead of 1.38x (issue 68's perf session).
MIN_COLUMNS = 128
HEADROOM = 16  # columns a compaction leaves free beyond what is asked
KEEP_IDLE_S = 60.0  # a session's kept slot unused this long is dropped at a compaction


def admission_rows(n: int, rows: int) -> int:
  """Rows a chunk of n live rows runs with: a power of two, at most the pool's rows (an
  admission's parts are powers of two too: `_parts`). (Powers of four compiled fewer programs but ran 8 live rows as 16: a real model's
  step is mostly its unembedding, whose cost grows with the rows, and an agent
  iteration's 8 episodes decoded at 2x an `Env` rollout's cost, Gemma 3 270M.)"""
  return min(1 << (max(n, 1) - 1).bit_length(), rows)


@dataclasses.dataclass(eq=False)
class Job:
  """One choice to decode: its request's prompt ids and budget, the row id its tokens
  draw from, the session it may continue, and `owner` (what the scheduler resolves)."""

  prompt: tuple[int, ...]
  budget: int
  row_id: int
  session: str | None
  owner: object
  index: int = 0


@dataclasses.dataclass(eq=False)
class Lane:
  """job (None: free or kept), emitted ids and logprobs of the job, cached (the tokens its
  columns hold, in order), end (a column past its last valid one), session, last use."""

  job: Job | None = None
  ids: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  cached: tuple = ()
  end: int = 0
  session: str | None = None
  used: float = 0.0


@dataclasses.dataclass(eq=False)
class Pool:
  """A setting's slots on device, its lanes, the host copy of the write index, and the
  scheduler's counters (`stats`: prefilled tokens, cache hits and misses, ...)."""

  config: object  # sampling.SamplingConfig
  slots: slots_lib.Slots
  lanes: list
  stats: dict

  @property
  def write_index(self) -> int:
    return int(self.slots.cache["index"])

  @property
  def columns(self) -> int:
    return self.slots.valid.shape[1]


def new_stats() -> dict:
  """The counters a scheduler's pools share (`Scheduler.stats`)."""
  names = ("chunks", "admissions", "prefilled_tokens", "cache_hits", "cache_misses")
  return dict.fromkeys(names + ("max_live", "cancelled", "compactions"), 0)


def new_pool(engine, temperature, top_p, rows: int, stats: dict, columns=MIN_COLUMNS) -> Pool:
  config = engine_lib.sampling_config(engine, temperature, top_p, 1)
  dtype = engine.params["embed"].dtype
  slots = slots_lib.init(engine.model_config, rows, columns, dtype)
  return Pool(config, slots, [Lane() for _ in range(rows)], stats)


def live(pool: Pool) -> list[int]:
  return [i for i, lane in enumerate(pool.lanes) if lane.job is not None]


def _common(a: tuple, b: tuple) -> int:
  n = min(len(a), len(b))
  diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
  return int(diff[0]) if diff.size else n


def _place(pool: Pool, job: Job, taken: set) -> tuple[int, int] | None:
  """(lane, tokens kept) for `job`: its session's lane when it holds a prefix of the
  prompt (leaving at least one token to prefill), else a free lane, else the least
  recently used kept one; None when every lane decodes."""
  for i, lane in enumerate(pool.lanes):
    if job.session and lane.session == job.session and lane.job is None and i not in taken:
      keep = min(_common(lane.cached, job.prompt), len(job.prompt) - 1)
      if keep > 0:
        return i, keep
      lane.session = None  # the prompt left the record: the lane is free
  spare = [i for i, lane in enumerate(pool.lanes) if lane.job is None and i not in taken]
  if not spare:
    return None
  return min(spare, key=lambda i: (pool.lanes[i].session is not None, pool.lanes[i].used)), 0


def admit(engine, pool: Pool, jobs: list[Job]) -> list[Job]:
  """Admits as many of `jobs` (in order) as lanes allow; returns the ones left waiting."""
  placed, taken = [], set()
  for n, job in enumerate(jobs):
    spot = _place(pool, job, taken)
    if spot is None:
      jobs_left = jobs[n:]
      break
    placed.append((job, *spot))
    taken.add(spot[0])
  else:
    jobs_left = []
  if not placed:
    return jobs_left
  groups = [[p for p in placed if not p[2]], [p for p in placed if p[2]]]  # fresh, continued
  widths = [_width(g) for g in groups]
  if _end(pool, groups[1], widths) + 1 > pool.columns:  # fresh rows need columns < width
    _compact(pool, widths[1] + 1, floor=widths[0] + 1)
  end = _end(pool, groups[1], widths)
  for group, width in zip(groups, widths):
    for part in _parts(group):
      _admit_device(engine, pool, part, width, end)
  return jobs_left


def _parts(placed: list) -> list[list]:
  """`placed` in runs of a power of two rows, largest first (20 rows: 16 + 4): a prefill
  costs what its rows do, and 20 rows padded to 32 prefilled 12 copies of one."""
  parts, done = [], 0
  while done < len(placed):
    n = 1 << (len(placed) - done).bit_length() - 1
    parts.append(placed[done : done + n])
    done += n
  return parts


def _width(group: list) -> int:
  """The prefill width of (job, lane, kept) rows: their new tokens' bucket (0: none)."""
  if not group:
    return 0
  new = max(len(j.prompt) - k for j, _, k in group)
  return engine_lib.bucket(new, engine_lib.MIN_PROMPT_BUCKET)


def _end(pool: Pool, continued: list, widths: list) -> int:
  """The write index after an admission: past the continued rows' histories by their
  width, at least the fresh rows' width, never back."""
  after = max((pool.lanes[i].end for _, i, _ in continued), default=0)
  return max(pool.write_index, after + widths[1], widths[0])


def _admit_device(engine, pool: Pool, placed: list, width: int, end: int) -> None:
  """One prefill of `placed` ((job, lane, kept) rows: a power of two, `_parts`)."""
  tokens = np.full((len(placed), width), pool.config.pad_id, np.int32)
  for r, (job, _, keep) in enumerate(placed):
    new = job.prompt[keep:]
    tokens[r, width - len(new) :] = new
  column = lambda f: np.asarray([f(job, i, keep) for job, i, keep in placed], np.int32)
  pool.slots, token0, logp0 = slots_lib.admit(
    engine.params,
    pool.slots,
    column(lambda j, i, k: i),
    tokens,
    column(lambda j, i, k: len(j.prompt) - k),
    column(lambda j, i, k: k),
    column(lambda j, i, k: j.row_id),
    column(lambda j, i, k: j.budget),
    np.int32(end),
    model_config=engine.model_config,
    config=pool.config,
    fresh=not placed[0][2],
  )
  token0, logp0 = jax.device_get((token0, logp0))
  now = time.monotonic()
  for r, (job, i, keep) in enumerate(placed):
    hit = keep > 0
    pool.stats["cache_hits" if hit else "cache_misses"] += bool(job.session)
    pool.stats["prefilled_tokens"] += len(job.prompt) - keep
    pool.lanes[i] = Lane(
      job, [int(token0[r])], [float(logp0[r])], job.prompt, end, job.session, now
    )
  pool.stats["admissions"] += 1


def _compact(pool: Pool, room: int, floor: int = 0) -> None:
  """Packs every kept history to the left (free lanes' columns dropped, and sessions idle
  for KEEP_IDLE_S) and resizes the pool to fit the longest plus `room` columns (at least
  `floor`) and HEADROOM."""
  now = time.monotonic()
  for lane in pool.lanes:
    if lane.job is None and now - lane.used > KEEP_IDLE_S:
      lane.session = None
  keep = [lane.job is not None or lane.session is not None for lane in pool.lanes]
  counts = [len(lane.cached) if k else 0 for lane, k in zip(pool.lanes, keep)]
  size = engine_lib.bucket(max(max(counts) + room, floor) + HEADROOM, MIN_COLUMNS)
  slots = pool.slots
  slots = slots_lib.Slots(**{**vars(slots), "valid": slots.valid & np.asarray(keep)[:, None]})
  pool.slots = slots_lib.compact(slots, size=size)
  for lane, count in zip(pool.lanes, counts):
    lane.end = count
  pool.stats["compactions"] += 1


def step(engine, pool: Pool, steps: int) -> list[int]:
  """One chunk of `steps` decode steps; appends each live lane's new tokens and returns
  the lanes whose rows ended (stop id or budget) in it."""
  if pool.write_index + steps > pool.columns:
    _compact(pool, steps)
  before, rows, R = pool.write_index, live(pool), len(pool.lanes)
  B = admission_rows(len(rows), R)
  spare = [i for i in range(R) if i not in rows]
  rows_B = None if B == R else np.asarray(rows + spare[: B - len(rows)], np.int32)
  pool.slots, *out = slots_lib.step_chunk(
    engine.params,
    pool.slots,
    rows_B,
    model_config=engine.model_config,
    config=pool.config,
    steps=steps,
  )
  tokens, logprobs, count, done = jax.device_get(out)
  ended = []
  for b, i in zip(rows if B == R else range(len(rows)), rows):  # live rows lead rows_B
    lane = pool.lanes[i]
    new = int(count[b]) - len(lane.ids)
    if new > 0:
      lane.ids += tokens[b, :new].tolist()
      lane.logprobs += logprobs[b, :new].tolist()
      lane.cached = lane.job.prompt + tuple(lane.ids[:-1])
      lane.end = before + new
    if done[b]:
      ended.append(i)
  pool.stats["chunks"] += 1
  pool.stats["max_live"] = max(pool.stats["max_live"], len(live(pool)))
  return ended


def release(pool: Pool, lanes: list[int], cancel: bool) -> None:
  """Ends the jobs of `lanes`: a session's lane is kept for its next turn, any other is
  freed; `cancel`: their rows are still decoding (stop them now)."""
  if cancel and lanes:
    pool.slots = slots_lib.cancel(pool.slots, lanes)
  now = time.monotonic()
  for i in lanes:
    lane = pool.lanes[i]
    if lane.job is not None:
      lane.cached = lane.job.prompt + tuple(lane.ids[:-1])
    lane.job, lane.used = None, now


def warm_up(engine, max_rows: int, max_prompt: int, temperature=0.0, top_p=1.0, steps=8) -> int:
  """Compiles the programs a pool of `max_rows` slots runs at one setting for prompts of
  up to `max_prompt` tokens and `engine.max_tokens` new ones: at every column count on
  the way, for every (rows, prefill width) bucket an admission, a chunk of `steps` and a
  session's continuation, and the compactions to the other counts (with the params in
  the decode layout, as the scheduler runs them). Returns the number of admission shapes."""
  engine = engine_lib.for_decoding(engine)
  rows = engine_lib.bucket(max_rows, 1)
  width = engine_lib.bucket(max_prompt, engine_lib.MIN_PROMPT_BUCKET)
  # the most a compaction asks: the longest history, an admission's width, HEADROOM
  top = engine_lib.bucket(max_prompt + engine.max_tokens + width + 1 + HEADROOM, MIN_COLUMNS)
  sizes = list(engine_lib.powers(MIN_COLUMNS, top))
  widths = engine_lib.powers(engine_lib.MIN_PROMPT_BUCKET, width)
  counts = sorted({admission_rows(n, rows) for n in range(1, rows + 1)})
  shapes = 0
  for width in widths:
    for size in [s for s in sizes if s > width]:  # an admission compacts to fit first
      pool = new_pool(engine, temperature, top_p, rows, new_stats(), size)
      for count in counts:
        bos = (engine.tokenizer.bos_id,) * width
        jobs = [Job(bos, 2, 0, "warm", None) for _ in range(count)]
        _admit_device(engine, pool, [(j, i, 0) for i, j in enumerate(jobs)], width, width)
        release(pool, step(engine, pool, steps), cancel=False)  # a chunk of `count` rows
        end = pool.write_index + width
        if end < size:  # a session's next turn: `width` new tokens after its history
          more = [(Job(pool.lanes[i].cached + bos, 2, 0, None, None), i) for i in range(count)]
          _admit_device(engine, pool, [(j, i, len(j.prompt) - width) for j, i in more], width, end)
        release(pool, live(pool), cancel=True)
        shapes += 1
      for other in sizes:
        slots_lib.compact(pool.slots, size=other)
  return shapes
