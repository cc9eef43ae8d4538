"""SFT and DPO losses over per-token log-probabilities.

Inputs are per-token logprobs `logp_BxT` float32 (e.g. from
`rlpost.logprobs.token_logprobs`) and a bool mask of the tokens that count.
Masked-out positions are excluded with `jnp.where`, so their values (even
-inf or NaN) affect neither the losses nor their gradients.
"""

import chex
import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]


def sequence_logprob(logp_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
  """[B] float32: sum of the masked per-token logprobs of each sequence."""
  chex.assert_equal_shape([logp_BxT, mask_BxT])
  chex.assert_rank(logp_BxT, 2)
  return jnp.sum(jnp.where(mask_BxT, logp_BxT.astype(jnp.float32), 0.0), axis=-1)


def sft_loss(
  logp_BxT: jax.Array, loss_mask_BxT: jax.Array, *, num_tokens: jax.Array | float | None = None
) -> tuple[jax.Array, Metrics]:
  """Token-mean negative log-likelihood over the masked tokens.

  Args:
    logp_BxT: float per-token logprobs of the targets.
    loss_mask_BxT: bool, True on the tokens trained on.
    num_tokens: divisor; None for this batch's masked-token count (at least 1).
      Pass the global count when the batch is one micro-batch or shard of a
      larger batch, so the summed losses are the global token mean.

  Returns:
    (loss [] float32, {"loss", "tokens" (masked-token count), "perplexity": exp(loss)}).
  """
  tokens = jnp.sum(loss_mask_BxT.astype(jnp.float32))
  divisor = jnp.maximum(tokens, 1.0) if num_tokens is None else num_tokens
  loss = -jnp.sum(sequence_logprob(logp_BxT, loss_mask_BxT)) / divisor
  return loss, {"loss": loss, "tokens": tokens, "perplexity": jnp.exp(loss)}


def _check_dpo_args(beta, label_smoothing) -> None:
  if isinstance(beta, (int, float)) and beta <= 0:
    raise ValueError(f"dpo_loss beta={beta} must be > 0 (typical: 0.1)")
  if isinstance(label_smoothing, (int, float)) and not 0 <= label_smoothing < 0.5:
    raise ValueError(
      f"dpo_loss label_smoothing={label_smoothing} must be in [0, 0.5) "
      "(0 for plain DPO; at 0.5 the loss no longer depends on the policy)"
    )


def dpo_loss(
  policy_chosen_logp_B: jax.Array,
  policy_rejected_logp_B: jax.Array,
  ref_chosen_logp_B: jax.Array,
  ref_rejected_logp_B: jax.Array,
  *,
  beta: float = 0.1,
  label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
  """Sigmoid DPO loss, with conservative label smoothing `ls`, averaged over the batch.

  With implicit rewards r = beta * (policy_logp - ref_logp) and margin
  m = r_chosen - r_rejected, the per-pair loss is
  -(1 - ls) * log_sigmoid(m) - ls * log_sigmoid(-m).

  Args:
    policy_chosen_logp_B, policy_rejected_logp_B: [B] float sequence logprobs
      (`sequence_logprob`) of the chosen / rejected responses under the policy.
    ref_chosen_logp_B, ref_rejected_logp_B: [B] the same under the reference.
    beta: inverse temperature of the implicit reward (> 0).
    label_smoothing: assumed probability that a preference label is flipped.

  Returns:
    (loss [] float32, {"loss", "chosen_reward", "rejected_reward",
    "reward_margin" (batch means), "reward_accuracy" (fraction with
    chosen reward > rejected reward)}).
  """
  _check_dpo_args(beta, label_smoothing)
  chex.assert_rank(policy_chosen_logp_B, 1)
  chex.assert_equal_shape(
    [policy_chosen_logp_B, policy_rejected_logp_B, ref_chosen_logp_B, ref_rejected_logp_B]
  )
  f32 = lambda x: x.astype(jnp.float32)
  chosen = beta * (f32(policy_chosen_logp_B) - f32(ref_chosen_logp_B))
  rejected = beta * (f32(policy_rejected_logp_B) - f32(ref_rejected_logp_B))
  margin = chosen - rejected
  per_pair = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(
    margin
  ) - label_smoothing * jax.nn.log_sigmoid(-margin)
  loss = jnp.mean(per_pair)
  metrics = {
    "loss": loss,
    "chosen_reward": jnp.mean(chosen),
    "rejected_reward": jnp.mean(rejected),
    "reward_margin": jnp.mean(margin),
    "reward_accuracy": jnp.mean((chosen > rejected).astype(jnp.float32)),
  }
  return loss, metrics
