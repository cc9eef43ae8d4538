"""Checks that the sampler samples from the policy the trainer trains (a silent failure
peers have shipped: a LoRA adapter never merged into the sampler's weights, a sampler
copy never refreshed after a sync).

At every weight sync the RL loop takes three fingerprints (`fingerprint`: per leaf integer
sums of the weights' bit patterns; one small program, no host copy of the weights):

  trainer  the policy part of the train state (adapters under LoRA, each pair reduced to
           what its merged delta depends on: `_merged_effect`), as the trainer holds it
  copy     the same part as it reached the sampler's devices (own rollout devices), else
           None (the sampler reads the trainer's arrays)
  sampler  the weights the sampler reads (LoRA merged, int8 when sampling in int8)

`check` compares them with the previous sync's: the copy must equal the trainer's part
exactly (the sync is bitwise), and once the trainer's policy has changed in
`STALE_LIMIT` syncs in a row while the sampler's weights stayed the same, the run stops
with `SyncError` (a copy that differs stops it at once). The metric every iteration:
`sync/stale_syncs`, how many syncs in a row the sampler's weights lagged a changed policy
(0 in a healthy run).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

STALE_LIMIT = 2  # syncs in a row with a new policy and unchanged sampler weights


class SyncError(RuntimeError):
  """The sampler does not read the weights the trainer trains."""


class SyncRecord(NamedTuple):
  """The fingerprints of the last sync ([leaves, 2] uint32 each) and the count of syncs
  in a row where the trainer's policy changed but the sampler's weights did not."""

  trainer: np.ndarray
  sampler: np.ndarray
  stale: int


# Elements per block of a leaf's fingerprint: an integer sum over a whole leaf makes
# XLA:CPU materialize the leaf's bit patterns (its integer reductions fuse no producer:
# 1.3 GiB of temporaries for Gemma 3 270M's embedding); a block's take 4 MiB.
BLOCK = 1 << 20


def _as_bit_source(x):
  """`x` flattened, a bfloat16 one as its uint16 bit patterns: XLA:CPU widens a whole
  bfloat16 array that a loop slices to float32 before the loop (0.63 GiB for a bfloat16
  Gemma 3 270M embedding), not a uint16 one."""
  flat = jnp.ravel(x)
  return jax.lax.bitcast_convert_type(flat, jnp.uint16) if x.dtype == jnp.bfloat16 else flat


def _float32_bits(part):
  """The float32 bit patterns (uint32) of a part of `_as_bit_source`'s array: bfloat16's
  widen exactly, so theirs are its own shifted left by 16."""
  if part.dtype == jnp.uint16:
    return part.astype(jnp.uint32) << 16
  return jax.lax.bitcast_convert_type(part.astype(jnp.float32), jnp.uint32)


def _leaf_sums(x, block: int):
  """[2] uint32: the sums of `x`'s float32 bit patterns, plain and ramp-weighted, `block`
  elements at a time (0: the whole leaf at once)."""
  flat = _as_bit_source(x)

  def sums(start, length: int):
    part = jax.lax.dynamic_slice(flat, (start,), (length,))
    bits = _float32_bits(part)
    index = start.astype(jnp.uint32) + jnp.arange(length, dtype=jnp.uint32)
    ramp = (index % 17 + 1).astype(jnp.uint32)
    return jnp.stack([jnp.sum(bits), jnp.sum(bits * ramp)])

  if not block:
    return sums(jnp.int32(0), x.size)
  whole, rest = divmod(x.size, block)
  total = jnp.zeros((2,), jnp.uint32)
  if whole:
    total = jax.lax.fori_loop(0, whole, lambda i, acc: acc + sums(i * block, block), total)
  return total + sums(jnp.int32(whole * block), rest) if rest else total


def _merged_effect(tree):
  """`tree` with each LoRA pair ({"a": [L, in, r], "b": [L, r, out]}) reduced to what its
  merged delta a @ b depends on: a layer's `a` zeroed where its `b` is all zero, and the
  other way round. AdamW's weight decay moves `a` while `b` is still 0 (before any
  advantage is non-zero: a hard task's first iterations), which moves no merged weight;
  without this the check would stop such a run as a stale sampler."""
  if not isinstance(tree, dict):
    return tree
  pair = set(tree) == {"a", "b"} and all(getattr(x, "ndim", 0) == 3 for x in tree.values())
  if pair:
    a, b = tree["a"], tree["b"]
    live = lambda x: jnp.any(x != 0, axis=tuple(range(1, x.ndim)), keepdims=True)
    return {"a": jnp.where(live(b), a, 0), "b": jnp.where(live(a), b, 0)}
  return {k: _merged_effect(v) for k, v in tree.items()}


@functools.partial(jax.jit, static_argnums=1)
def _fingerprint(tree, blocks: tuple[int, ...]):
  leaves = jax.tree.leaves(_merged_effect(tree))
  if not leaves:
    return jnp.zeros((0, 2), jnp.uint32)
  return jnp.stack([_leaf_sums(x, b) for x, b in zip(leaves, blocks, strict=True)])


def _block_of(x, block: int) -> int:
  """`block`, or 0 (whole) for a leaf split over devices (a slice of it would gather it;
  each device reduces its own part) or past int32 element indices."""
  sharding = getattr(x, "sharding", None)
  split = sharding is not None and not sharding.is_fully_replicated
  return 0 if split or x.size >= 2**31 else block


def fingerprint(tree, block: int = BLOCK) -> np.ndarray:
  """`[leaves, 2]` uint32: per leaf, the sum of its float32 bit patterns and their sum
  weighted by a ramp (element i by i % 17 + 1), both modulo 2**32, summed `block`
  elements at a time (`_block_of`). Integer addition modulo 2**32 does not depend on its
  order, so equal trees give equal fingerprints on any layout and blocking; a change of
  any one element by one bit changes the first, most swaps of two the second."""
  blocks = tuple(_block_of(x, block) for x in jax.tree.leaves(tree))
  return np.asarray(jax.device_get(_fingerprint(tree, blocks)))


def check(last: SyncRecord | None, trainer, copy, sampler, where: str) -> tuple[SyncRecord, dict]:
  """The record of this sync and its metrics; raises SyncError on a failed sync.

  Args:
    last: the previous sync's record (None at the first sync of the run or after a resume).
    trainer, copy, sampler: this sync's fingerprints (module docstring); copy may be None.
    where: what synced (e.g. "step 12"), for the message.
  """
  if copy is not None and not np.array_equal(trainer, copy):
    raise SyncError(
      f"{where}: the policy weights on the sampler's devices differ from the trainer's "
      f"right after the sync ({int((trainer != copy).any(axis=1).sum())} of {len(trainer)} "
      "arrays): the sampler would sample from weights that were never trained; check the "
      "rollout mesh (mesh.rollout) and the device copies"
    )
  stale = 0
  if last is not None:
    trainer_moved = not np.array_equal(trainer, last.trainer)
    sampler_moved = not np.array_equal(sampler, last.sampler)
    stale = last.stale + 1 if trainer_moved and not sampler_moved else 0
  if stale >= STALE_LIMIT:
    raise SyncError(
      f"{where}: the trainer's policy changed at each of the last {stale} weight syncs but "
      "the weights the sampler reads did not: the run trains a policy it never samples "
      "(e.g. LoRA adapters not merged into the sampler's weights, or a sampler copy not "
      "refreshed); rollouts, rewards and metrics would all come from the initial policy"
    )
  return SyncRecord(trainer, sampler, stale), {"sync/stale_syncs": float(stale)}
