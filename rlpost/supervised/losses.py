"""SFT and preference losses (DPO, ORPO, SimPO, KTO) over log-probabilities.

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


def _mean_logprob(logp_B: jax.Array, tokens_B: jax.Array) -> jax.Array:
  """[B] float32: a sequence logprob divided by its token count (at least 1)."""
  return logp_B.astype(jnp.float32) / jnp.maximum(tokens_B.astype(jnp.float32), 1.0)


def orpo_loss(
  chosen_logp_B: jax.Array,
  rejected_logp_B: jax.Array,
  chosen_tokens_B: jax.Array,
  rejected_tokens_B: jax.Array,
  *,
  lam: float = 0.1,
) -> tuple[jax.Array, Metrics]:
  """ORPO (Hong et al. 2024, arXiv 2403.07691), no reference model: the chosen response's
  token-mean NLL plus `lam` times -log sigmoid(log odds ratio), averaged over the batch.

  With P(y|x) = exp(mean token logprob of y) and odds(y|x) = P / (1 - P), the log odds
  ratio of a pair is log odds(chosen) - log odds(rejected) (log1p(-P) computed stably).

  Args:
    chosen_logp_B, rejected_logp_B: [B] float sequence logprobs (`sequence_logprob`).
    chosen_tokens_B, rejected_tokens_B: [B] their response token counts.
    lam: the paper's lambda, the weight of the odds-ratio term.

  Returns:
    (loss [] float32, {"loss", "nll" (the SFT term), "log_odds_ratio" (mean),
    "reward_accuracy" (fraction with log odds ratio > 0)}).
  """
  chex.assert_equal_shape([chosen_logp_B, rejected_logp_B, chosen_tokens_B, rejected_tokens_B])
  chosen = _mean_logprob(chosen_logp_B, chosen_tokens_B)
  rejected = _mean_logprob(rejected_logp_B, rejected_tokens_B)
  # log(P / (1 - P)) = log P - log(1 - P); mean logprobs are < 0, so 1 - P > 0
  log_odds = lambda m: m - jnp.log(-jnp.expm1(m))
  ratio = log_odds(chosen) - log_odds(rejected)
  nll = -jnp.mean(chosen)
  loss = nll - lam * jnp.mean(jax.nn.log_sigmoid(ratio))
  metrics = {
    "loss": loss,
    "nll": nll,
    "log_odds_ratio": jnp.mean(ratio),
    "reward_accuracy": jnp.mean((ratio > 0).astype(jnp.float32)),
  }
  return loss, metrics


def simpo_loss(
  chosen_logp_B: jax.Array,
  rejected_logp_B: jax.Array,
  chosen_tokens_B: jax.Array,
  rejected_tokens_B: jax.Array,
  *,
  beta: float = 2.0,
  gamma: float = 1.0,
  length_normalized: bool = True,
) -> tuple[jax.Array, Metrics]:
  """SimPO (Meng et al. 2024, arXiv 2405.14734), no reference model:
  -log sigmoid(beta * mean logprob(chosen) - beta * mean logprob(rejected) - gamma),
  averaged over the batch. `length_normalized=False` uses the sequence logprobs (with
  gamma 0: DPO's loss against a reference that scores both responses alike).

  Args:
    chosen_logp_B, rejected_logp_B: [B] float sequence logprobs.
    chosen_tokens_B, rejected_tokens_B: [B] their response token counts.
    beta: the reward scale; gamma: the target reward margin (the paper's gamma).

  Returns:
    (loss [] float32, {"loss", "chosen_reward", "rejected_reward", "reward_margin"
    (batch means of beta * mean logprob and their difference), "reward_accuracy"}).
  """
  chex.assert_equal_shape([chosen_logp_B, rejected_logp_B, chosen_tokens_B, rejected_tokens_B])

  def reward(logp_B, tokens_B):
    return beta * (
      _mean_logprob(logp_B, tokens_B) if length_normalized else logp_B.astype(jnp.float32)
    )

  chosen, rejected = (
    reward(chosen_logp_B, chosen_tokens_B),
    reward(rejected_logp_B, rejected_tokens_B),
  )
  margin = chosen - rejected
  loss = -jnp.mean(jax.nn.log_sigmoid(margin - gamma))
  metrics = {
    "loss": loss,
    "chosen_reward": jnp.mean(chosen),
    "rejected_reward": jnp.mean(rejected),
    "reward_margin": jnp.mean(margin),
    "reward_accuracy": jnp.mean((margin > 0).astype(jnp.float32)),
  }
  return loss, metrics


def kto_loss(
  policy_logp_B: jax.Array,
  ref_logp_B: jax.Array,
  desirable_B: jax.Array,
  policy_kl_logp_B: jax.Array,
  ref_kl_logp_B: jax.Array,
  *,
  beta: float = 0.1,
  lambda_d: float = 1.0,
  lambda_u: float = 1.0,
) -> tuple[jax.Array, Metrics]:
  """KTO (Ethayarajh et al. 2024, arXiv 2402.01306) over unpaired examples, averaged over
  the batch: lambda_y - v(x, y), with the implied reward r = log pi(y|x) - log ref(y|x),
  the reference point z0 = max(0, mean over the batch of the mismatched examples'
  log pi - log ref) (no gradient through it), and
  v = lambda_d * sigmoid(beta * (r - z0)) for a desirable y,
      lambda_u * sigmoid(beta * (z0 - r)) for an undesirable one.

  Args:
    policy_logp_B, ref_logp_B: [B] sequence logprobs of each example's completion.
    desirable_B: [B] bool, the example's label.
    policy_kl_logp_B, ref_kl_logp_B: [B] sequence logprobs of a completion under a
      prompt it was not written for (the batch shifted by one), for the KL estimate.
    beta: the value's scale; lambda_d, lambda_u: the desirable / undesirable weights.

  Returns:
    (loss [] float32, {"loss", "kl" (z0), "desirable_reward", "undesirable_reward" (beta
    * r, means over each label's examples, 0 when none), "desirable_fraction"}).
  """
  chex.assert_equal_shape([policy_logp_B, ref_logp_B, desirable_B, policy_kl_logp_B])
  f32 = lambda x: x.astype(jnp.float32)
  kl = jnp.mean(f32(policy_kl_logp_B) - f32(ref_kl_logp_B))
  z0 = jax.lax.stop_gradient(jnp.maximum(kl, 0.0))
  r = f32(policy_logp_B) - f32(ref_logp_B)
  good = desirable_B.astype(bool)
  value = jnp.where(
    good, lambda_d * jax.nn.sigmoid(beta * (r - z0)), lambda_u * jax.nn.sigmoid(beta * (z0 - r))
  )
  loss = jnp.mean(jnp.where(good, lambda_d, lambda_u) - value)
  count = lambda m: jnp.maximum(jnp.sum(m.astype(jnp.float32)), 1.0)
  metrics = {
    "loss": loss,
    "kl": z0,
    "desirable_reward": jnp.sum(jnp.where(good, beta * r, 0.0)) / count(good),
    "undesirable_reward": jnp.sum(jnp.where(good, 0.0, beta * r)) / count(~good),
    "desirable_fraction": jnp.mean(good.astype(jnp.float32)),
  }
  return loss, metrics


def bradley_terry_loss(
  chosen_score_B: jax.Array, rejected_score_B: jax.Array
) -> tuple[jax.Array, Metrics]:
  """A reward model's Bradley-Terry loss -log sigmoid(s_chosen - s_rejected), averaged
  over the batch's pairs.

  Returns:
    (loss [] float32, {"loss", "accuracy" (fraction with s_chosen > s_rejected),
    "margin", "chosen_score", "rejected_score" (batch means)}).
  """
  chex.assert_equal_shape([chosen_score_B, rejected_score_B])
  margin = chosen_score_B.astype(jnp.float32) - rejected_score_B.astype(jnp.float32)
  loss = -jnp.mean(jax.nn.log_sigmoid(margin))
  metrics = {
    "loss": loss,
    "accuracy": jnp.mean((margin > 0).astype(jnp.float32)),
    "margin": jnp.mean(margin),
    "chosen_score": jnp.mean(chosen_score_B),
    "rejected_score": jnp.mean(rejected_score_B),
  }
  return loss, metrics
