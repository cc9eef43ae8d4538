"""Grouped-query attention, softmax in float32, with a hand-written backward pass.

A training pass over [B, T] tokens spends much of its attention time outside the two
matmuls: autodiff of `softmax(where(mask, q k^T))` runs several elementwise passes over
the [B, K, G, T, S] scores and XLA:CPU transposes q-sized arrays between the einsums'
layouts. Here the heads are laid out [B, K, G*T, H] (each KV head's G query heads stacked
along the rows), so both matmuls are plain batched ones, and the backward pass is written
once from the kept probabilities P:

  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dQ = dS K,  dK = dS^T Q,  dV = P^T dO.

On Gemma 3 270M (LoRA, [8, 528] tokens, remat `dots`, AMD Zen 5) a forward + backward
pass took 7.0 s against 7.8 s with autodiff of the einsum form. A one-token call (a
decode step) keeps the einsum form: it has no backward pass, and moving a cache's
[B, S, K, H] keys into [B, K, S, H] would copy them every step when K > 1.
"""

import jax
import jax.numpy as jnp

# Scores outside the mask: the most negative bfloat16-representable float32 (finite, so a
# row with no allowed key gets uniform weights instead of NaN, as the einsum form does).
MASKED = -2.3819763e38


def attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS, num_kv_heads: int):
  """softmax(q k^T masked) v for N query heads over `num_kv_heads` K key/value heads
  (query head n reads KV head n // (N // K)). q, k, v any float dtype; computed in float32.
  Returns [B, T, N * H] float32."""
  B, T, N, H = q_BxTxNxH.shape
  K = num_kv_heads
  q = q_BxTxNxH.astype(jnp.float32).reshape(B, T, K, N // K, H)
  k, v = (x.astype(jnp.float32) for x in (k_BxSxKxH, v_BxSxKxH))
  if T == 1:  # a decode step: no backward pass, and the cache keeps its layout
    scores = jnp.einsum("btkgh,bskh->bkgts", q, k)
    probs = jax.nn.softmax(jnp.where(mask_BxTxS[:, None, None], scores, MASKED), axis=-1)
    return jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(B, T, N * H)
  out = _grouped(
    q.transpose(0, 2, 3, 1, 4), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask_BxTxS
  )
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, N * H)


@jax.custom_vjp
def _grouped(q_BxKxGxTxH, k_BxKxSxH, v_BxKxSxH, mask_BxTxS):
  """[B, K, G, T, H] attention output of the grouped layout (float32 inputs)."""
  return _grouped_fwd(q_BxKxGxTxH, k_BxKxSxH, v_BxKxSxH, mask_BxTxS)[0]


def _grouped_fwd(q_BxKxGxTxH, k_BxKxSxH, v_BxKxSxH, mask_BxTxS):
  B, K, G, T, H = q_BxKxGxTxH.shape
  q_BxKxQxH = q_BxKxGxTxH.reshape(B, K, G * T, H)
  scores = jnp.einsum("bkqh,bksh->bkqs", q_BxKxQxH, k_BxKxSxH).reshape(B, K, G, T, -1)
  scores = jnp.where(mask_BxTxS[:, None, None], scores, MASKED)
  weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  probs_BxKxQxS = (weights / jnp.sum(weights, axis=-1, keepdims=True)).reshape(B, K, G * T, -1)
  out = jnp.einsum("bkqs,bksh->bkqh", probs_BxKxQxS, v_BxKxSxH).reshape(B, K, G, T, H)
  return out, (q_BxKxQxH, k_BxKxSxH, v_BxKxSxH, probs_BxKxQxS, mask_BxTxS)


def _grouped_bwd(residuals, g_BxKxGxTxH):
  q_BxKxQxH, k_BxKxSxH, v_BxKxSxH, probs_BxKxQxS, mask_BxTxS = residuals
  B, K, G, T, _ = shape = g_BxKxGxTxH.shape
  g_BxKxQxH = g_BxKxGxTxH.reshape(q_BxKxQxH.shape)
  d_probs = jnp.einsum("bkqh,bksh->bkqs", g_BxKxQxH, v_BxKxSxH)
  d_scores = probs_BxKxQxS * (d_probs - jnp.sum(d_probs * probs_BxKxQxS, axis=-1, keepdims=True))
  # masked scores are constants (a row with no allowed key spreads its weight over them)
  allowed = jnp.broadcast_to(mask_BxTxS[:, None, None], (B, K, G, T, mask_BxTxS.shape[-1]))
  d_scores = jnp.where(allowed.reshape(d_scores.shape), d_scores, 0.0)
  dq = jnp.einsum("bkqs,bksh->bkqh", d_scores, k_BxKxSxH).reshape(shape)
  dk = jnp.einsum("bkqs,bkqh->bksh", d_scores, q_BxKxQxH)
  dv = jnp.einsum("bkqs,bkqh->bksh", probs_BxKxQxS, g_BxKxQxH)
  return dq, dk, dv, None


_grouped.defvjp(_grouped_fwd, _grouped_bwd)
