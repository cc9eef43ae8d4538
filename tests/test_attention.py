"""rlpost.models.attention against a slow per-head reference: outputs and the hand-written
backward pass (q, k, v gradients), grouped heads, a row with no allowed key, decode steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.models import attention, q4_native


def per_head_reference(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS, num_kv_heads):
  """One query head at a time, autodiff of the plain masked softmax: [B, T, N * H]."""
  B, T, N, H = q_BxTxNxH.shape
  outs = []
  for n in range(N):
    kv = n // (N // num_kv_heads)
    scores = jnp.einsum("bth,bsh->bts", q_BxTxNxH[:, :, n], k_BxSxKxH[:, :, kv])
    probs = jax.nn.softmax(jnp.where(mask_BxTxS, scores, attention.MASKED), axis=-1)
    outs.append(jnp.einsum("bts,bsh->bth", probs, v_BxSxKxH[:, :, kv]))
  return jnp.stack(outs, axis=2).reshape(B, T, N * H)


def kv_major(k_BxSxKxH, v_BxSxKxH):
  """[B, S, K, H] -> [B, K, S, H], the layout `attention` takes (the cache's)."""
  return k_BxSxKxH.transpose(0, 2, 1, 3), v_BxSxKxH.transpose(0, 2, 1, 3)


@pytest.mark.parametrize(
  "B, T, S, N, K, H",
  [
    (2, 5, 7, 4, 1, 8),  # Gemma 3 270M's grouping: 4 query heads on 1 KV head
    (3, 6, 6, 6, 3, 4),  # 2 query heads per KV head, 3 KV heads
    (2, 4, 4, 2, 2, 4),  # one query head per KV head
    (2, 1, 9, 4, 2, 8),  # a decode step (T = 1)
  ],
)
def test_attention_and_its_gradients_match_the_per_head_reference(B, T, S, N, K, H):
  rng = np.random.default_rng(B * 100 + T * 10 + K)
  q, w = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(B, T, N, H), (B, T, N * H)])
  k, v = (jnp.asarray(rng.normal(size=(B, S, K, H)), jnp.float32) for _ in range(2))
  mask = jnp.asarray(rng.random((B, T, S)) < 0.6).at[0, 0].set(False)  # a row with no key
  mask = mask.at[1, -1].set(True)  # and one with every key

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v, mask, K) * w)

  got = attention.attention(q, *kv_major(k, v), mask, K)
  assert got.shape == (B, T, N * H) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, per_head_reference(q, k, v, mask, K), atol=2e-6)
  kv_major_attention = lambda q, k, v, m, K: attention.attention(q, *kv_major(k, v), m, K)
  grads = jax.grad(loss(kv_major_attention), argnums=(0, 1, 2))(q, k, v)
  expected = jax.grad(loss(per_head_reference), argnums=(0, 1, 2))(q, k, v)
  for name, g, e in zip("qkv", grads, expected):
    np.testing.assert_allclose(g, e, atol=1e-5, err_msg=f"d{name}")


def test_bfloat16_inputs_are_computed_in_float32():
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.normal(size=(1, 3, 2, 4)), jnp.bfloat16)
  k, v = (jnp.asarray(rng.normal(size=(1, 3, 1, 4)), jnp.bfloat16) for _ in range(2))
  mask = jnp.tril(jnp.ones((3, 3), bool))[None]
  got = attention.attention(q, *kv_major(k, v), mask, 1)
  as_f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, per_head_reference(*as_f32, mask, 1), atol=2e-6)


native = pytest.mark.skipif(
  not q4_native.available()[0], reason=f"no native library: {q4_native.available()[1]}"
)


@native
@pytest.mark.parametrize(
  "B, S, N, K, H, dtype",
  [
    (2, 9, 4, 1, 8, jnp.float32),  # Gemma 3 270M's grouping
    (1, 40, 9, 3, 64, jnp.float32),  # SmolLM2-135M's: 3 query heads per KV head
    (3, 11, 6, 3, 20, jnp.bfloat16),  # a bfloat16 cache; H not a multiple of 8
    (4, 256, 8, 4, 64, jnp.float32),  # enough work to hand the pairs to the thread pool
  ],
)
def test_native_decode_step_matches_the_per_head_reference(B, S, N, K, H, dtype):
  """The native kernel reads layer l of a [L, B, K, S, H] cache stack in place and equals
  the reference on that layer (float32 rounding), masked slots skipped, a row with no
  allowed slot averaged over all of them; the layer as a traced index gives the same.
  Mutations caught: every query head reading the first KV head; the newest slot left
  out; a row with no allowed slot summing the values."""
  rng = np.random.default_rng(B * 100 + S + H)
  L, layer = 3, 1
  q = jnp.asarray(rng.normal(size=(B, 1, N, H)), jnp.float32)
  cache_k, cache_v = (jnp.asarray(rng.normal(size=(L, B, K, S, H)), dtype) for _ in range(2))
  mask = jnp.asarray(rng.random((B, 1, S)) < 0.5).at[0].set(False)  # a row with no slot
  mask = mask.at[-1].set(True)  # and one with every slot
  got = attention.attention(
    q, attention.CacheLayer(cache_k, layer), attention.CacheLayer(cache_v, layer), mask, K
  )
  k, v = (c[layer].astype(jnp.float32).transpose(0, 2, 1, 3) for c in (cache_k, cache_v))
  assert got.shape == (B, 1, N * H) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, per_head_reference(q, k, v, mask, K), atol=3e-6)
  traced = jax.jit(
    lambda l: attention.decode_native(
      q, attention.CacheLayer(cache_k, l), attention.CacheLayer(cache_v, l), mask
    )
  )(jnp.int32(layer))
  np.testing.assert_array_equal(traced, got)


@native
def test_native_layers_prefill_from_the_cache_layer_and_refuse_a_bad_layer():
  """Prompt rows (T > 1) of the native path slice the cache layer and take XLA's form;
  a layer outside the stack is the kernel's named error."""
  rng = np.random.default_rng(5)
  q = jnp.asarray(rng.normal(size=(1, 3, 2, 8)), jnp.float32)
  cache = jnp.asarray(rng.normal(size=(2, 1, 1, 4, 8)), jnp.float32)
  mask = jnp.tril(jnp.ones((3, 4), bool), 1)[None]
  got = attention.attention(
    q, attention.CacheLayer(cache, 1), attention.CacheLayer(cache * 2, 1), mask, 1
  )
  want = attention.attention(q, cache[1], cache[1] * 2, mask, 1)
  np.testing.assert_array_equal(got, want)
  with pytest.raises(Exception, match="layer out of range"):
    attention.decode_native(
      q[:, :1], attention.CacheLayer(cache, 2), attention.CacheLayer(cache, 2), mask[:, :1]
    ).block_until_ready()
