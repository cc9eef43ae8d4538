"""Resumable data order: stream equality, split-anywhere resume, permutations, errors."""

import json

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from rlpost.data.cursor import Cursor, next_indices

_SETTINGS = hypothesis.settings(max_examples=60, deadline=None)


def _reference_stream(seed, size, length, shuffle=True):
  """Concatenated per-epoch orders, written directly from the definition."""
  epochs = []
  for e in range(length // size + 2):
    rng = np.random.default_rng([seed, e])
    epochs.append(rng.permutation(size) if shuffle else np.arange(size))
  return np.concatenate(epochs)[:length]


def _run(cursor, size, batch_sizes, shuffle=True):
  out = []
  for b in batch_sizes:
    idx, cursor = next_indices(cursor, size, b, shuffle)
    assert idx.shape == (b,)
    out.append(idx)
  return (np.concatenate(out) if out else np.zeros(0, int)), cursor


@_SETTINGS
@hypothesis.given(
  seed=st.integers(0, 2**31),
  size=st.integers(1, 20),
  batches=st.lists(st.integers(1, 30), max_size=8),
  shuffle=st.booleans(),
)
def test_batches_concatenate_to_per_epoch_permutations(seed, size, batches, shuffle):
  stream, cursor = _run(Cursor(seed), size, batches, shuffle)
  np.testing.assert_array_equal(stream, _reference_stream(seed, size, sum(batches), shuffle))
  assert cursor.epoch * size + cursor.position == sum(batches)
  assert 0 <= cursor.position < size


@_SETTINGS
@hypothesis.given(
  seed=st.integers(0, 1000),
  size=st.integers(1, 15),
  batches=st.lists(st.integers(1, 20), min_size=1, max_size=8),
  data=st.data(),
)
def test_resume_from_saved_cursor_at_any_point(seed, size, batches, data):
  split = data.draw(st.integers(0, len(batches)))
  full, end = _run(Cursor(seed), size, batches)
  first, saved = _run(Cursor(seed), size, batches[:split])
  restored = Cursor(**json.loads(json.dumps(saved._asdict())))  # as a checkpoint stores it
  assert restored == saved
  rest, end2 = _run(restored, size, batches[split:])
  np.testing.assert_array_equal(np.concatenate([first, rest]), full)
  assert end2 == end


@_SETTINGS
@hypothesis.given(seed=st.integers(0, 1000), size=st.integers(1, 30), batch=st.integers(1, 7))
def test_each_epoch_is_a_permutation(seed, size, batch):
  steps = -(-3 * size // batch)
  stream, _ = _run(Cursor(seed), size, [batch] * steps)
  for e in range(3):
    assert sorted(stream[e * size : (e + 1) * size].tolist()) == list(range(size))


def test_epochs_differ_and_seeds_differ():
  a, _ = next_indices(Cursor(0), 100, 200)
  b, _ = next_indices(Cursor(1), 100, 100)
  assert not np.array_equal(a[:100], a[100:])
  assert not np.array_equal(a[:100], b)


def test_cursor_fields_are_python_ints():
  _, cursor = next_indices(Cursor(np.int64(5)), 10, 13)
  assert cursor == Cursor(5, 1, 3)
  assert all(type(v) is int for v in cursor)  # pylint: disable=unidiomatic-typecheck


@pytest.mark.parametrize(
  "cursor,size,batch,needle",
  [
    (Cursor(0, 0, 11), 10, 2, "position must be in"),
    (Cursor(-1), 10, 2, "seed and epoch"),
    (Cursor(0), 0, 2, "dataset_size=0"),
    (Cursor(0), 10, 0, "batch_size=0"),
  ],
)
def test_bad_arguments(cursor, size, batch, needle):
  with pytest.raises(ValueError, match=needle):
    next_indices(cursor, size, batch)
