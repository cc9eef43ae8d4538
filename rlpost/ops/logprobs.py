"""Per-token log-probabilities and entropies without materializing full logits.

Gemma 3 has a 262,144-token vocabulary: the logits of a batch of 8 x 1024 tokens
take 8.6 GB in float32. `token_logprobs` therefore flattens the tokens, splits
them into chunks, and runs a `lax.scan` over the chunks whose body (wrapped in
`jax.checkpoint`) computes one `[chunk, vocab]` logits block, reduces it with
logsumexp and throws it away. The backward pass recomputes each block (a
single block is kept instead) and has a hand-written rule (`_chunk_logprobs`).
"""

import functools

import jax
import jax.numpy as jnp


def _matmul_dtype(h_KxD, embed_VxD, compute_dtype):
  return jnp.dtype(compute_dtype) if compute_dtype else jnp.result_type(h_KxD, embed_VxD)


def _chunk_forward(h_KxD, embed_VxD, targets_K, temperature, return_entropy, compute_dtype):
  """(outputs, residuals) of one chunk: the logits block is computed once and kept."""
  dtype = _matmul_dtype(h_KxD, embed_VxD, compute_dtype)
  h_c, e_c = h_KxD.astype(dtype), embed_VxD.astype(dtype)
  z_KxV = jnp.einsum("kd,vd->kv", h_c, e_c, preferred_element_type=jnp.float32) / temperature
  lse_K, mean_z_K = _row_stats(z_KxV, return_entropy)
  target_z_K = jnp.take_along_axis(z_KxV, targets_K[:, None], axis=-1, mode="clip")[:, 0]
  outs = (target_z_K - lse_K,)
  if return_entropy:
    outs += (lse_K - mean_z_K,)
  return outs, (h_c, e_c, targets_K, z_KxV, lse_K, mean_z_K)


def _row_stats(z_KxV, with_mean: bool):
  """(logsumexp(z) [K], E_softmax(z)[z] [K] or None), float32, one row at a time.

  A `lax.map` over rows: XLA:CPU runs `jax.nn.logsumexp` over a [512, 262144]
  block as a reduction fusion whose exp is ~6x slower than this loop's.
  """

  def one_row(z_V):
    peak = jnp.max(z_V)
    weights_V = jnp.exp(z_V - peak)
    total = jnp.sum(weights_V)
    mean = jnp.sum(weights_V * z_V) / total if with_mean else jnp.zeros(())
    return peak + jnp.log(total), mean

  lse_K, mean_z_K = jax.lax.map(one_row, z_KxV)
  return lse_K, (mean_z_K if with_mean else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _chunk_logprobs(h_KxD, embed_VxD, targets_K, temperature, return_entropy, compute_dtype):
  """`(logp_K,)` or `(logp_K, entropy_K)` float32 for one chunk of tokens.

  z = h @ embed.T / temperature with the matmul inputs in `compute_dtype`
  (None: the promoted input dtype) and float32 accumulation; logp = z[target]
  - logsumexp(z); entropy = logsumexp(z) - sum(softmax(z) * z).

  The backward pass is written by hand: one fused elementwise pass turns the
  kept logits into dz = g_logp * (onehot - p) + g_ent * p * (E_p[z] - z)
  (cast to the matmul dtype), then d(h) = dz @ embed and d(embed) = dz.T @ h,
  both accumulating in float32. Autodiff instead runs several passes over the
  [K, V] logits (logsumexp, take_along_axis's scatter, the softmax), and with
  bfloat16 matmul inputs its backward matmuls would see a float32 cotangent
  and run in float32.
  """
  return _chunk_forward(h_KxD, embed_VxD, targets_K, temperature, return_entropy, compute_dtype)[0]


def _chunk_logprobs_fwd(h_KxD, embed_VxD, targets_K, temperature, return_entropy, compute_dtype):
  outs, res = _chunk_forward(
    h_KxD, embed_VxD, targets_K, temperature, return_entropy, compute_dtype
  )
  dtypes = (jnp.zeros((0,), h_KxD.dtype), jnp.zeros((0,), embed_VxD.dtype))
  return outs, (res, dtypes, temperature)


def _chunk_logprobs_bwd(return_entropy, compute_dtype, residuals, g):
  (h_c, e_c, targets_K, z_KxV, lse_K, mean_z_K), (h_like, e_like), temperature = residuals
  probs_KxV = jnp.exp(z_KxV - lse_K[:, None])
  onehot_KxV = jnp.arange(z_KxV.shape[1])[None, :] == targets_K[:, None]
  dz_KxV = g[0][:, None] * (onehot_KxV.astype(jnp.float32) - probs_KxV)
  if return_entropy:
    dz_KxV = dz_KxV + g[1][:, None] * probs_KxV * (mean_z_K[:, None] - z_KxV)
  dtemp = -jnp.sum(dz_KxV * z_KxV) / temperature  # z = raw / T; dead code unless wanted
  dz_KxV = (dz_KxV / temperature).astype(h_c.dtype)
  dh_KxD = jnp.einsum("kv,vd->kd", dz_KxV, e_c, preferred_element_type=jnp.float32)
  # d(embed) contracts over the chunk axis; XLA:CPU runs that layout as a slow
  # float32 dot (~110 GFLOP/s), a transposed copy of dz first as a ~200 GFLOP/s one.
  de_VxD = jnp.einsum("vk,kd->vd", jnp.transpose(dz_KxV), h_c, preferred_element_type=jnp.float32)
  return (
    dh_KxD.astype(h_like.dtype),
    de_VxD.astype(e_like.dtype),
    None,
    dtemp.astype(jnp.result_type(temperature)),
  )


_chunk_logprobs.defvjp(_chunk_logprobs_fwd, _chunk_logprobs_bwd)


def _check_logprob_args(hidden_BxTxD, embed_VxD, targets_BxT, mask_BxT, temperature, chunk):
  batch, seq, dim = hidden_BxTxD.shape
  vocab = embed_VxD.shape[0]
  if embed_VxD.shape != (vocab, dim):
    raise ValueError(
      f"embed shape {embed_VxD.shape} does not match hidden dim {dim}: expected [vocab, {dim}]"
    )
  if targets_BxT.shape != (batch, seq) or mask_BxT.shape != (batch, seq):
    raise ValueError(
      f"targets {targets_BxT.shape} and mask {mask_BxT.shape} "
      f"must both be [batch, seq] = {(batch, seq)}"
    )
  if chunk < 1:
    raise ValueError(f"chunk must be >= 1, got {chunk}")
  if isinstance(temperature, (int, float)) and not temperature > 0:
    raise ValueError(
      f"temperature={temperature}: logits are divided by it, so it must be > 0 (greedy "
      "sampling has no logprobs to recompute; use the sampler's temperature)"
    )


def token_logprobs(
  hidden_BxTxD,
  embed_VxD,
  targets_BxT,
  mask_BxT,
  *,
  temperature=1.0,
  chunk=256,
  return_entropy=False,
  compute_dtype=None,
):
  """Log-probs of `targets` under `softmax(hidden @ embed.T / temperature)`.

  Tokens are processed `chunk` at a time along the flattened `B*T` axis (padded
  internally when `chunk` does not divide `B*T`), so peak extra memory is about
  `chunk * vocab * 4` bytes instead of `B * T * vocab * 4`. The matmul
  accumulates and the logsumexp runs in float32 whatever the input dtype.
  Gradients flow to `hidden` and `embed`.

  Args:
    hidden_BxTxD: `[batch, seq, dim]` final hidden states (after the final
      norm), float32 or bfloat16.
    embed_VxD: `[vocab, dim]` tied output embedding, float32 or bfloat16.
    targets_BxT: `[batch, seq]` int token ids whose log-prob is wanted (usually
      the inputs shifted left by one).
    mask_BxT: `[batch, seq]` bool or 0/1; masked positions return 0 (their
      targets may be any value, e.g. -1).
    temperature: logits are divided by this (the sampler's temperature, so that
      sampler and trainer compute the same quantity).
    chunk: tokens per scan step; reduced to `B*T` when larger.
    return_entropy: also return the per-token entropy of the full distribution.
    compute_dtype: dtype of the projection's matmul inputs (e.g. "bfloat16" for
      mixed precision: float32 accumulation, softmax and gradients otherwise);
      None uses the promoted dtype of `hidden` and `embed`.

  Returns:
    `logp_BxT` float32, or `(logp_BxT, entropy_BxT)` when `return_entropy`.
  """
  _check_logprob_args(hidden_BxTxD, embed_VxD, targets_BxT, mask_BxT, temperature, chunk)
  batch, seq, dim = hidden_BxTxD.shape
  vocab = embed_VxD.shape[0]
  num_tokens = batch * seq
  if num_tokens == 0:  # an empty batch (no rows or no positions): nothing to project
    zeros_BxT = jnp.zeros((batch, seq), jnp.float32)
    return (zeros_BxT, zeros_BxT) if return_entropy else zeros_BxT
  chunk = min(chunk, num_tokens)
  num_chunks = -(-num_tokens // chunk)
  pad = num_chunks * chunk - num_tokens

  mask_BxT = mask_BxT.astype(bool)
  targets_N = jnp.where(mask_BxT, targets_BxT, 0).reshape(num_tokens)
  targets_N = jnp.clip(targets_N, 0, vocab - 1).astype(jnp.int32)
  h_NxD = hidden_BxTxD.reshape(num_tokens, dim)
  h_CxKxD = jnp.pad(h_NxD, ((0, pad), (0, 0))).reshape(num_chunks, chunk, dim)
  targets_CxK = jnp.pad(targets_N, (0, pad)).reshape(num_chunks, chunk)

  def body_fn(h_KxD, t_K):
    return _chunk_logprobs(h_KxD, embed_VxD, t_K, temperature, return_entropy, compute_dtype)

  if num_chunks == 1:  # the one logits block is kept for the backward pass
    outs = tuple(x[None] for x in body_fn(h_CxKxD[0], targets_CxK[0]))
  else:  # each block is recomputed in the backward pass
    body_fn = jax.checkpoint(body_fn)
    _, outs = jax.lax.scan(lambda carry, xs: (carry, body_fn(*xs)), None, (h_CxKxD, targets_CxK))
  outs_BxT = tuple(
    jnp.where(mask_BxT, x_CxK.reshape(-1)[:num_tokens].reshape(batch, seq), 0.0) for x_CxK in outs
  )
  return outs_BxT if return_entropy else outs_BxT[0]


def token_logprobs_at_slots(hidden_BxTxD, embed_VxD, targets_BxT, mask_BxT, slots_BxC, **kwargs):
  """`token_logprobs` that projects only the `C` listed slots of each row.

  A multi-turn row has a few sampled tokens among many observation slots: the
  `[chunk, vocab]` projection (most of a small model's FLOPs at Gemma 3's 262k
  vocabulary) then runs on `B*C` tokens instead of `B*T`. Values and gradients
  are those of `token_logprobs` wherever the mask is 1 and a slot lists the position.

  Args:
    hidden_BxTxD, embed_VxD, targets_BxT, mask_BxT: as `token_logprobs`.
    slots_BxC: `[batch, C]` int positions in `[0, T)` to project, -1 for none;
      positions on the mask that no slot lists get 0, as masked ones.
    **kwargs: `token_logprobs`'s keywords (temperature, chunk, return_entropy,
      compute_dtype).

  Returns:
    As `token_logprobs`: `[batch, seq]` float32 (and the entropy).
  """
  seq = targets_BxT.shape[1]
  listed_BxC = slots_BxC >= 0
  at_BxC = jnp.clip(slots_BxC, 0, seq - 1)
  h_BxCxD = jnp.take_along_axis(hidden_BxTxD, at_BxC[:, :, None], axis=1)
  take = lambda x_BxT: jnp.take_along_axis(x_BxT, at_BxC, axis=1)
  mask_BxC = listed_BxC & take(mask_BxT.astype(bool))
  outs = token_logprobs(h_BxCxD, embed_VxD, take(targets_BxT), mask_BxC, **kwargs)
  # unlisted slots index T, past the end: dropped by the scatter
  to_BxC = jnp.where(listed_BxC, slots_BxC, seq)
  scatter = jax.vmap(
    lambda x_C, to_C: jnp.zeros((seq,), jnp.float32).at[to_C].add(x_C, mode="drop")
  )
  if kwargs.get("return_entropy"):
    return tuple(scatter(x, to_BxC) for x in outs)
  return scatter(outs, to_BxC)
