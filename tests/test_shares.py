"""Which rows each process builds (rlpost.train.shares) and how its rows become the global
batch (rlpost.train.step.global_batch); the real several-process runs are in
test_distributed.py."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from rlpost.data import cursor as cursor_lib
from rlpost.train import shares
from rlpost.train import step as step_lib


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
  st.integers(1, 4), st.integers(1, 5), st.integers(1, 40), st.integers(0, 2**16), st.booleans()
)
def test_processes_read_an_epoch_once_between_them(count, per_process, dataset, seed, shuffle):
  """Every process walks the same cursor and takes its block of each step: over the steps
  the blocks are disjoint, and their union is exactly what one process reads.

  Mutation caught: a block of `size` rows starting at `index` (not index * size)
  makes neighbouring processes read the same rows.
  """
  rows = count * per_process
  steps = -(-dataset // rows) + 1  # a little over an epoch
  cursor = cursor_lib.Cursor(seed)
  for _ in range(steps):
    indices, cursor = cursor_lib.next_indices(cursor, dataset, rows, shuffle)
    blocks = [indices[shares.block(rows, "f", index=p, count=count)] for p in range(count)]
    assert all(len(b) == per_process for b in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks), indices)


def test_a_batch_that_does_not_split_names_the_field():
  with pytest.raises(ValueError, match="train.batch_prompts: 3 rows per step do not split over 2"):
    shares.block(3, "train.batch_prompts", index=0, count=2)


def test_one_process_is_the_identity():
  x = np.arange(6).reshape(3, 2)
  assert shares.all_rows(x) is x or np.array_equal(shares.all_rows(x), x)
  assert shares.take(list(range(4)), "f") == [0, 1, 2, 3]
  np.testing.assert_array_equal(shares.max_over_processes([3, 5]), [3, 5])
  assert shares.sum_over_processes(2.5) == 2.5
  batch = {"tokens": np.zeros((2, 3), np.int32)}
  assert step_lib.global_batch(batch, mesh=None) is batch


def test_rows_of_different_widths_are_refused_unless_padding_is_asked(monkeypatch):
  """An RLBatch's prompt and completion columns must line up across processes: a process
  whose rows are narrower than another's fails naming the field (SFT's gather slots,
  where zero is inert, pass pad=True)."""
  monkeypatch.setattr(step_lib.jax, "process_count", lambda: 2)
  monkeypatch.setattr(shares, "max_over_processes", lambda widths: np.asarray(widths) + 1)
  batch = {"loss_mask": np.zeros((2, 4), np.float32)}
  mesh = step_lib.make_mesh(1)
  with pytest.raises(ValueError, match=r"batch field \['loss_mask'\].*\[4\] wide, another's \[5\]"):
    step_lib.global_batch(batch, mesh)
