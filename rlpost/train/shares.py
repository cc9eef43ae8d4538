"""Which rows of a global batch this process builds, and the host-side agreements
between processes that building only those rows needs.

Every process walks the same data stream (the same cursor), so all know a batch's
N global rows; process p of P builds rows [p * N/P, (p+1) * N/P) only: it reads,
tokenizes, samples and scores those and nothing else. Over an epoch the processes'
rows are then disjoint and together the single-process rows. The global arrays are
assembled from the local rows (`rlpost.train.step.global_batch`); rows are laid out
over the mesh's devices in process order, so block p lands on process p's devices.

With one process every function here is the identity (no collective is issued).
"""

import jax
import numpy as np
from jax.experimental import multihost_utils


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
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def max_over_processes(values) -> np.ndarray:
  """Elementwise maximum of an int vector over processes (e.g. local array widths)."""
  values = np.asarray(values, np.int64)
  if jax.process_count() == 1:
    return values
  return np.asarray(multihost_utils.process_allgather(values)).max(axis=0)


def sum_over_processes(value: float) -> float:
  """The sum of a host number over processes (e.g. a batch's target-token count)."""
  return float(all_rows(np.asarray([value], np.float64)).sum())


def from_first_process(value: int) -> int:
  """Process 0's value of a host int, on every process (one decision for all)."""
  if jax.process_count() == 1:
    return int(value)
  return int(all_rows(np.asarray([value], np.int64))[0])
