"""Which rows of a global batch this process builds, and the host-side agreements
between processes that building only those rows needs.

Every process walks the same data stream (the same cursor), so all know a batch's
N global rows; process p of P builds rows [p * N/P, (p+1) * N/P) only: it reads,
tokenizes, samples and scores those and nothing else. Over an epoch the processes'
rows are then disjoint and together the single-process rows. The global arrays are
assembled from the local rows (`rlpost.train.step.global_batch`); rows are laid out
over the mesh's devices in process order, so block p lands on process p's devices.

With one process every function here is the identity (nothing is exchanged).

With several, the host-side agreements (`all_rows`, `max_over_processes`, ...) are not
XLA collectives: each is an exchange through the distributed runtime's key-value store
(`jax.distributed`'s coordination service), on the calling thread's *channel*. Every
thread that exchanges (the trainer's, a pipelined run's producer: `channel`) numbers its
own exchanges, so two threads' exchanges can reach the processes in any interleaving
without being confused, and none of them waits on a device collective the other thread
issued. A process that dies stops the others through the runtime's heartbeat.
"""

import contextlib
import itertools
import json
import threading
import time
from typing import Callable

import jax
import numpy as np

from jax._src import distributed as jax_distributed

EXCHANGE_TIMEOUT_S = 3600  # a process that neither answers nor dies for this long: an error
_POLL_MS = 200  # how often a waiting exchange looks at its channel's `cancelled`


class Cancelled(Exception):
  """An exchange given up because its channel was cancelled (a pipeline stopping)."""


class _ThreadChannel(threading.local):
  name = "main"
  cancelled: Callable[[], bool] = staticmethod(lambda: False)


_channel = _ThreadChannel()
_sequence: dict = {}  # (process index, channel name) -> the channel's exchange counter
_sequence_lock = threading.Lock()


@contextlib.contextmanager
def channel(name: str, cancelled: Callable[[], bool] | None = None):
  """Within the block, this thread's exchanges go through channel `name` (the same name
  on every process, used by one thread at a time; e.g. a pipeline's producer). A
  `cancelled()` that turns True makes a waiting exchange raise `Cancelled`."""
  before = _channel.name, _channel.cancelled
  _channel.name, _channel.cancelled = name, cancelled or (lambda: False)
  try:
    yield
  finally:
    _channel.name, _channel.cancelled = before


def _exchange(x: np.ndarray) -> list[np.ndarray]:
  """Every process's `x` (any shape and dtype; shapes may differ), in process order."""
  client, index = jax_distributed.global_state.client, jax.process_index()
  with _sequence_lock:
    seq = next(_sequence.setdefault((index, _channel.name), itertools.count()))
  return exchange_with(
    client, index, jax.process_count(), _channel.name, seq, x, _channel.cancelled
  )


def exchange_with(client, index: int, count: int, name: str, seq: int, x, cancelled) -> list:
  """`_exchange` on a key-value `client` (`key_value_set_bytes`, `blocking_key_value_get_
  bytes`, `key_value_delete`) as process `index` of `count`: exchange `seq` of channel
  `name`. Each process writes its key, reads all, and deletes its key of exchange seq - 1
  (every process has read it: each wrote exchange seq after finishing seq - 1)."""
  key = f"rlpost/shares/{name}/{seq}"
  client.key_value_set_bytes(f"{key}/{index}", encode(x))
  out = [_wait_for(client, f"{key}/{p}", cancelled) for p in range(count)]
  if seq:
    client.key_value_delete(f"rlpost/shares/{name}/{seq - 1}/{index}")
  return out


def _wait_for(client, key: str, cancelled) -> np.ndarray:
  deadline = time.monotonic() + EXCHANGE_TIMEOUT_S
  while True:
    if cancelled():
      raise Cancelled(key)
    try:
      value = client.blocking_key_value_get_bytes(key, _POLL_MS)
    except jax.errors.JaxRuntimeError as e:  # "DEADLINE_EXCEEDED: GetKeyValue() timed out"
      if "DEADLINE_EXCEEDED" not in str(e):
        raise
      if time.monotonic() > deadline:
        raise TimeoutError(
          f"shares: no process wrote {key} within {EXCHANGE_TIMEOUT_S} s (a process "
          "stuck, or taking another code path than this one)"
        ) from e
      continue
    return decode(value)


def encode(x) -> bytes:
  """`x` as bytes: a 4-byte length, a JSON header (dtype, shape), the C-order data.

  Not np.save/np.load: their header is read with `ast.literal_eval`, which CPython 3.11
  (before 3.11.9) can fail with "SystemError: AST constructor recursion depth mismatch"
  when two threads parse at once, as a pipelined run's trainer and producer exchange."""
  x = np.asarray(x)
  if x.dtype.hasobject:
    raise TypeError(f"shares: cannot exchange an array of dtype {x.dtype} (Python objects)")
  head = json.dumps({"dtype": x.dtype.str, "shape": list(x.shape)}).encode()
  return len(head).to_bytes(4, "little") + head + x.tobytes(order="C")


def decode(data: bytes) -> np.ndarray:
  """The array `encode` wrote (a fresh, writable copy)."""
  n = int.from_bytes(data[:4], "little")
  head = json.loads(data[4 : 4 + n])
  flat = np.frombuffer(data, dtype=np.dtype(head["dtype"]), offset=4 + n)
  return flat.reshape(head["shape"]).copy()


def block(num_rows: int, field: str, index: int | None = None, count: int | None = None) -> slice:
  """The slice of a `num_rows`-row global batch that process `index` of `count` builds.

  index, count: default to this process (jax.process_index / process_count).
  field: the setting that sets num_rows, named in the error when it does not divide.
  """
  index = jax.process_index() if index is None else index
  count = jax.process_count() if count is None else count
  if num_rows % count:
    raise ValueError(
      f"{field}: {num_rows} rows per step do not split over {count} processes; use a "
      f"multiple of {count} so that every process builds the same number of rows"
    )
  size = num_rows // count
  return slice(index * size, (index + 1) * size)


def take(items, field: str):
  """This process's block of `items` (a list or array of a batch's global rows)."""
  return items[block(len(items), field)]


def all_rows(x) -> np.ndarray:
  """Every process's rows of `x` (local rows [n, ...]) in process order: [P * n, ...]."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x
  return np.concatenate(_exchange(x))


def max_over_processes(values) -> np.ndarray:
  """Elementwise maximum of an int vector over processes (e.g. local array widths)."""
  values = np.asarray(values, np.int64)
  if jax.process_count() == 1:
    return values
  return np.max(np.stack(_exchange(values)), axis=0)


def sum_over_processes(value: float) -> float:
  """The sum of a host number over processes (e.g. a batch's target-token count)."""
  return float(all_rows(np.asarray([value], np.float64)).sum())


def from_first_process(value: int) -> int:
  """Process 0's value of a host int, on every process (one decision for all)."""
  if jax.process_count() == 1:
    return int(value)
  return int(all_rows(np.asarray([value], np.int64))[0])
