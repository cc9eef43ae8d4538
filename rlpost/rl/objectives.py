"""RL objectives: the GRPO / PPO configs and the loss functions train steps call.

The configs are frozen, hashable dataclasses validated on construction (the one
place each setting is checked); experiment configs build them with
`GRPOConfig(**cfg.algo)`, so a config field is named exactly as here. Names
follow Tunix where it has one (`beta`, `kl_method`, `epsilon_low`,
`epsilon_high`, `epsilon_c`, `num_iterations`, `num_generations`,
`loss_agg_mode`). String settings name entries of the tables in
`advantages.ESTIMATORS` and `losses.POLICY_LOSSES / KL_ESTIMATORS / AGGREGATIONS`.

`make_grpo_loss_fn` is the loss of one micro-batch of an `RLBatch`:
trainer logprobs of the loss tokens -> clipped policy loss (+ beta * KL
- entropy bonus), all over `loss_mask`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rlpost.models import policy
from rlpost.ops.masks import causal_attention_mask
from rlpost.rl import advantages as adv_lib
from rlpost.rl import losses
from rlpost.rl.batch import RLBatch


def _require(ok, config, field, fix):
  if not ok:
    value = getattr(config, field)
    raise ValueError(f"{type(config).__name__}.{field}={value!r}: {fix}")


def _one_of(config, field, table):
  _require(getattr(config, field) in table, config, field, f"use one of {', '.join(table)}")


def _validate_policy_fields(c):
  """Checks the policy-loss / KL / aggregation fields both configs share."""
  _require(
    c.num_iterations >= 1, c, "num_iterations", "use >= 1 optimisation passes per rollout batch"
  )
  _one_of(c, "policy_loss", losses.POLICY_LOSSES)
  _require(0.0 <= c.epsilon_low < 1.0, c, "epsilon_low", "use a value in [0, 1)")
  _require(c.epsilon_high >= 0.0, c, "epsilon_high", "use a value >= 0")
  _require(
    c.epsilon_c is None or c.epsilon_c > 1.0,
    c,
    "epsilon_c",
    "dual clip needs a value > 1 (e.g. 3.0), or None to disable it",
  )
  _require(c.beta >= 0.0, c, "beta", "use a value >= 0 (0 disables the KL term)")
  _one_of(c, "kl_method", losses.KL_ESTIMATORS)
  _require(c.kl_clamp is None or c.kl_clamp > 0, c, "kl_clamp", "use a positive value or None")
  _one_of(c, "loss_agg_mode", losses.AGGREGATIONS)
  _require(c.entropy_coef >= 0.0, c, "entropy_coef", "use a value >= 0")
  _require(
    c.tis_cap is None or c.tis_cap > 0,
    c,
    "tis_cap",
    "use a positive cap (e.g. 2.0) or None to disable truncated IS",
  )


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """GRPO-family settings (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++, CISPO).

  Attributes:
    num_generations: samples per prompt G (rows are prompt-major `b*G+g`).
    num_iterations: optimisation passes (mu) over each rollout batch.
    advantage_estimator: an `advantages.ESTIMATORS` name.
    policy_loss: a `losses.POLICY_LOSSES` name ('clipped'; 'gspo' for GSPO).
    beta: weight of the KL(policy || reference) loss term; 0 disables it.
    kl_method: a `losses.KL_ESTIMATORS` name for that term.
    kl_clamp: optional clip of the per-token KL estimate.
    epsilon_low, epsilon_high: ratio clip range `[1-low, 1+high]` (DAPO
      clip-higher uses high=0.28).
    epsilon_c: dual-clip constant (> 1) or None.
    loss_agg_mode: a `losses.AGGREGATIONS` name ('seq-mean-token-sum-norm'
      divides by the completion width T).
    entropy_coef: weight of the entropy bonus.
    tis_cap: truncated importance sampling cap, or None.
  """

  num_generations: int = 4
  num_iterations: int = 1
  advantage_estimator: str = "grpo"
  policy_loss: str = "clipped"
  beta: float = 0.04
  kl_method: str = "k3"
  kl_clamp: float | None = None
  epsilon_low: float = 0.2
  epsilon_high: float = 0.2
  epsilon_c: float | None = None
  loss_agg_mode: str = "token-mean"
  entropy_coef: float = 0.0
  tis_cap: float | None = None

  def __post_init__(self):
    _one_of(self, "advantage_estimator", adv_lib.ESTIMATORS)
    _require(self.num_generations >= 1, self, "num_generations", "use at least 1 sample per prompt")
    _require(
      self.advantage_estimator not in adv_lib.GROUP_ESTIMATORS or self.num_generations >= 2,
      self,
      "num_generations",
      f"{self.advantage_estimator} compares samples of a group: use "
      ">= 2 (or advantage_estimator='reinforce_pp')",
    )
    _validate_policy_fields(self)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """PPO settings (token-level KL in the reward, GAE, clipped value loss).

  Attributes:
    gamma, gae_lambda: GAE discount and lambda, each in [0, 1].
    clip_range_value: value-loss clip range, or None for the plain squared error.
    vf_coef: weight of the value loss.
    beta: coefficient of the per-token KL penalty folded into the rewards.
    whiten_advantages: whiten GAE advantages over the batch's loss tokens.
    num_iterations, policy_loss, kl_method, kl_clamp, epsilon_low, epsilon_high,
    epsilon_c, loss_agg_mode, entropy_coef, tis_cap: as in GRPOConfig.
  """

  num_iterations: int = 1
  gamma: float = 1.0
  gae_lambda: float = 0.95
  clip_range_value: float | None = 0.2
  vf_coef: float = 0.1
  beta: float = 0.05
  kl_method: str = "k1"
  kl_clamp: float | None = None
  whiten_advantages: bool = True
  policy_loss: str = "clipped"
  epsilon_low: float = 0.2
  epsilon_high: float = 0.2
  epsilon_c: float | None = None
  loss_agg_mode: str = "token-mean"
  entropy_coef: float = 0.0
  tis_cap: float | None = None

  def __post_init__(self):
    _require(0.0 <= self.gamma <= 1.0, self, "gamma", "use a value in [0, 1]")
    _require(0.0 <= self.gae_lambda <= 1.0, self, "gae_lambda", "use a value in [0, 1]")
    _require(
      self.clip_range_value is None or self.clip_range_value > 0,
      self,
      "clip_range_value",
      "use a positive clip range or None",
    )
    _require(self.vf_coef >= 0.0, self, "vf_coef", "use a value >= 0")
    _validate_policy_fields(self)


def grpo_advantages(rewards_N, config: GRPOConfig):
  """Sequence-level advantages `[N]` with `ESTIMATORS[config.advantage_estimator]`.

  'reinforce_pp' here whitens the rewards with batch statistics (its KL lives
  in the loss via `beta`); use `advantages.reinforce_pp` directly for the
  token-level variant with KL folded into the rewards.
  """
  estimator = adv_lib.ESTIMATORS[config.advantage_estimator]
  return estimator(rewards_N, config.num_generations)


def _policy_term(
  logp_BxT, old_logp_BxT, advantages, mask_BxT, config, sampler_logp_BxT, max_tokens
):
  """The configured policy loss with optional truncated IS."""
  tis_BxT = None
  if config.tis_cap is not None:
    if sampler_logp_BxT is None:
      raise ValueError(
        "tis_cap is set: pass sampler_logp (the logprobs the sampler reported) or set tis_cap=None"
      )
    tis_BxT = losses.truncated_is_weights(old_logp_BxT, sampler_logp_BxT, mask_BxT, config.tis_cap)
  return losses.policy_loss(
    logp_BxT,
    old_logp_BxT,
    advantages,
    mask_BxT,
    name=config.policy_loss,
    epsilon_low=config.epsilon_low,
    epsilon_high=config.epsilon_high,
    epsilon_c=config.epsilon_c,
    tis_weights=tis_BxT,
    aggregation=config.loss_agg_mode,
    max_tokens=max_tokens,
  )


def _add_entropy(loss, metrics, entropy_BxT, mask_BxT, config, max_tokens):
  if config.entropy_coef > 0 and entropy_BxT is None:
    raise ValueError(
      "entropy_coef > 0 needs the per-token entropy: compute it "
      "with token_logprobs(..., return_entropy=True)"
    )
  if entropy_BxT is not None:
    ent = losses.entropy_bonus(entropy_BxT, mask_BxT, config.loss_agg_mode, max_tokens)
    metrics["entropy"] = ent
    loss = loss - config.entropy_coef * ent
  return loss, metrics


def grpo_loss(
  logp_BxT,
  old_logp_BxT,
  ref_logp_BxT,
  advantages,
  mask_BxT,
  config,
  entropy=None,
  sampler_logp=None,
):
  """GRPO-family loss: policy loss + beta * KL - entropy_coef * entropy.

  Args:
    logp_BxT: `[batch, seq]` current-policy logprobs (differentiated).
    old_logp_BxT: `[batch, seq]` logprobs of the policy that sampled the batch.
    ref_logp_BxT: `[batch, seq]` reference-policy logprobs; may be None when
      `config.beta == 0` (then no KL metric either).
    advantages: `[batch]` or `[batch, seq]` (e.g. from `grpo_advantages`).
    mask_BxT: `[batch, seq]` loss mask; its width T is the `max_tokens` of
      'seq-mean-token-sum-norm'.
    config: GRPOConfig.
    entropy: optional `[batch, seq]` per-token entropy (required if
      `entropy_coef > 0`).
    sampler_logp: optional `[batch, seq]` logprobs the sampler reported
      (required if `tis_cap` is set).

  Returns:
    `(loss, metrics)`: scalar float32 loss to minimize and a dict of scalars.
  """
  max_tokens = mask_BxT.shape[1]
  loss, metrics = _policy_term(
    logp_BxT, old_logp_BxT, advantages, mask_BxT, config, sampler_logp, max_tokens
  )
  metrics["pg_loss"] = loss
  if config.beta > 0 and ref_logp_BxT is None:
    raise ValueError("GRPOConfig.beta > 0 needs ref_logp; pass it or set beta=0")
  if ref_logp_BxT is not None:
    kl_BxT = losses.kl_penalty(
      logp_BxT, ref_logp_BxT, config.kl_method, config.kl_clamp, mask=mask_BxT
    )
    kl = losses.aggregate(kl_BxT, mask_BxT, config.loss_agg_mode, max_tokens)
    metrics["kl"] = kl
    if config.beta > 0:
      loss = loss + config.beta * kl
  loss, metrics = _add_entropy(loss, metrics, entropy, mask_BxT, config, max_tokens)
  metrics["loss"] = loss
  return loss, metrics


def ppo_advantages(scores_N, values_BxT, logp_BxT, ref_logp_BxT, mask_BxT, config):
  """PPO advantages and value targets `([N, T], [N, T])` float32.

  The sequence score goes on the last valid token, `-beta * KL` on every
  valid token (when `beta > 0`), then GAE; advantages are whitened over the
  valid tokens if `config.whiten_advantages` (returns are not).

  Args:
    scores_N: `[N]` sequence rewards.
    values_BxT: `[N, T]` critic values from the rollout.
    logp_BxT: `[N, T]` logprobs of the rollout policy (the `old_logp` of the
      subsequent `ppo_loss` calls).
    ref_logp_BxT: `[N, T]` reference logprobs; may be None if `beta == 0`.
    mask_BxT: `[N, T]` loss mask.
    config: PPOConfig.
  """
  rewards_BxT = adv_lib.sequence_to_token_rewards(scores_N, mask_BxT)
  if config.beta > 0:
    if ref_logp_BxT is None:
      raise ValueError("PPOConfig.beta > 0 needs ref_logp; pass it or set beta=0")
    rewards_BxT = losses.kl_in_rewards(
      rewards_BxT, logp_BxT, ref_logp_BxT, mask_BxT, config.beta, config.kl_method, config.kl_clamp
    )
  adv_BxT, returns_BxT = adv_lib.gae(
    rewards_BxT, values_BxT, mask_BxT, gamma=config.gamma, lam=config.gae_lambda
  )
  if config.whiten_advantages:
    adv_BxT = adv_lib.masked_whiten(adv_BxT, mask_BxT)
  return adv_BxT, returns_BxT


def ppo_loss(
  logp_BxT,
  old_logp_BxT,
  advantages_BxT,
  values_BxT,
  old_values_BxT,
  returns_BxT,
  mask_BxT,
  config,
  entropy=None,
  sampler_logp=None,
):
  """PPO loss: policy loss + vf_coef * value loss - entropy bonus.

  Shapes `[batch, seq]`; `values_BxT` is differentiated (critic), `old_values`
  and `returns` come from the rollout. Returns `(loss, metrics)`.
  """
  max_tokens = mask_BxT.shape[1]
  loss, metrics = _policy_term(
    logp_BxT, old_logp_BxT, advantages_BxT, mask_BxT, config, sampler_logp, max_tokens
  )
  metrics["pg_loss"] = loss
  vf_loss, vf_metrics = losses.value_loss(
    values_BxT,
    old_values_BxT,
    returns_BxT,
    mask_BxT,
    clip_range=config.clip_range_value,
    aggregation=config.loss_agg_mode,
    max_tokens=max_tokens,
  )
  metrics.update(vf_metrics, vf_loss=vf_loss)
  loss = loss + config.vf_coef * vf_loss
  loss, metrics = _add_entropy(loss, metrics, entropy, mask_BxT, config, max_tokens)
  metrics["loss"] = loss
  return loss, metrics


def completion_logprobs(
  params, adapters, batch: RLBatch, fwd: policy.ForwardConfig, return_entropy: bool = False
):
  """Trainer logprobs [N, T] float32 (and entropy) of the completion's loss tokens.

  The same forward and temperature as the sampler, so with the sampler's own
  weights it reproduces `batch.sampler_logp` (float32, ~1e-5). Slots off
  `loss_mask` are 0.
  """
  P, T = batch.prompt_len, batch.completion_len
  hidden_BxSxD = policy.hidden_states(
    params, adapters, batch.tokens, batch.positions, causal_attention_mask(batch.valid), fwd
  )
  return policy.token_logprobs(
    hidden_BxSxD[:, P - 1 : P + T - 1],
    params["embed"],
    batch.tokens[:, P:],
    batch.loss_mask > 0,
    fwd,
    return_entropy=return_entropy,
  )


@functools.partial(jax.jit, static_argnames=("fwd",))
def completion_logprobs_jit(params, adapters, batch: RLBatch, fwd: policy.ForwardConfig):
  """Jitted `completion_logprobs` without gradients (reference / old-policy logprobs)."""
  return completion_logprobs(params, adapters, batch, fwd.without_remat())


def make_grpo_loss_fn(config: GRPOConfig, fwd: policy.ForwardConfig):
  """`loss_fn(trainable, frozen, batch: RLBatch) -> (loss, metrics)` for the train step.

  Without `batch.old_logp` (num_iterations == 1) the old logprobs are the
  current ones under stop_gradient: the ratio is exactly 1 and the gradient is
  the on-policy policy gradient. `sampler_logp_gap` is the largest
  |trainer - sampler| logprob over loss tokens.
  """

  def loss_fn(trainable, frozen, batch: RLBatch):
    batch.check_shapes()
    params, adapters = policy.policy_params(trainable, frozen, fwd)
    logp, entropy = completion_logprobs(params, adapters, batch, fwd, return_entropy=True)
    mask = batch.loss_mask
    old = jax.lax.stop_gradient(logp) if batch.old_logp is None else batch.old_logp
    loss, metrics = grpo_loss(
      logp,
      old,
      batch.ref_logp,
      batch.advantages,
      mask,
      config,
      entropy=entropy,
      sampler_logp=batch.sampler_logp,
    )
    gap = jnp.abs(jax.lax.stop_gradient(logp) - batch.sampler_logp) * mask
    return loss, {**metrics, "sampler_logp_gap": gap.max()}

  return loss_fn
