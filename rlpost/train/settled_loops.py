"""Event loops that settle their tasks before they close: a failed orbax read says one thing.

Orbax reads a checkpoint's arrays as many concurrent asyncio tasks in a loop of its own,
and returns (or raises) as soon as the main coroutine does: when one read fails, it
closes the loop with the other reads still pending. Those then fail one by one after the
fact ("Task exception was never retrieved", "Exception ignored in: <coroutine ...>") and
TensorStore's callbacks find the loop closed ("RuntimeError: Event loop is closed"): a
wall of tracebacks for one corrupt file, which the fallback has already reported.

`settled_loops()` makes every loop created inside it settle on close: pending tasks are
awaited (each read ends with its data or its error) for up to `SETTLE_SECONDS`, the rest
cancelled, and every task's exception retrieved, so nothing is reported twice and no
callback arrives after the loop is gone.
"""

import asyncio
import contextlib
import threading

# How long a closing loop waits for its pending reads before cancelling them.
SETTLE_SECONDS = 60.0
_LOCK = threading.RLock()


class _SettlingLoop(asyncio.SelectorEventLoop):
  """A selector loop whose close() first settles its pending tasks (module docstring)."""

  def close(self):
    if not self.is_closed() and not self.is_running():
      _settle(self)
    super().close()


def _settle(loop: asyncio.AbstractEventLoop) -> None:
  pending = asyncio.all_tasks(loop)
  if pending:
    _, late = loop.run_until_complete(asyncio.wait(pending, timeout=SETTLE_SECONDS))
    for task in late:
      task.cancel()
    if late:
      loop.run_until_complete(asyncio.gather(*late, return_exceptions=True))
    for task in pending:
      if not task.cancelled():
        task.exception()  # retrieved: its error was the checkpoint's, already reported
  loop.run_until_complete(loop.shutdown_asyncgens())


class _SettlingPolicy(asyncio.DefaultEventLoopPolicy):
  def new_event_loop(self):
    return _SettlingLoop()


@contextlib.contextmanager
def settled_loops():
  """Within it, every new asyncio event loop settles its tasks before it closes."""
  with _LOCK:  # one policy swap at a time (restores from several threads)
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_SettlingPolicy())
    try:
      yield
    finally:
      asyncio.set_event_loop_policy(previous)
