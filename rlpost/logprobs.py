"""Per-token log-probabilities and entropies without materializing full logits.

Gemma 3 has a 262,144-token vocabulary: the logits of a batch of 8 x 1024 tokens
take 8.6 GB in float32. `token_logprobs` therefore flattens the tokens, splits
them into chunks, and runs a `lax.scan` over the chunks whose body (wrapped in
`jax.checkpoint`) computes one `[chunk, vocab]` logits block, reduces it with
logsumexp and throws it away. The backward pass recomputes each block.

Also here: the small mask/position helpers every caller of a forward pass needs.
"""
from collections.abc import Sequence

import jax
import jax.numpy as jnp


def _chunk_logprobs(h_KxD, embed_VxD, targets_K, temperature, return_entropy):
  """`(logp_K,)` or `(logp_K, entropy_K)` float32 for one chunk of tokens."""
  logits_KxV = jnp.einsum(
      'kd,vd->kv', h_KxD, embed_VxD, preferred_element_type=jnp.float32)
  logits_KxV = logits_KxV / temperature
  lse_K = jax.nn.logsumexp(logits_KxV, axis=-1)
  target_logit_K = jnp.take_along_axis(
      logits_KxV, targets_K[:, None], axis=-1, mode='clip')[:, 0]
  logp_K = target_logit_K - lse_K
  if not return_entropy:
    return (logp_K,)
  probs_KxV = jnp.exp(logits_KxV - lse_K[:, None])
  entropy_K = lse_K - jnp.sum(probs_KxV * logits_KxV, axis=-1)
  return logp_K, entropy_K


def token_logprobs(hidden_BxTxD, embed_VxD, targets_BxT, mask_BxT, *,
                   temperature=1.0, chunk=256, return_entropy=False):
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

  Returns:
    `logp_BxT` float32, or `(logp_BxT, entropy_BxT)` when `return_entropy`.
  """
  batch, seq, dim = hidden_BxTxD.shape
  vocab = embed_VxD.shape[0]
  if embed_VxD.shape != (vocab, dim):
    raise ValueError(f'embed shape {embed_VxD.shape} does not match hidden dim '
                     f'{dim}: expected [vocab, {dim}]')
  if targets_BxT.shape != (batch, seq) or mask_BxT.shape != (batch, seq):
    raise ValueError(f'targets {targets_BxT.shape} and mask {mask_BxT.shape} '
                     f'must both be [batch, seq] = {(batch, seq)}')
  if chunk < 1:
    raise ValueError(f'chunk must be >= 1, got {chunk}')
  num_tokens = batch * seq
  chunk = min(chunk, num_tokens)
  num_chunks = -(-num_tokens // chunk)
  pad = num_chunks * chunk - num_tokens

  mask_BxT = mask_BxT.astype(bool)
  targets_N = jnp.where(mask_BxT, targets_BxT, 0).reshape(num_tokens)
  targets_N = jnp.clip(targets_N, 0, vocab - 1).astype(jnp.int32)
  h_NxD = hidden_BxTxD.reshape(num_tokens, dim)
  h_CxKxD = jnp.pad(h_NxD, ((0, pad), (0, 0))).reshape(num_chunks, chunk, dim)
  targets_CxK = jnp.pad(targets_N, (0, pad)).reshape(num_chunks, chunk)

  @jax.checkpoint
  def body_fn(h_KxD, t_K):
    return _chunk_logprobs(h_KxD, embed_VxD, t_K, temperature, return_entropy)

  def scan_fn(carry, xs):
    return carry, body_fn(*xs)

  _, outs = jax.lax.scan(scan_fn, None, (h_CxKxD, targets_CxK))
  outs_BxT = tuple(
      jnp.where(mask_BxT, x_CxK.reshape(-1)[:num_tokens].reshape(batch, seq),
                0.0)
      for x_CxK in outs)
  return outs_BxT if return_entropy else outs_BxT[0]


def completion_mask(tokens_BxT, stop_ids):
  """Valid-token mask of sampled completions: everything after the first stop.

  Args:
    tokens_BxT: `[batch, seq]` int sampled tokens.
    stop_ids: an int or a sequence of ints (e.g. EOS and `<end_of_turn>`).

  Returns:
    `[batch, seq]` bool; True up to and including the first stop token of each
    row (all True for rows without a stop token).
  """
  stop_S = jnp.asarray(stop_ids if isinstance(stop_ids, Sequence)
                       else [stop_ids], dtype=tokens_BxT.dtype)
  is_stop_BxT = jnp.isin(tokens_BxT, stop_S).astype(jnp.int32)
  stops_before_BxT = jnp.cumsum(is_stop_BxT, axis=-1) - is_stop_BxT
  return stops_before_BxT == 0


def positions_from_mask(mask_BxT):
  """`[batch, seq]` int32 index among valid tokens (0 at leading padding)."""
  mask_BxT = mask_BxT.astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(mask_BxT, axis=-1) - 1, 0)


def causal_attention_mask(mask_BxT):
  """`[batch, seq_q, seq_k]` bool: key is not after the query and is valid."""
  seq = mask_BxT.shape[-1]
  causal_1xTxT = jnp.tril(jnp.ones((seq, seq), dtype=bool))[None]
  return causal_1xTxT & mask_BxT.astype(bool)[:, None, :]


def segment_attention_mask(segment_ids_BxT):
  """`[batch, seq_q, seq_k]` bool for packed rows: causal, same nonzero segment.

  Segment id 0 marks padding: a padding query attends to nothing and no query
  attends to a padding key.
  """
  seq = segment_ids_BxT.shape[-1]
  causal_1xTxT = jnp.tril(jnp.ones((seq, seq), dtype=bool))[None]
  same_BxTxT = segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :]
  key_valid_Bx1xT = (segment_ids_BxT != 0)[:, None, :]
  return causal_1xTxT & same_BxTxT & key_valid_Bx1xT
