"""Attention masks and positions every caller of a forward pass needs ([batch, seq] inputs)."""

from collections.abc import Sequence

import jax.numpy as jnp


def completion_mask(tokens_BxT, stop_ids):
  """Valid-token mask of sampled completions: everything after the first stop.

  Args:
    tokens_BxT: `[batch, seq]` int sampled tokens.
    stop_ids: an int or a sequence of ints (e.g. EOS and `<end_of_turn>`).

  Returns:
    `[batch, seq]` bool; True up to and including the first stop token of each
    row (all True for rows without a stop token).
  """
  stop_S = jnp.asarray(
    stop_ids if isinstance(stop_ids, Sequence) else [stop_ids], dtype=tokens_BxT.dtype
  )
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
