"""Loops made inside `settled_loops()` end their pending tasks before closing: what orbax's
restore leaves behind when one of its concurrent reads fails."""

import asyncio
import gc
import logging
import threading

from rlpost.train import settled_loops


def _orbax_like_restore(finished: list) -> None:
  """What orbax's `run_sync` does: a fresh loop, run until the main coroutine raises (one
  read failed), then close with the sibling reads still pending; those fail later."""

  async def read(i):
    await asyncio.sleep(0.05 * i)
    finished.append(i)
    raise ValueError(f"read {i} failed")

  async def main():
    await asyncio.gather(*[read(i) for i in range(4)])

  loop = asyncio.new_event_loop()
  try:
    loop.run_until_complete(main())
  except ValueError:
    pass
  finally:
    loop.close()


def test_pending_reads_end_before_the_loop_closes_and_their_errors_are_consumed(caplog):
  """Mutation caught: close() not settling (`_settle` skipped): the three sibling reads
  never finish and their coroutines are destroyed pending."""
  threads = set(threading.enumerate())
  finished = []
  with caplog.at_level(logging.WARNING, logger="asyncio"):
    with settled_loops.settled_loops():
      _orbax_like_restore(finished)
    gc.collect()
  assert sorted(finished) == [0, 1, 2, 3]  # every read ended inside the loop
  assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
  assert set(threading.enumerate()) == threads
  assert not isinstance(asyncio.get_event_loop_policy(), settled_loops._SettlingPolicy)


def test_a_read_that_never_ends_is_cancelled_after_the_settle_time(monkeypatch):
  monkeypatch.setattr(settled_loops, "SETTLE_SECONDS", 0.05)
  cancelled = []

  async def hang():
    try:
      await asyncio.sleep(3600)
    except asyncio.CancelledError:
      cancelled.append(True)
      raise

  with settled_loops.settled_loops():
    loop = asyncio.new_event_loop()
    loop.create_task(hang())
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
  assert cancelled == [True] and loop.is_closed()
