"""The off-policy rollout pipeline (rlpost.train.pipeline) with stand-in produce / train
functions: the staleness bound, nothing lost or doubled, errors surfacing."""

import threading
import time

import hypothesis
import hypothesis.strategies as st
import pytest

from rlpost.train import pipeline


def _run(steps, max_staleness, produce_s, train_s, first=0, fail_at=None, seed=None, held=None):
  """Runs the pipeline as the loop would; returns [(index, version)] consumed and the
  indices made. Weights of version v are v. seed: a `pipeline.Held` handed to the
  pipeline before its first step; held: a list to which `held()` is appended after each step."""
  made = []

  def produce(weights, cursor, index):
    if index == fail_at:
      raise ValueError(f"env broke at {index}")
    time.sleep(produce_s)
    made.append(index)
    return {"index": index, "sampled_by": weights}, cursor + 1

  def train(state, batch, index, version):
    assert batch["index"] == index and batch["sampled_by"] == version
    time.sleep(train_s)
    return state + 1, index + 1, {"trained": index}  # weights of version index + 1

  pipe = pipeline.step_fn(
    produce, train, lambda state: state, last=steps, max_staleness=max_staleness
  )
  if seed is not None:
    pipe.seed(seed)
  consumed, state, cursor = [], first, 100 + first
  try:
    for index in range(first, steps):
      state, cursor, metrics = pipe.step(state, cursor, index)
      consumed.append((index, index - int(metrics["staleness"])))
      assert cursor == 100 + index + 1  # the cursor after the batch trained on
      if held is not None:
        held.append(pipe.held())
  finally:
    pipe.close()
  return consumed, made


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(st.integers(0, 3), st.sampled_from(["slow producer", "slow trainer"]))
def test_no_batch_older_than_the_bound_and_none_lost_or_doubled(max_staleness, which):
  """Mutation caught: admitting a batch without waiting for version i - s (a slow trainer
  then consumes batches many versions old), or sampling from the newest version."""
  produce_s, train_s = (0.01, 0.0) if which == "slow producer" else (0.0, 0.01)
  consumed, made = _run(12, max_staleness, produce_s, train_s)
  assert [i for i, _ in consumed] == list(range(12))
  # a fixed lag, whichever side is slow (0: the synchronous schedule)
  assert all(v == max(i - max_staleness, 0) for i, v in consumed), consumed
  assert sorted(made) == list(range(12))  # nothing sampled twice or skipped


def test_resuming_at_a_later_step_starts_the_producer_there():
  """Unseeded (a checkpoint without the older versions), the lag restarts there."""
  consumed, made = _run(6, 1, 0.0, 0.005, first=3)
  assert consumed == [(3, 3), (4, 3), (5, 4)] and sorted(made) == [3, 4, 5]


@pytest.mark.parametrize("max_staleness,resume_at", [(1, 3), (2, 3), (2, 1), (3, 2)])
def test_a_run_seeded_with_what_it_held_continues_as_the_uninterrupted_run(
  max_staleness, resume_at
):
  """What `held()` returns after step k - 1 (versions max(k - s, first) .. k - 1 and
  first), seeded into a pipeline resumed at k, gives the uninterrupted schedule, also
  when k < s (the lag still counts from the run's first step, 0). Mutations caught: not
  seeding (the lag restarts at k), counting the lag from k instead of the seed's first,
  and `held` keeping one version too few."""
  whole, held = _run(8, max_staleness, 0.0, 0.002, held=[])[0], []
  _run(resume_at, max_staleness, 0.0, 0.002, held=held)
  seed = held[-1]
  assert seed.first == 0
  assert sorted(seed.weights) == list(range(max(resume_at - max_staleness, 0), resume_at))
  assert all(seed.weights[v] == v for v in seed.weights)
  resumed, made = _run(8, max_staleness, 0.0, 0.002, first=resume_at, seed=seed)
  assert resumed == whole[resume_at:] and sorted(made) == list(range(resume_at, 8))


def test_a_seed_missing_a_needed_version_is_an_error_not_a_hang():
  """Mutation caught: without the check at the first step (the seed published as it is),
  the producer waited forever for version 1, which no step publishes (killed after 30 s)."""
  seed = pipeline.Held(0, {2: 2})  # resuming at 3 with s = 2 needs versions 1 and 2
  with pytest.raises(ValueError, match=r"versions \[1, 2\]; the seed holds \[2\]"):
    _run(6, 2, 0.0, 0.0, first=3, seed=seed)
  with pytest.raises(ValueError, match="lag counted from step 4"):  # a first after the resume
    _run(6, 1, 0.0, 0.0, first=3, seed=pipeline.Held(4, {}))


def test_a_producer_error_is_raised_in_the_trainer():
  with pytest.raises(ValueError, match="env broke at 2"):
    _run(5, 1, 0.0, 0.0, fail_at=2)


def test_negative_staleness_is_refused():
  with pytest.raises(ValueError, match="max_staleness=-1"):
    pipeline.step_fn(None, None, None, last=1, max_staleness=-1)


def test_held_before_any_step_is_an_error():
  pipe = pipeline.step_fn(None, None, None, last=1, max_staleness=1)
  with pytest.raises(RuntimeError, match="no step has run"):
    pipe.held()


def test_closing_cancels_a_producer_waiting_in_an_exchange(monkeypatch):
  """Two processes (the other one never answers): the producer makes batch 0, then waits in
  a host agreement (`shares.all_rows`) for batch 1, on a channel of its own (not the
  trainer's "main"); closing the pipeline after step 0 cancels that wait, and the
  producer thread exits within a second. Mutation caught: the producer's channel without
  `cancelled` (close() would wait forever)."""
  from test_shares import _Store  # pylint: disable=g-import-not-at-top

  from rlpost.train import shares  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(shares.jax_distributed.global_state, "client", _Store())
  monkeypatch.setattr(shares.jax, "process_index", lambda: 0)
  monkeypatch.setattr(shares.jax, "process_count", lambda: 2)
  channels = []

  def produce(weights, cursor, index):
    channels.append(shares._channel.name)  # pylint: disable=protected-access
    if index == 1:
      shares.all_rows([1.0])  # process 1 never writes its rows
    return index, cursor

  pipe = pipeline.step_fn(
    produce, lambda s, b, i, v: (s, i + 1, {}), lambda s: 0, last=3, max_staleness=1
  )
  pipe.step(0, 0, 0)
  deadline = time.monotonic() + 10
  while len(channels) < 2:
    assert time.monotonic() < deadline, "the producer never started batch 1"
    time.sleep(0.01)
  closing = threading.Thread(target=pipe.close, daemon=True)
  start = time.monotonic()
  closing.start()
  closing.join(timeout=5)
  assert not closing.is_alive(), "close() waits on a producer stuck in an exchange"
  assert time.monotonic() - start < 1.5
  assert channels[0] == channels[1] != "main" and channels[0].startswith("producer")
