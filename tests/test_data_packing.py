"""Padding and packing: layout invariants, segment mask, and packed == unpacked logits."""

import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import pytest

from rlpost.data import packing
from rlpost.models import decoder
from rlpost.models import families
from rlpost.ops.masks import causal_attention_mask, segment_attention_mask

CONFIG = families.get_config("tiny")


def _examples(lengths, seed=0):
  rng = np.random.default_rng(seed)
  return [(rng.integers(5, 261, n).astype(np.int32), rng.random(n) < 0.6) for n in lengths]


def _segments(batch):
  """[(row, segment, tokens, loss_mask, positions)] read back from a batch."""
  out = []
  for r, seg_row in enumerate(batch["segment_ids"]):
    for s in np.unique(seg_row[seg_row > 0]):
      idx = np.flatnonzero(seg_row == s)
      out.append(
        (r, s, batch["tokens"][r, idx], batch["loss_mask"][r, idx], batch["positions"][r, idx], idx)
      )
  return out


def _check_layout(batch, examples, seq_len, pad_id):
  for key, dtype in (
    ("tokens", np.int32),
    ("loss_mask", bool),
    ("positions", np.int32),
    ("segment_ids", np.int32),
  ):
    assert batch[key].dtype == dtype and batch[key].shape[1] == seq_len
  found = _segments(batch)
  assert len(found) == len(examples)
  as_key = lambda t, m: (tuple(t.tolist()), tuple(m[1:].tolist()))
  expected = sorted(as_key(t, m) for t, m in examples)
  assert sorted(as_key(t, m) for _, _, t, m, _, _ in found) == expected
  for _, _, _, mask, positions, idx in found:
    assert not mask[0]
    np.testing.assert_array_equal(positions, np.arange(len(idx)))
    np.testing.assert_array_equal(idx, idx[0] + np.arange(len(idx)))  # contiguous
  for seg_row, tok_row, pos_row, mask_row in zip(
    batch["segment_ids"], batch["tokens"], batch["positions"], batch["loss_mask"]
  ):
    real = seg_row > 0
    n = real.sum()
    assert real[:n].all()  # padding only at the tail
    assert (np.diff(seg_row[:n]) >= 0).all() and (n == 0 or seg_row[0] == 1)
    assert (np.diff(np.unique(seg_row[:n])) == 1).all()
    assert (tok_row[~real] == pad_id).all() and (pos_row[~real] == 0).all()
    assert not mask_row[~real].any()


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(lengths=st.lists(st.integers(1, 16), max_size=12), seq_len=st.integers(16, 40))
def test_pack_layout_invariants(lengths, seq_len):
  examples = _examples(lengths)
  batch = packing.pack_examples(examples, seq_len, pad_id=0)
  _check_layout(batch, examples, seq_len, pad_id=0)
  total = sum(lengths)
  assert batch["tokens"].shape[0] >= -(-total // seq_len)
  if lengths:
    assert packing.padding_efficiency(batch) == pytest.approx(total / batch["tokens"].size)
  padded = packing.pad_batch(examples, seq_len, pad_id=7)
  _check_layout(padded, examples, seq_len, pad_id=7)
  assert padded["tokens"].shape[0] == len(examples)
  assert (padded["segment_ids"] <= 1).all()


def test_first_fit_placement():
  batch = packing.pack_examples(_examples([6, 5, 3, 2]), seq_len=8, pad_id=0)
  np.testing.assert_array_equal(batch["segment_ids"], [[1] * 6 + [2] * 2, [1] * 5 + [2] * 3])
  np.testing.assert_array_equal(
    batch["positions"], [[0, 1, 2, 3, 4, 5, 0, 1], [0, 1, 2, 3, 4, 0, 1, 2]]
  )
  fixed = packing.pack_examples(_examples([6, 5, 3, 2]), seq_len=8, pad_id=0, num_rows=3)
  assert fixed["tokens"].shape == (3, 8) and not fixed["segment_ids"][2].any()
  with pytest.raises(ValueError, match="need 2 rows.*num_rows=1"):
    packing.pack_examples(_examples([6, 5, 3, 2]), seq_len=8, pad_id=0, num_rows=1)


def test_too_long_example_is_named():
  with pytest.raises(ValueError, match="example 1 has 9 tokens.*seq_len=8"):
    packing.pack_examples(_examples([3, 9]), seq_len=8, pad_id=0)
  with pytest.raises(ValueError, match="example 0 has 9 tokens"):
    packing.pad_batch(_examples([9]), seq_len=8, pad_id=0)
  with pytest.raises(ValueError, match="equal length"):
    packing.pad_batch([([1, 2], [True])], seq_len=8, pad_id=0)


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
  segs=st.lists(st.lists(st.integers(0, 3), min_size=6, max_size=6), min_size=1, max_size=3)
)
def test_segment_mask_matches_definition(segs):
  seg = np.asarray(segs, np.int32)
  mask = np.asarray(segment_attention_mask(seg))
  B, T = seg.shape
  for b in range(B):
    for t in range(T):
      for s in range(T):
        assert mask[b, t, s] == (s <= t and seg[b, t] == seg[b, s] and seg[b, s] != 0)


def _model_params():
  """Tiny model with weights scaled up so outputs depend strongly on the context."""
  params = decoder.init_params(jax.random.key(0), CONFIG)
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  leaves = [
    x * 20
    if x.ndim == 3 or x.shape[0] == CONFIG.vocab_size
    else 0.3 * jax.random.normal(k, x.shape)
    for x, k in zip(leaves, keys)
  ]
  return jax.tree.unflatten(treedef, leaves)


@jax.jit
def _logits(params, tokens, positions, mask):
  return decoder.forward(params, tokens, positions, mask, config=CONFIG)[0]


def test_packed_logits_equal_unpacked_and_segments_are_isolated():
  params = _model_params()
  seq_len = 24
  examples = _examples([5, 12, 7, 3, 10, 20, 4, 9], seed=1)
  packed = packing.pack_examples(examples, seq_len, pad_id=0)
  assert packed["tokens"].shape[0] < len(examples)
  mask = segment_attention_mask(packed["segment_ids"])
  got = np.asarray(_logits(params, packed["tokens"], packed["positions"], mask))
  alone = packing.pad_batch(examples, seq_len, pad_id=0)
  valid = alone["segment_ids"] > 0
  want = np.asarray(
    _logits(params, alone["tokens"], alone["positions"], causal_attention_mask(valid))
  )
  assert np.isfinite(got).all()
  segments = _segments(packed)
  matched = set()
  for r, _, tokens, _, _, idx in segments:
    i = next(i for i, (t, _) in enumerate(examples) if np.array_equal(t, tokens))
    matched.add(i)
    np.testing.assert_allclose(got[r, idx], want[i, : len(idx)], atol=1e-4, rtol=0)
  assert matched == set(range(len(examples)))

  # Without the segment mask the same packed rows give different logits: the check bites.
  leaky = np.asarray(
    _logits(
      params,
      packed["tokens"],
      packed["positions"],
      causal_attention_mask(packed["segment_ids"] > 0),
    )
  )
  r, _, _, _, _, idx = next(s for s in segments if s[1] == 2)
  assert np.abs(leaky[r, idx] - got[r, idx]).max() > 1e-2

  # Perturbing one segment changes its logits and nothing else.
  r, s, _, _, _, idx = segments[0]
  tokens = packed["tokens"].copy()
  tokens[r, idx] = (tokens[r, idx] + 17 - 5) % 256 + 5
  perturbed = np.asarray(_logits(params, tokens, packed["positions"], mask))
  real = packed["segment_ids"] > 0
  same = real & ~((np.arange(len(real))[:, None] == r) & (packed["segment_ids"] == s))
  np.testing.assert_allclose(perturbed[same], got[same], atol=1e-6, rtol=0)
  assert np.abs(perturbed[r, idx] - got[r, idx]).max() > 1e-2
