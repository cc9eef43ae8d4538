"""Which rows each process builds (rlpost.train.shares) and how its rows become the global
batch (rlpost.train.step.global_batch); the real several-process runs are in
test_distributed.py."""

import threading
import time

import hypothesis
import jax
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


class _Store:
  """An in-memory stand-in for the distributed runtime's key-value client, shared by the
  threads that play the processes; `gets` records the keys read, `deleted` the keys
  dropped."""

  def __init__(self):
    self.values, self.deleted, self.changed = {}, [], threading.Condition()

  def key_value_set_bytes(self, key, value):
    with self.changed:
      assert key not in self.values, f"{key} written twice"
      self.values[key] = value
      self.changed.notify_all()

  def blocking_key_value_get_bytes(self, key, timeout_ms):
    with self.changed:
      if not self.changed.wait_for(lambda: key in self.values, timeout_ms / 1000):
        raise jax.errors.JaxRuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out: {key}")
      return self.values[key]

  def key_value_delete(self, key):
    with self.changed:
      self.deleted.append(key)
      del self.values[key]


def test_exchanges_on_two_channels_agree_in_any_interleaving(monkeypatch):
  """Two processes, each a trainer thread (channel "main") and a producer thread (channel
  "producer"), four threads exchanging at once with random pauses: the k-th exchange of a
  channel returns both processes' k-th values of that channel, in process order (shapes
  kept), whatever the interleaving; each process deletes its key of an exchange once the
  next one on that channel is done. Mutation caught: one counter for all channels (a
  producer's exchange paired with the trainer's)."""
  store, results, who = _Store(), {}, threading.local()
  monkeypatch.setattr(shares.jax_distributed.global_state, "client", store)
  monkeypatch.setattr(shares.jax, "process_index", lambda: who.index)
  monkeypatch.setattr(shares.jax, "process_count", lambda: 2)
  monkeypatch.setattr(shares, "_sequence", {})

  def play(index, name, seed):
    who.index, rng = index, np.random.default_rng(seed)
    with shares.channel(name):
      for k in range(3):
        time.sleep(rng.uniform(0, 0.02))
        value = np.arange(index + 1 + k) + (100 if name == "producer" else 0)
        results[index, name, k] = [a.tolist() for a in shares._exchange(value)]

  threads = [
    threading.Thread(target=play, args=(i, name, 10 * i + len(name)))
    for i in (0, 1)
    for name in ("main", "producer")
  ]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=20)
  for name in ("main", "producer"):
    base = 100 if name == "producer" else 0
    for k in range(3):
      want = [list(range(base, base + 1 + k)), list(range(base, base + 2 + k))]
      assert results.get((0, name, k)) == results.get((1, name, k)) == want, (name, k)
  assert sorted(store.deleted) == sorted(
    f"rlpost/shares/{name}/{k}/{i}" for name in ("main", "producer") for k in (0, 1) for i in (0, 1)
  )


def test_a_cancelled_exchange_raises_instead_of_waiting():
  """Process 0 of 2 waits for a value process 1 never writes: once its channel is
  cancelled the exchange raises `shares.Cancelled` (a stopped pipeline's producer exits)."""
  stop = threading.Event()
  threading.Timer(0.3, stop.set).start()
  with pytest.raises(shares.Cancelled, match="producer0/0/1"):
    shares.exchange_with(_Store(), 0, 2, "producer0", 0, np.zeros(1), stop.is_set)


@pytest.mark.parametrize(
  "x",
  [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array(7, dtype=np.int64),
    np.zeros((0, 5), dtype=np.int32),
    np.array([True, False]),
    np.array(["ab", "cde"]),
    np.arange(6, dtype=">i2").reshape(2, 3)[:, ::2],  # big-endian, not contiguous
  ],
)
def test_exchanged_arrays_round_trip_without_parsing_python(x, monkeypatch):
  """An exchanged value comes back with its dtype, shape and values, writable, and its
  header is read without `ast` (CPython 3.11's parser can raise "AST constructor
  recursion depth mismatch" when two threads parse at once: a pipelined run's two
  exchanging threads did, in CI). Mutation caught: the header read with ast.literal_eval
  (as np.load reads its own)."""
  import ast  # pylint: disable=g-import-not-at-top

  def no_parsing(*args):
    raise AssertionError("ast used")

  monkeypatch.setattr(ast, "literal_eval", no_parsing)
  y = shares.decode(shares.encode(x))
  assert y.dtype == x.dtype and y.shape == x.shape and y.flags.writeable
  np.testing.assert_array_equal(y, x)
  with pytest.raises(TypeError, match="dtype object"):
    shares.encode(np.array([{}], dtype=object))
