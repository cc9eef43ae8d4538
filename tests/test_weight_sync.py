"""The weight-sync guard: the sampler samples the policy the trainer trains (issue 40)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.train import weight_sync


def _tree(seed: int):
  rng = np.random.default_rng(seed)
  return {"a": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32), "b": [jnp.arange(7)]}


def test_fingerprints_tell_a_changed_element_apart():
  """Equal trees give equal fingerprints; changing any one element by one float32 ulp
  of its value, or swapping two elements, changes them.

  Mutation caught: the ramp weight dropped (a swap keeps the sum)."""
  tree = _tree(0)
  same = weight_sync.fingerprint(jax.tree.map(jnp.copy, tree))
  np.testing.assert_array_equal(weight_sync.fingerprint(tree), same)
  a = np.asarray(tree["a"])
  for i in range(a.size):
    bumped = a.copy().ravel()
    bumped[i] = np.nextafter(bumped[i], np.float32(np.inf)) if i % 2 else bumped[i] * 1.001
    changed = {**tree, "a": jnp.asarray(bumped.reshape(a.shape))}
    assert not np.array_equal(weight_sync.fingerprint(changed), same), i
  swapped = a.copy().ravel()
  swapped[[0, 4]] = swapped[[4, 0]]
  assert not np.array_equal(
    weight_sync.fingerprint({**tree, "a": jnp.asarray(swapped.reshape(a.shape))}), same
  )


def _numpy_fingerprint(x) -> list[int]:
  """The module docstring's sums, in NumPy: float32 bit patterns, uint64 accumulation."""
  bits = np.asarray(x, np.float32).ravel().view(np.uint32).astype(np.uint64)
  ramp = np.arange(bits.size, dtype=np.uint64) % 17 + 1
  return [int(bits.sum() % 2**32), int((bits * ramp).sum() % 2**32)]


@pytest.mark.parametrize("block", [0, 1, 7, 64, weight_sync.BLOCK])
def test_fingerprints_summed_in_blocks_equal_whole_leaf_sums(block):
  """Leaves summed `block` elements at a time (whole blocks and a remainder, or one short
  block; 0: whole, as a leaf split over devices is) give NumPy's whole-leaf sums, for
  float32, bfloat16 and int8 leaves.

  Mutation caught: each block's ramp restarting at 0 (`index = jnp.arange(length, ...)`)."""
  rng = np.random.default_rng(1)
  tree = {
    "f": jnp.asarray(rng.normal(size=(9, 23)), jnp.float32),
    "h": jnp.asarray(rng.normal(size=(50,)), jnp.bfloat16),
    "q": jnp.asarray(rng.integers(-127, 128, size=(4, 16)), jnp.int8),
  }
  expected = [_numpy_fingerprint(np.asarray(x, np.float32)) for x in jax.tree.leaves(tree)]
  np.testing.assert_array_equal(weight_sync.fingerprint(tree, block), expected)


def test_leaves_split_over_devices_or_past_int32_indices_are_summed_whole():
  """Blocks only for leaves every device holds whole (a slice of a split leaf would gather
  it) and whose element indices fit int32."""
  leaf = lambda size, replicated: types.SimpleNamespace(
    size=size, sharding=types.SimpleNamespace(is_fully_replicated=replicated)
  )
  assert weight_sync._block_of(leaf(10, True), 4) == 4
  assert weight_sync._block_of(np.zeros(10), 4) == 4
  assert weight_sync._block_of(leaf(10, False), 4) == 0
  assert weight_sync._block_of(leaf(2**31, True), 4) == 0


def test_check_counts_syncs_where_only_the_trainer_moved():
  """A sync whose trainer part changed but whose sampler weights did not counts one; a
  second in a row stops the run; a sync where both moved, or neither, resets the count;
  a copy that differs from the trainer's part stops it at once."""
  t0, t1, t2 = (np.full((2, 2), v, np.uint32) for v in (0, 1, 2))
  s0, s1 = (np.full((3, 2), v, np.uint32) for v in (0, 1))
  last, m = weight_sync.check(None, t0, t0, s0, "step 0")
  assert m == {"sync/stale_syncs": 0.0}
  last, m = weight_sync.check(last, t1, None, s0, "step 1")  # trainer moved, sampler not
  assert m == {"sync/stale_syncs": 1.0}
  reset, m = weight_sync.check(last, t1, None, s0, "step 2")  # neither moved (no update)
  assert m == {"sync/stale_syncs": 0.0}
  with pytest.raises(weight_sync.SyncError, match="step 2: the trainer's policy changed"):
    weight_sync.check(last, t2, None, s0, "step 2")
  _, m = weight_sync.check(last, t2, None, s1, "step 2")
  assert m == {"sync/stale_syncs": 0.0}
  with pytest.raises(weight_sync.SyncError, match="step 3: the policy weights on the sampler"):
    weight_sync.check(reset, t2, t1, s1, "step 3")


def test_a_lora_factor_moving_while_its_partner_is_zero_is_no_change():
  """Weight decay moves a LoRA `a` while `b` is still all zero (no non-zero advantage yet):
  the merged weights do not move, so neither does the trainer's fingerprint (a hard task's
  first iterations are not a stale sampler). Per layer: layer 0's `a` moving while its `b`
  is zero is no change even when layer 1's `b` is live; a live layer's `a` moving is one.
  Mutations caught: `_merged_effect` returning the tree as it is (the first assertion);
  liveness taken over the whole stack instead of per layer (the third)."""
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.random.normal(key_a, (2, 4, 3))
  zero = jnp.zeros((2, 3, 5))
  prints = lambda a, b: weight_sync.fingerprint({"layers": {"q": {"a": a, "b": b}}})
  assert np.array_equal(prints(a, zero), prints(a * 0.9, zero))
  b = zero.at[1].set(jax.random.normal(key_b, (3, 5)))
  assert not np.array_equal(prints(a, b), prints(a.at[1].multiply(0.9), b))
  assert np.array_equal(prints(a, b), prints(a.at[0].multiply(0.9), b))


def test_a_bfloat16_leaf_has_its_float32_widenings_fingerprint_without_a_float32_copy():
  """A bfloat16 leaf (QLoRA's frozen embedding) fingerprints as its exact float32 widening
  (NaN, -0 and infinities included, blocked or whole), and the blocked program's
  temporaries stay under a float32 copy of it. Mutation caught: `_as_bit_source` returning
  the bfloat16 leaf itself (XLA:CPU widens it to float32 before the block loop)."""
  x = jax.random.normal(jax.random.key(0), (3000, 7)).astype(jnp.bfloat16)
  x = x.at[0, 0].set(jnp.nan).at[0, 1].set(-0.0).at[0, 2].set(jnp.inf)
  for block in (1024, 0):
    np.testing.assert_array_equal(
      weight_sync.fingerprint({"e": x}, block),
      weight_sync.fingerprint({"e": x.astype(jnp.float32)}, block),
    )
  big = jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16)
  program = weight_sync._fingerprint.lower({"e": big}, (1 << 16,)).compile()
  assert program.memory_analysis().temp_size_in_bytes < 4096 * 1024 * 4 * 0.75
