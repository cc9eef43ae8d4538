"""Many prompts decoded through the endpoint's continuous batching, without a server.

`decode_all` keeps `rows` slots busy: each prompt is admitted as a slot frees, decoded in
chunks of `chunk_steps`, and ended at a stop id, its budget, or (checked after each
chunk) the first of `stops` in its text, so a short answer frees its slot for the next
prompt instead of decoding the batch's longest. What a row samples does not depend on its
slot or companions (`engine.py`): its ids equal `sampling.sample` on its prompt alone, up
to the tokens past a stop string that a chunk decoded before the check (callers cut at the
stop string, as `rl.batch.stop_length` does).
"""

import dataclasses

from rlpost.serve import engine as engine_lib
from rlpost.serve import finish
from rlpost.serve import pool as pool_lib


def decode_all(
  engine: engine_lib.Engine,
  prompts: list[list[int]],
  *,
  budget: int,
  rows: int,
  stops: tuple[str, ...] = (),
  temperature: float = 0.0,
  seed: int = 0,
  stop_ids: tuple[int, ...] | None = None,
  chunk_steps: int = 8,
  on_done=None,
) -> list[list[int]]:
  """Each prompt's sampled ids (at most `budget`; the stop id included when one ended it).

  prompts: token id lists, each shorter than `engine.context - budget`.
  rows: slots decoding at once (rounded up to a power of two).
  temperature: 0 is greedy; otherwise prompt i draws from `engine.row_id(seed, i)`.
  stop_ids: the ids that end a row (None: the engine's, EOS and the turn close).
  on_done(i, ids): called as prompt i ends (e.g. to keep finished work).
  """
  if budget < 1 or rows < 1 or chunk_steps < 1:
    raise ValueError(
      f"decode_all: budget={budget}, rows={rows} and chunk_steps={chunk_steps} must be >= 1"
    )
  too_long = [i for i, p in enumerate(prompts) if not p or len(p) + budget > engine.context]
  if too_long:
    i = too_long[0]
    raise ValueError(
      f"decode_all: prompt {i} has {len(prompts[i])} tokens; with budget={budget} each "
      f"needs 1 to {engine.context - budget} (engine.context={engine.context})"
    )
  engine = engine_lib.for_decoding(engine)
  stats = pool_lib.new_stats()
  pool = pool_lib.new_pool(engine, temperature, 1.0, engine_lib.bucket(rows, 1), stats)
  if stop_ids is not None:
    pool.config = dataclasses.replace(pool.config, stop_ids=tuple(stop_ids))
  waiting = [
    pool_lib.Job(tuple(p), budget, engine_lib.row_id(seed, i), None, None, i)
    for i, p in enumerate(prompts)
  ]
  out = [None] * len(prompts)
  while waiting or pool_lib.live(pool):
    waiting = pool_lib.admit(engine, pool, waiting)
    ended = pool_lib.step(engine, pool, chunk_steps)
    cut = [
      i
      for i in pool_lib.live(pool)
      if i not in ended and stops and finish.first_stop(engine.tokenizer, pool.lanes[i].ids, stops)
    ]
    for i in ended + cut:
      lane = pool.lanes[i]
      out[lane.job.index] = lane.ids[:budget]
      if on_done is not None:
        on_done(lane.job.index, out[lane.job.index])
    pool_lib.release(pool, ended, cancel=False)
    pool_lib.release(pool, cut, cancel=True)
  return out
