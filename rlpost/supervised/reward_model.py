"""A reward model: a scalar score head on a trunk's hidden state at a response's last token.

The trainable pytree is `{"trunk": the policy's trainable part (LoRA adapters over the
frozen base, or all params), "head": {"w": [D, 1], "b": []}}` (the critic's zero head,
`models.critic.init_head`). A response is scored from the hidden state at its last token
(the turn's close, which has read the prompt and the whole response), so one score per
row of an SFT-layout batch (`supervised.sft.make_batch`: prompt + response, loss mask on
the response). Trained with the Bradley-Terry loss on preference pairs (DPO's pair
batches, `supervised.dpo.make_pair_batch`).
"""

import jax
import jax.numpy as jnp

from rlpost.models import critic
from rlpost.models import policy
from rlpost.ops import masks
from rlpost.supervised import losses


def init(trunk, params) -> dict:
  """The trainable pytree over the policy's trainable part `trunk` of `params`."""
  return {"trunk": trunk, "head": critic.init_head(params["embed"].shape[1])}


def last_response_index(loss_mask_NxT: jax.Array) -> jax.Array:
  """[N] int32: each row's last response position (0 for a row without one)."""
  seq = loss_mask_NxT.shape[1]
  has = loss_mask_NxT.any(axis=1)
  return jnp.where(has, seq - 1 - jnp.argmax(loss_mask_NxT[:, ::-1], axis=1), 0).astype(jnp.int32)


def scores(trainable, frozen, rows, fwd: policy.ForwardConfig) -> jax.Array:
  """[N] float32 scores of SFT-layout `rows` (tokens, positions, segment_ids, loss_mask)."""
  params, adapters = policy.policy_params(trainable["trunk"], frozen, fwd)
  mask = masks.segment_attention_mask(rows["segment_ids"])
  hidden = policy.hidden_states(params, adapters, rows["tokens"], rows["positions"], mask, fwd)
  last = last_response_index(rows["loss_mask"])
  h_NxD = hidden[jnp.arange(hidden.shape[0]), last].astype(jnp.float32)
  return (h_NxD @ trainable["head"]["w"])[:, 0] + trainable["head"]["b"]


def batch_scores(trainable, frozen, batch, fwd: policy.ForwardConfig) -> jax.Array:
  """[N] float32 scores of an `RLBatch`'s rows (left-padded prompt, then the completion
  slots): the head on the hidden state at each row's last sampled token (`loss_mask`), the
  same token `scores` reads in an SFT-layout row of prompt + response."""
  params, adapters = policy.policy_params(trainable["trunk"], frozen, fwd)
  mask = masks.causal_attention_mask(batch.valid)
  hidden = policy.hidden_states(params, adapters, batch.tokens, batch.positions, mask, fwd)
  last = batch.prompt_len + last_response_index(batch.loss_mask > 0)
  h_NxD = hidden[jnp.arange(hidden.shape[0]), last].astype(jnp.float32)
  return (h_NxD @ trainable["head"]["w"])[:, 0] + trainable["head"]["b"]


def make_loss_fn(fwd: policy.ForwardConfig):
  """`loss_fn(trainable, frozen, micro_batch) -> (loss, metrics)`: Bradley-Terry over a
  pair micro-batch's "chosen" and "rejected" halves."""

  def loss_fn(trainable, frozen, micro_batch):
    chosen, rejected = (
      scores(trainable, frozen, micro_batch[h], fwd) for h in ("chosen", "rejected")
    )
    value, metrics = losses.bradley_terry_loss(chosen, rejected)
    return value, {k: v for k, v in metrics.items() if k != "loss"}

  return loss_fn
