"""Policy-gradient losses, KL estimators, loss aggregation and the value loss.

All losses are minimized. Token inputs are `[batch, seq]` with a `[batch, seq]`
bool or 0/1 mask (the batch's `loss_mask`); every function first replaces
masked entries with 0 (via `jnp.where`), so masked positions may hold -inf or
NaN without making the loss or its gradient non-finite.

Three name -> function tables, one signature each; configs name entries by
string, and a new entry is one function plus one line in its table:
  POLICY_LOSSES  `fn(logp, old_logp, adv_BxT, mask, *, epsilon_low, epsilon_high,
                 epsilon_c) -> (per-token loss [B, T], metrics)`
  KL_ESTIMATORS  `fn(logp, ref_logp) -> per-token KL estimate [B, T]`
  AGGREGATIONS   `fn(x_BxT, mask_BxT, max_tokens) -> scalar`
"""

import chex
import jax
import jax.numpy as jnp

IMPORTANCE_LEVELS = ("token", "sequence")
# Cap on the VALUE of a log importance ratio: e^88 ~ 1.7e38 is the largest power of e
# below float32's maximum, so the ratio never overflows to inf (inf * 0 made the
# loss or gradient NaN on clipped and zero-advantage tokens). Below the cap nothing
# changes, bit for bit.
MAX_LOG_RATIO = 88.0


def _clean(x_BxT, mask_BxT):
  """float32 `x` with masked entries replaced by 0 (gradient-safe)."""
  return jnp.where(mask_BxT.astype(bool), x_BxT, 0.0).astype(jnp.float32)


def _per_row_mean(x_BxT, mask_BxT):
  count_B = jnp.sum(mask_BxT, axis=-1)
  return jnp.sum(x_BxT, axis=-1) / jnp.maximum(count_B, 1.0)


def _token_mean(x_BxT, mask_BxT, max_tokens):
  del max_tokens
  return jnp.sum(x_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)


def _mean_over_sequences(per_seq_B, mask_BxT):
  """Mean over rows with at least one valid token (fully padded rows do not dilute it)."""
  has_tokens_B = (jnp.sum(mask_BxT, axis=-1) > 0).astype(jnp.float32)
  num_seqs = jnp.maximum(jnp.sum(has_tokens_B), 1.0)
  return jnp.sum(per_seq_B * has_tokens_B) / num_seqs


def _seq_mean_token_mean(x_BxT, mask_BxT, max_tokens):
  del max_tokens
  return _mean_over_sequences(_per_row_mean(x_BxT, mask_BxT), mask_BxT)


def _seq_mean_token_sum(x_BxT, mask_BxT, max_tokens):
  del max_tokens
  return _mean_over_sequences(jnp.sum(x_BxT, axis=-1), mask_BxT)


def _seq_mean_token_sum_norm(x_BxT, mask_BxT, max_tokens):
  if max_tokens is None or max_tokens <= 0:
    raise ValueError(
      "aggregation seq-mean-token-sum-norm needs a positive "
      "max_tokens (e.g. the sampling budget), got "
      f"{max_tokens}"
    )
  return _mean_over_sequences(jnp.sum(x_BxT, axis=-1) / max_tokens, mask_BxT)


# Inputs arrive cleaned: masked entries of x are 0, mask is float32.
AGGREGATIONS = {
  "token-mean": _token_mean,  # DAPO
  "seq-mean-token-mean": _seq_mean_token_mean,  # GRPO paper
  "seq-mean-token-sum": _seq_mean_token_sum,
  "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,  # Dr. GRPO
}


def aggregate(loss_BxT, mask_BxT, mode, max_tokens=None):
  """Reduces a per-token loss `[batch, seq]` to a scalar with `AGGREGATIONS[mode]`.

  Modes:
    token-mean: sum over all valid tokens / number of valid tokens (DAPO).
    seq-mean-token-mean: per-sequence mean over its tokens, then mean over
      sequences (GRPO paper).
    seq-mean-token-sum: per-sequence sum, then mean over sequences.
    seq-mean-token-sum-norm: per-sequence sum / `max_tokens` (a constant such
      as the generation budget), then mean over sequences (Dr. GRPO).
  "Mean over sequences" counts rows with at least one valid token, so fully
  padded rows (batch bucketing) do not dilute the loss. Returns 0 when nothing
  is valid.
  """
  if mode not in AGGREGATIONS:
    raise ValueError(f"unknown aggregation {mode!r}; valid modes: {', '.join(AGGREGATIONS)}")
  chex.assert_rank(mask_BxT, 2)
  chex.assert_equal_shape([loss_BxT, mask_BxT])
  mask_BxT = mask_BxT.astype(jnp.float32)
  x_BxT = _clean(loss_BxT, mask_BxT) * mask_BxT
  return AGGREGATIONS[mode](x_BxT, mask_BxT, max_tokens)


def _k1(logp, ref_logp):
  return logp - ref_logp


def _k2(logp, ref_logp):
  return 0.5 * jnp.square(logp - ref_logp)


def _k3(logp, ref_logp):
  diff = logp - ref_logp
  return jnp.expm1(-diff) + diff


# Schulman's estimators of KL(policy || reference) from sampled-token logprobs,
# with the names other libraries use as aliases.
KL_ESTIMATORS = {"k1": _k1, "kl": _k1, "k2": _k2, "mse_kl": _k2, "k3": _k3, "low_var_kl": _k3}


def kl_penalty(logp, ref_logp, method="k1", clamp=None, mask=None):
  """Per-token estimate of KL(policy || reference) with `KL_ESTIMATORS[method]`.

  With `d = logp - ref_logp` (tokens sampled from the policy): k1 = d
  (unbiased, can be negative); k2 = d^2 / 2 (biased, low variance); k3 =
  exp(-d) + d - 1 (unbiased, >= 0, used by GRPO). Aliases: 'kl' = k1,
  'mse_kl' = k2, 'low_var_kl' = k3. `clamp`, if set, clips the result to
  `[-clamp, clamp]`, with gradient 0 where it clips (also where k3's exp
  overflows). Elementwise; same shape as the inputs. With `mask`, the
  inputs are sanitized first and masked outputs are 0.
  """
  if method not in KL_ESTIMATORS:
    raise ValueError(f"unknown KL estimator {method!r}; valid names: {', '.join(KL_ESTIMATORS)}")
  if mask is not None:
    logp, ref_logp = _clean(logp, mask), _clean(ref_logp, mask)
  estimator = KL_ESTIMATORS[method]
  kl = estimator(logp, ref_logp)
  if clamp is not None:
    # Where the clip saturates the gradient is 0. The estimator's backward there
    # runs at d = 0, so an overflowing exp (k3 beyond d = -88) gives 0, not 0 * inf
    # = NaN; values are unchanged.
    saturated = jax.lax.stop_gradient(jnp.abs(kl) > clamp)
    safe_kl = estimator(jnp.where(saturated, jax.lax.stop_gradient(ref_logp), logp), ref_logp)
    kl = jnp.where(saturated, jax.lax.stop_gradient(jnp.clip(kl, -clamp, clamp)), safe_kl)
  return kl if mask is None else _clean(kl, mask)


def kl_in_rewards(rewards_BxT, logp_BxT, ref_logp_BxT, mask_BxT, beta, method="k1", clamp=None):
  """PPO reward shaping: `rewards - beta * kl` on valid tokens, 0 elsewhere.

  The KL is computed from (stop-gradient) logprobs; `[batch, seq]` float32.
  """
  kl_BxT = kl_penalty(logp_BxT, ref_logp_BxT, method, clamp, mask=mask_BxT)
  kl_BxT = jax.lax.stop_gradient(kl_BxT)
  shaped_BxT = _clean(rewards_BxT, mask_BxT) - beta * kl_BxT
  return _clean(shaped_BxT, mask_BxT)


def truncated_is_weights(old_logp_BxT, sampler_logp_BxT, mask_BxT, cap):
  """Truncated importance sampling weights for sampler/trainer mismatch.

  `w = min(exp(old_logp - sampler_logp), cap)`, stop-gradient, 0 at masked
  positions. Corrects for the rollout engine computing slightly different
  logprobs than the trainer. `[batch, seq]` float32.
  """
  log_w_BxT = _clean(old_logp_BxT, mask_BxT) - _clean(sampler_logp_BxT, mask_BxT)
  w_BxT = jnp.minimum(jnp.exp(log_w_BxT), cap)
  return jax.lax.stop_gradient(_clean(w_BxT, mask_BxT))


def importance_ratio(logp_BxT, old_logp_BxT, mask_BxT, level="token"):
  """Importance ratio `[batch, seq]` of new vs old policy (0 where masked).

  level='token': `exp(logp - old_logp)` per token (PPO/GRPO).
  level='sequence' (GSPO): the value is the per-sequence geometric mean
  `s_i = exp(mean over valid tokens of (logp - old_logp))` on every token, and
  the gradient is per token: `s_i,t = sg(s_i) * exp(logp_t - sg(logp_t))`.
  The log-ratio's value is capped at `MAX_LOG_RATIO` (88) so the ratio stays
  finite in float32; its gradient is not.
  """
  if level not in IMPORTANCE_LEVELS:
    raise ValueError(f"unknown importance level {level!r}; valid: {', '.join(IMPORTANCE_LEVELS)}")
  mask_BxT = mask_BxT.astype(jnp.float32)
  logp_BxT = _clean(logp_BxT, mask_BxT)
  log_ratio_BxT = logp_BxT - _clean(old_logp_BxT, mask_BxT)
  if level == "sequence":
    seq_log_ratio_Bx1 = _per_row_mean(log_ratio_BxT, mask_BxT)[:, None]
    log_ratio_BxT = (
      jax.lax.stop_gradient(seq_log_ratio_Bx1) + logp_BxT - jax.lax.stop_gradient(logp_BxT)
    )
  # Value capped at MAX_LOG_RATIO, gradient unchanged (d ratio / d logp = ratio).
  excess_BxT = jax.lax.stop_gradient(jnp.maximum(log_ratio_BxT - MAX_LOG_RATIO, 0.0))
  return _clean(jnp.exp(log_ratio_BxT - excess_BxT), mask_BxT)


def _token_advantages(advantages, mask_BxT):
  """`[B]` or `[B, T]` advantages -> `[B, T]` float32, masked entries 0."""
  if advantages.ndim == 1:
    chex.assert_shape(advantages, mask_BxT.shape[:1])
    advantages = jnp.broadcast_to(advantages[:, None], mask_BxT.shape)
  chex.assert_equal_shape([advantages, mask_BxT])
  return _clean(advantages, mask_BxT)


def _clipped_objective(ratio_BxT, adv_BxT, mask_BxT, epsilon_low, epsilon_high, epsilon_c):
  """Per-token `max(-A r, -A clip(r))`, dual-clipped, and its clip fractions."""
  clipped_BxT = jnp.clip(ratio_BxT, 1.0 - epsilon_low, 1.0 + epsilon_high)
  loss_BxT = jnp.maximum(-adv_BxT * ratio_BxT, -adv_BxT * clipped_BxT)
  valid_BxT = mask_BxT > 0
  dual_BxT = jnp.zeros_like(valid_BxT)
  if epsilon_c is not None:
    dual_BxT = (adv_BxT < 0) & (loss_BxT > -epsilon_c * adv_BxT) & valid_BxT
    loss_BxT = jnp.where(dual_BxT, -epsilon_c * adv_BxT, loss_BxT)
  ratio_BxT = jax.lax.stop_gradient(ratio_BxT)
  high_BxT = (ratio_BxT > 1.0 + epsilon_high) & (adv_BxT > 0) & valid_BxT
  low_BxT = (ratio_BxT < 1.0 - epsilon_low) & (adv_BxT < 0) & valid_BxT
  metrics = {
    "clip_frac_high": _valid_mean(high_BxT, mask_BxT),
    "clip_frac_low": _valid_mean(low_BxT, mask_BxT),
    "clip_frac_dual": _valid_mean(dual_BxT, mask_BxT),
  }
  return loss_BxT, metrics


def clipped_surrogate(
  logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, *, epsilon_low, epsilon_high, epsilon_c
):
  """PPO / GRPO / DAPO clipped surrogate with the token ratio `exp(logp - old)`.

  Per token: `max(-A r, -A clip(r, 1-epsilon_low, 1+epsilon_high))`; with
  `epsilon_c > 1` (dual clip) tokens with `A < 0` are further capped at
  `-epsilon_c * A`.
  """
  ratio_BxT = importance_ratio(logp_BxT, old_logp_BxT, mask_BxT, "token")
  return _clipped_objective(ratio_BxT, adv_BxT, mask_BxT, epsilon_low, epsilon_high, epsilon_c)


def gspo_surrogate(
  logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, *, epsilon_low, epsilon_high, epsilon_c
):
  """GSPO: the clipped surrogate with the sequence ratio (`importance_ratio` 'sequence')."""
  ratio_BxT = importance_ratio(logp_BxT, old_logp_BxT, mask_BxT, "sequence")
  loss_BxT, metrics = _clipped_objective(
    ratio_BxT, adv_BxT, mask_BxT, epsilon_low, epsilon_high, epsilon_c
  )
  metrics["seq_ratio_mean"] = _valid_mean(jax.lax.stop_gradient(ratio_BxT), mask_BxT)
  return loss_BxT, metrics


def cispo(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, *, epsilon_low, epsilon_high, epsilon_c):
  """CISPO (MiniMax-M1, arXiv 2506.13585): clip the IS weight, not the update.

  Per token the weight `w = sg(min(r, 1 + epsilon_high))` multiplies the
  policy gradient: the gradient is `-w * A * grad logp` for EVERY token, so
  tokens far off-policy still learn (the clipped surrogate drops their
  gradient). The value is `-w * A` (written as `-w * A * exp(logp - sg(logp))`),
  the surrogate's value at the current point. No lower bound (the paper sets
  epsilon_low^IS large); `epsilon_low` and `epsilon_c` are unused.
  """
  del epsilon_low, epsilon_c
  ratio_BxT = jax.lax.stop_gradient(importance_ratio(logp_BxT, old_logp_BxT, mask_BxT, "token"))
  weight_BxT = jnp.minimum(ratio_BxT, 1.0 + epsilon_high)
  logp_BxT = _clean(logp_BxT, mask_BxT)
  unit_BxT = jnp.exp(logp_BxT - jax.lax.stop_gradient(logp_BxT))  # value 1, gradient dlogp
  loss_BxT = -weight_BxT * adv_BxT * unit_BxT
  truncated_BxT = (ratio_BxT > 1.0 + epsilon_high) & (mask_BxT > 0)
  return loss_BxT, {"clip_frac_high": _valid_mean(truncated_BxT, mask_BxT)}


# Policy losses by config name (signature in the module docstring). Inputs
# arrive cleaned: old_logp and advantages are stop-gradient, masked entries 0.
POLICY_LOSSES = {
  "clipped": clipped_surrogate,
  "gspo": gspo_surrogate,
  "cispo": cispo,
}


def policy_loss(
  logp_BxT,
  old_logp_BxT,
  advantages,
  mask_BxT,
  *,
  name="clipped",
  epsilon_low=0.2,
  epsilon_high=0.2,
  epsilon_c=None,
  tis_weights=None,
  aggregation="token-mean",
  max_tokens=None,
):
  """The policy loss `POLICY_LOSSES[name]`, weighted and aggregated.

  Optional `tis_weights` (`truncated_is_weights`) multiply the per-token loss;
  the result is reduced with `aggregate(..., aggregation, max_tokens)`.

  Args:
    logp_BxT: `[batch, seq]` logprobs of the sampled tokens under the policy
      being optimized (differentiated).
    old_logp_BxT: `[batch, seq]` logprobs under the policy that produced the
      batch (treated as constants).
    advantages: `[batch]` (sequence level) or `[batch, seq]`.
    mask_BxT: `[batch, seq]` bool or 0/1 loss mask.
    name: a POLICY_LOSSES entry ('clipped', 'gspo', ...).
    epsilon_low, epsilon_high, epsilon_c: clip range and dual-clip constant.
    tis_weights: optional `[batch, seq]` weights (stop-gradient).
    aggregation, max_tokens: see `aggregate`.

  Returns:
    `(loss, metrics)`: scalar float32 loss and a dict of scalars: the entry's
    own (clipped / gspo: `clip_frac_high` / `clip_frac_low`, the fraction of
    valid tokens whose gradient the upper / lower clip removed, and
    `clip_frac_dual`), plus for every entry `approx_kl` (`(r-1) - log r` with
    the token ratio: a k3 estimate of KL(old || new)) and `ratio_mean` (mean
    token ratio).
  """
  if name not in POLICY_LOSSES:
    raise ValueError(f"unknown policy loss {name!r}; valid names: {', '.join(POLICY_LOSSES)}")
  if epsilon_c is not None and epsilon_c <= 1.0:
    raise ValueError(f"epsilon_c (dual clip) must be > 1, got {epsilon_c}")
  chex.assert_rank(mask_BxT, 2)
  chex.assert_equal_shape([logp_BxT, old_logp_BxT, mask_BxT])
  mask_BxT = mask_BxT.astype(jnp.float32)
  old_logp_BxT = jax.lax.stop_gradient(_clean(old_logp_BxT, mask_BxT))
  adv_BxT = jax.lax.stop_gradient(_token_advantages(advantages, mask_BxT))
  loss_BxT, metrics = POLICY_LOSSES[name](
    logp_BxT,
    old_logp_BxT,
    adv_BxT,
    mask_BxT,
    epsilon_low=epsilon_low,
    epsilon_high=epsilon_high,
    epsilon_c=epsilon_c,
  )
  if tis_weights is not None:
    loss_BxT = loss_BxT * jax.lax.stop_gradient(_clean(tis_weights, mask_BxT))
  loss = aggregate(loss_BxT, mask_BxT, aggregation, max_tokens)
  log_ratio_BxT = jax.lax.stop_gradient(_clean(logp_BxT, mask_BxT)) - old_logp_BxT
  ratio_BxT = jax.lax.stop_gradient(importance_ratio(logp_BxT, old_logp_BxT, mask_BxT, "token"))
  metrics.update(
    approx_kl=_valid_mean(jnp.expm1(log_ratio_BxT) - log_ratio_BxT, mask_BxT),
    ratio_mean=_valid_mean(ratio_BxT, mask_BxT),
  )
  return loss, metrics


def _valid_mean(x_BxT, mask_BxT):
  """Mean of `x` over valid tokens (0 when none), float32 scalar."""
  num_valid = jnp.maximum(jnp.sum(mask_BxT), 1.0)
  return jnp.sum(x_BxT.astype(jnp.float32) * mask_BxT) / num_valid


def value_loss(
  values_BxT,
  old_values_BxT,
  returns_BxT,
  mask_BxT,
  *,
  clip_range=0.2,
  aggregation="token-mean",
  max_tokens=None,
  scale=1.0,
):
  """Clipped value loss `0.5 * max((v - R)^2, (v_clip - R)^2) / scale^2`, PPO-style.

  `v_clip = old_v + clip(v - old_v, -clip_range * scale, clip_range * scale)`;
  `clip_range=None` gives the plain squared error. `scale` ([] float, no gradient): the
  unit the values are learned in (normalised values: the returns' running std; the loss
  and the clip are then those of the values and returns divided by it). Returns `(loss,
  {'vf_clip_frac', ...})`, where `vf_clip_frac` is the fraction of valid tokens where the
  clipped term won.
  """
  chex.assert_equal_shape([values_BxT, old_values_BxT, returns_BxT, mask_BxT])
  mask_BxT = mask_BxT.astype(jnp.float32)
  values_BxT = _clean(values_BxT, mask_BxT)
  old_BxT = jax.lax.stop_gradient(_clean(old_values_BxT, mask_BxT))
  returns_BxT = jax.lax.stop_gradient(_clean(returns_BxT, mask_BxT))
  scale = jax.lax.stop_gradient(jnp.asarray(scale, jnp.float32))
  unclipped_BxT = jnp.square((values_BxT - returns_BxT) / scale)
  if clip_range is None:
    per_token_BxT, clipped_won_BxT = unclipped_BxT, jnp.zeros_like(mask_BxT)
  else:
    delta_BxT = jnp.clip(values_BxT - old_BxT, -clip_range * scale, clip_range * scale)
    v_clip_BxT = old_BxT + delta_BxT
    clipped_BxT = jnp.square((v_clip_BxT - returns_BxT) / scale)
    per_token_BxT = jnp.maximum(unclipped_BxT, clipped_BxT)
    clipped_won_BxT = (clipped_BxT > unclipped_BxT).astype(jnp.float32)
  loss = 0.5 * aggregate(per_token_BxT, mask_BxT, aggregation, max_tokens)
  num_valid = jnp.maximum(jnp.sum(mask_BxT), 1.0)
  metrics = {
    "vf_clip_frac": jnp.sum(clipped_won_BxT * mask_BxT) / num_valid,
    "value_mean": jnp.sum(jax.lax.stop_gradient(values_BxT) * mask_BxT) / num_valid,
  }
  return loss, metrics


def entropy_bonus(entropy_BxT, mask_BxT, aggregation="token-mean", max_tokens=None):
  """Aggregated entropy (scalar); the loss subtracts `coef * entropy_bonus`."""
  return aggregate(entropy_BxT, mask_BxT, aggregation, max_tokens)
