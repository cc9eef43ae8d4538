"""Resumable, deterministic data order.

The data stream is epoch 0's order, then epoch 1's, ... where epoch e's order
is `np.random.default_rng([seed, e]).permutation(dataset_size)` (or
`arange(dataset_size)` without shuffling). A `Cursor` is a position in that
stream; batches are consecutive slices of it, so a batch may hold the tail of
epoch e followed by the head of epoch e + 1, and nothing is skipped or
repeated. Saving the cursor (three ints, JSON-friendly: `cursor._asdict()`)
and continuing from it reproduces the uninterrupted stream exactly.
"""

import functools
from typing import NamedTuple

import numpy as np


class Cursor(NamedTuple):
  """Position in the data stream: `position` items of epoch `epoch` are consumed.

  Invariant after `next_indices`: 0 <= position < dataset_size.
  """

  seed: int
  epoch: int = 0
  position: int = 0


@functools.lru_cache(maxsize=8)
def _cached_order(seed: int, epoch: int, dataset_size: int, shuffle: bool) -> np.ndarray:
  if not shuffle:
    order = np.arange(dataset_size, dtype=np.int64)
  else:
    order = np.random.default_rng([seed, epoch]).permutation(dataset_size)
  order.setflags(write=False)
  return order


def epoch_order(seed: int, epoch: int, dataset_size: int, shuffle: bool = True) -> np.ndarray:
  """[dataset_size] int64 (read-only): the order of the items in `epoch`."""
  return _cached_order(int(seed), int(epoch), int(dataset_size), bool(shuffle))


def _check(cursor: Cursor, dataset_size: int, batch_size: int) -> None:
  if dataset_size < 1:
    raise ValueError(f"dataset_size={dataset_size} must be >= 1: the dataset is empty")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1")
  if cursor.seed < 0 or cursor.epoch < 0:
    raise ValueError(f"{cursor}: seed and epoch must be >= 0")
  if not 0 <= cursor.position <= dataset_size:
    raise ValueError(
      f"{cursor}: position must be in [0, dataset_size={dataset_size}]; a "
      "cursor restored from a checkpoint of a different (larger) dataset? "
      "Start a fresh Cursor(seed) for a new dataset"
    )


def next_indices(
  cursor: Cursor, dataset_size: int, batch_size: int, shuffle: bool = True
) -> tuple[np.ndarray, Cursor]:
  """The next `batch_size` dataset indices and the advanced cursor.

  Args:
    cursor: where the stream stands.
    dataset_size: number of items (must not change between calls of one run).
    batch_size: indices to take; may exceed dataset_size (spans several epochs).
    shuffle: permute each epoch (else every epoch is 0, 1, ..., dataset_size - 1).

  Returns:
    (indices [batch_size] int64, new cursor with 0 <= position < dataset_size).
  """
  _check(cursor, dataset_size, batch_size)
  epoch, position = int(cursor.epoch), int(cursor.position)
  parts, needed = [], batch_size
  while needed:
    if position == dataset_size:
      epoch, position = epoch + 1, 0
    take = min(needed, dataset_size - position)
    order = epoch_order(cursor.seed, epoch, dataset_size, shuffle)
    parts.append(order[position : position + take])
    position += take
    needed -= take
  if position == dataset_size:
    epoch, position = epoch + 1, 0
  return np.concatenate(parts), Cursor(int(cursor.seed), epoch, position)
