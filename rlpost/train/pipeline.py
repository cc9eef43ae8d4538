"""Off-policy rollouts with a staleness bound: a producer thread samples the next batches
while the trainer trains on the current one. The asynchrony lives here, on the host;
sampling and the train step stay the same pure, jitted functions.

Versions: version v is the policy after v train steps (the loop's step index). The
trainer publishes the sampler's weights of version v + 1 after training on batch v.
Batch i is sampled by version max(i - max_staleness, first) exactly (first: the step
the run started at): the producer waits until that version is out (admission control:
it is paced, it never drops a batch) and keeps the lag fixed even when a newer version
exists, so a run does not depend on thread timing. Every batch is consumed exactly once,
in order; max_staleness = 0 is the synchronous schedule, step for step.

  produce(weights, cursor, index) -> (batch, cursor)   in the producer thread
  train(state, batch, index, version) -> (state, weights of version index + 1, metrics)

Resuming: after step k - 1 the pipeline holds the versions max(k - s, first) .. k - 1
that batches k .. k + s - 1 still need (`held`); a checkpoint keeps them, and `seed`
hands them back before the first step of the resumed run, which then samples exactly
what the uninterrupted run sampled. Unseeded, a run (re)starts its lag where it starts.

A producer error is raised in the trainer's thread at its next batch.

With several processes the producer's host agreements go through a `shares.channel` of
its own (one per producer started, numbered alike on every process), so they never wait
on the trainer thread's; stopping the pipeline cancels an agreement it is waiting in.
"""

import dataclasses
import itertools
import queue
import threading
from typing import Any, Callable, NamedTuple

from rlpost.train import shares

_producers = itertools.count()  # numbers each producer's exchange channel (every process alike)


class Produced(NamedTuple):
  """A batch in the queue: its step `index`, the `version` that sampled it, and the data
  `cursor` after it (checkpointed with the state that trained on it)."""

  index: int
  version: int
  batch: Any
  cursor: Any


class Held(NamedTuple):
  """The published versions older than the next step's that later batches need:
  `weights` {version: weights} of versions `lagged_versions(next, first, s)`, and `first`,
  the step the run started at (its lags are counted from there)."""

  first: int
  weights: dict


def lagged_versions(index: int, first: int, max_staleness: int) -> range:
  """The versions older than `index` that batches index .. index + s - 1 are sampled by."""
  return range(max(index - max_staleness, first), index)


class Pipeline(NamedTuple):
  """A `rlpost.train.loop` step_fn and what goes with it (`step_fn`)."""

  step: Callable  # step(state, cursor, index) -> (state, cursor, metrics)
  close: Callable  # close(): stops the producer; call it when the loop ends
  held: Callable  # held() -> Held: after a step, what a resume at the next step needs
  seed: Callable  # seed(Held): before the first step, the versions held when the run stopped


@dataclasses.dataclass
class Published:
  """Sampler weights by version, those a batch still to be made may need (guarded by
  `changed`)."""

  weights: dict
  changed: threading.Condition = dataclasses.field(default_factory=threading.Condition)
  stop: bool = False


def _producer(
  produce, published: Published, out: queue.Queue, cursor, first, start, last, s, channel: str
):
  try:
    with shares.channel(channel, cancelled=lambda: published.stop):
      for index in range(start, last):
        version = max(index - s, first)
        with published.changed:
          published.changed.wait_for(lambda: published.stop or version in published.weights)
          if published.stop:
            return
          weights = published.weights[version]
        batch, cursor = produce(weights, cursor, index)
        out.put(Produced(index, version, batch, cursor))
  except BaseException as e:  # handed to the trainer, which raises it
    out.put(e)


def step_fn(
  produce: Callable, train: Callable, weights_of: Callable, *, last: int, max_staleness: int
) -> Pipeline:
  """A `rlpost.train.loop` step_fn running `produce` ahead in a thread, and its companions.

  weights_of(state) -> the sampler's weights of the state the loop starts (or resumes)
  from; last: the loop's step count (the producer makes batches up to it). Returns a
  `Pipeline`: call `close()` when the loop ends (it stops the producer; a batch it had
  made ahead is dropped with the run, not trained on); `held()` after a step gives what a
  resume at the next step needs, `seed(held)` before the first step of the resumed run
  hands it back (module docstring). A seed lacking a version the first batches need is a
  ValueError at that step.
  """
  if max_staleness < 0:
    raise ValueError(f"max_staleness={max_staleness}: use >= 0 (0: synchronous)")
  started: dict = {}
  seeded: dict = {}  # the Held a resumed run starts with, until its first step

  def step(state, cursor, index: int):
    if not started:  # the first step of this call: the loop's start or resume point
      held = seeded.pop("held", None)
      started.update(_start(produce, weights_of(state), cursor, index, held, last, max_staleness))
    published, out = started["published"], started["out"]
    item = out.get()
    if isinstance(item, BaseException):
      raise item
    if item.index != index or item.version != max(index - max_staleness, started["first"]):
      raise RuntimeError(
        f"pipeline: got batch {item.index} of version {item.version} at step {index}"
      )
    state, weights, metrics = train(state, item.batch, index, item.version)
    with published.changed:  # later batches need versions >= index + 1 - max_staleness
      published.weights[index + 1] = weights
      for old in [v for v in published.weights if v < index + 1 - max_staleness]:
        del published.weights[old]
      published.changed.notify_all()
    started["next"] = index + 1
    return state, item.cursor, {**metrics, "staleness": float(index - item.version)}

  def held() -> Held:
    if not started:
      raise RuntimeError("pipeline.held: no step has run")
    published, following = started["published"], started["next"]
    with published.changed:
      versions = lagged_versions(following, started["first"], max_staleness)
      return Held(started["first"], {v: published.weights[v] for v in versions})

  def seed(resumed: Held):
    if started:
      raise RuntimeError("pipeline.seed: after the first step; seed before it")
    seeded["held"] = resumed

  def close():
    _stop(started)

  return Pipeline(step, close, held, seed)


def _start(produce, weights, cursor, index: int, seed, last: int, max_staleness: int) -> dict:
  """Starts the producer thread at step `index` (`weights`: the sampler's weights of the
  state there; `seed`: a resumed run's Held, or None). Returns what `step_fn` tracks."""
  first, seeded = seed if seed is not None else Held(index, {})
  needed = lagged_versions(index, first, max_staleness)
  missing = [v for v in needed if v not in seeded]
  if first > index or missing:  # the producer would wait for them forever
    raise ValueError(
      f"pipeline: a run resumed at step {index} with max_staleness={max_staleness} and its "
      f"lag counted from step {first} samples its first batches with the versions "
      f"{list(needed)}; the seed holds {sorted(seeded)}"
    )
  published = Published({**{v: seeded[v] for v in needed}, index: weights})
  out = queue.Queue(maxsize=max_staleness + 1)
  thread = threading.Thread(
    target=_producer,
    args=(
      produce,
      published,
      out,
      cursor,
      first,
      index,
      last,
      max_staleness,
      f"producer{next(_producers)}",
    ),
    daemon=True,
    name="rollout-producer",
  )
  thread.start()
  return dict(published=published, out=out, thread=thread, first=first, next=index)


def _stop(started: dict) -> None:
  """Stops a started producer (its queued batch, if any, is dropped) and forgets it."""
  if not started:
    return
  with started["published"].changed:
    started["published"].stop = True
    started["published"].changed.notify_all()
  while started["thread"].is_alive():  # unblock a producer waiting on a full queue
    try:
      started["out"].get_nowait()
    except queue.Empty:
      pass
    started["thread"].join(timeout=0.1)
  started.clear()
