"""Mask/position helpers (rlpost.ops.masks) against NumPy loops, with and without jit."""

import functools

from absl.testing import parameterized
import chex
import numpy as np

from rlpost.ops import masks


class HelperTest(parameterized.TestCase):
  """Mask/position helpers vs numpy loops, with and without jit."""

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(((3,),), ((3, 5),), ((),))
  def test_completion_mask(self, stop_ids):
    stop_ids = stop_ids if stop_ids else 4
    tokens = self.rng.integers(0, 8, size=(6, 12)).astype(np.int32)
    got = self.variant(functools.partial(masks.completion_mask, stop_ids=stop_ids))(tokens)
    stops = set(np.atleast_1d(stop_ids).tolist())
    want = np.ones_like(tokens, bool)
    for b in range(tokens.shape[0]):
      for t in range(tokens.shape[1]):
        if tokens[b, t] in stops:
          want[b, t + 1 :] = False
          break
    np.testing.assert_array_equal(got, want)

  @chex.variants(with_jit=True, without_jit=True)
  def test_positions_and_attention_masks(self):
    mask = self.rng.random((5, 9)) < 0.6
    mask[0] = False
    positions = self.variant(masks.positions_from_mask)(mask)
    attn = self.variant(masks.causal_attention_mask)(mask)
    want_pos = np.zeros(mask.shape, int)
    want_attn = np.zeros(mask.shape + mask.shape[-1:], bool)
    for b in range(mask.shape[0]):
      count = 0
      for t in range(mask.shape[1]):
        count += int(mask[b, t])
        want_pos[b, t] = max(count - 1, 0)
        for k in range(t + 1):
          want_attn[b, t, k] = mask[b, k]
    np.testing.assert_array_equal(positions, want_pos)
    np.testing.assert_array_equal(attn, want_attn)

  @chex.variants(with_jit=True, without_jit=True)
  def test_segment_attention_mask(self):
    segments = np.array(
      [[1, 1, 2, 2, 2, 0, 0], [1, 2, 2, 3, 3, 3, 0], [0, 0, 1, 1, 1, 1, 1]], np.int32
    )
    got = self.variant(masks.segment_attention_mask)(segments)
    want = np.zeros(segments.shape + segments.shape[-1:], bool)
    for b, row in enumerate(segments):
      for q in range(len(row)):
        for k in range(q + 1):
          want[b, q, k] = row[q] == row[k] and row[k] != 0
    np.testing.assert_array_equal(got, want)
