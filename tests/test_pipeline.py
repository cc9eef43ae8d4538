"""The off-policy rollout pipeline (rlpost.train.pipeline) with stand-in produce / train
functions: the staleness bound, nothing lost or doubled, errors surfacing."""

import time

import hypothesis
import hypothesis.strategies as st
import pytest

from rlpost.train import pipeline


def _run(steps, max_staleness, produce_s, train_s, first=0, fail_at=None):
  """Runs the pipeline as the loop would; returns [(index, version)] consumed and cursors."""
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

  step, close = pipeline.step_fn(
    produce, train, lambda state: state, last=steps, max_staleness=max_staleness
  )
  consumed, state, cursor = [], first, 100 + first
  try:
    for index in range(first, steps):
      state, cursor, metrics = step(state, cursor, index)
      consumed.append((index, index - int(metrics["staleness"])))
      assert cursor == 100 + index + 1  # the cursor after the batch trained on
  finally:
    close()
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
  consumed, made = _run(6, 1, 0.0, 0.005, first=3)
  assert consumed == [(3, 3), (4, 3), (5, 4)] and sorted(made) == [3, 4, 5]


def test_a_producer_error_is_raised_in_the_trainer():
  with pytest.raises(ValueError, match="env broke at 2"):
    _run(5, 1, 0.0, 0.0, fail_at=2)


def test_negative_staleness_is_refused():
  with pytest.raises(ValueError, match="max_staleness=-1"):
    pipeline.step_fn(None, None, None, last=1, max_staleness=-1)
