"""RL objectives: the GRPO / PPO configs and the loss functions train steps call.

The configs are frozen, hashable dataclasses validated on construction (the one
place each setting is checked); experiment configs build them with
`GRPOConfig(**cfg.algo)`, so a config field is named exactly as here. Names
follow Tunix where it has one (`beta`, `kl_method`, `epsilon_low`,
`epsilon_high`, `epsilon_c`, `num_iterations`, `num_generations`,
`loss_agg_mode`). String settings name entries of the tables `credit.RULES`
(`credit` and `advantage_estimator`: each config's `rule`) and
`losses.POLICY_LOSSES / KL_ESTIMATORS / AGGREGATIONS`. The model glue the loss functions
call (the policy's logprobs, the critic's values) is in `rlpost.models.policy / critic`.

`make_grpo_loss_fn` is the loss of one micro-batch of an `RLBatch`:
trainer logprobs of the loss tokens -> clipped policy loss (+ beta * KL
- entropy bonus), all over `loss_mask`. `make_ppo_loss_fn` adds the critic's
values and the clipped value loss (actor and critic in one trainable pytree).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

from rlpost.models import critic as critic_lib
from rlpost.models import policy
from rlpost.rl import advantages as adv_lib
from rlpost.rl import credit as credit_lib
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
  _require(
    c.mini_batch_size is None or c.mini_batch_size >= 1,
    c,
    "mini_batch_size",
    "use >= 1 rows per optimizer step, or None for the whole batch",
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
  _require(
    math.isfinite(c.beta) and c.beta >= 0.0,
    c,
    "beta",
    "use a finite value >= 0 (0 disables the KL term)",
  )
  _one_of(c, "kl_method", losses.KL_ESTIMATORS)
  _require(c.kl_clamp is None or c.kl_clamp > 0, c, "kl_clamp", "use a positive value or None")
  _one_of(c, "loss_agg_mode", losses.AGGREGATIONS)
  _require(
    math.isfinite(c.entropy_coef) and c.entropy_coef >= 0.0,
    c,
    "entropy_coef",
    "use a finite value >= 0",
  )
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
    mini_batch_size: rows per optimizer step (None: the whole batch); each pass takes
      the rows in a fresh order. Advantages are computed over the whole batch first, so a
      group split across mini-batches keeps its whole-group baseline.
    advantage_estimator: an episode estimator of `credit.RULES` (grpo, drgrpo, rloo,
      reinforce_pp).
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
    credit: what one advantage covers (`credit.credits("grpo")`): "episode", the row's
      summed reward through `advantage_estimator` on every token; "turn", each turn's
      reward-to-go against its group's at that turn (`advantages.turn_grpo`); "state", the
      episode's grpo advantage plus each turn's reward-to-go against the group's turns that
      answered the same observation (`state_credit.state_grpo`). Turn and state credit
      need per-turn rewards `[N, T]`, `turn_ids` and an estimator with a
      `{credit}_{estimator}` rule (grpo).
  """

  num_generations: int = 4
  num_iterations: int = 1
  mini_batch_size: int | None = None
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
  credit: str = "episode"

  @property
  def rule(self) -> str:
    """The `credit.RULES` name this config selects."""
    if self.credit == "episode":
      return self.advantage_estimator
    return f"{self.credit}_{self.advantage_estimator}"

  def __post_init__(self):
    _one_of(self, "advantage_estimator", credit_lib.episode_estimators())
    _one_of(self, "credit", credit_lib.credits("grpo"))
    if self.rule not in credit_lib.RULES:
      rules = [
        n for n, r in credit_lib.RULES.items() if r.learner == "grpo" and r.credit == self.credit
      ]
      estimators = [n.removeprefix(f"{self.credit}_") for n in rules]
      _require(
        False,
        self,
        "credit",
        f"{self.credit} credit is the {' or '.join(estimators)} estimator's (credit.RULES: "
        f"{', '.join(rules)}), not {self.advantage_estimator!r}: use credit='episode' or "
        f"advantage_estimator={estimators[0]!r}",
      )
    _require(self.num_generations >= 1, self, "num_generations", "use at least 1 sample per prompt")
    _require(
      not credit_lib.of(self).groups or self.num_generations >= 2,
      self,
      "num_generations",
      f"{self.advantage_estimator} compares samples of a group: use "
      ">= 2 (or advantage_estimator='reinforce_pp')",
    )
    _validate_policy_fields(self)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """PPO settings: actor-critic with GAE, clipped value loss, critic warm-up.

  Names follow Tunix's PPOConfig where they mean the same thing.

  Attributes:
    num_iterations: epochs over each rollout batch.
    mini_batch_size: rows per optimizer step (None: the whole batch); each
      epoch takes the rows in a fresh order.
    num_generations: samples per prompt (episodes per task): rows of one prompt that the
      critic sees end differently. PPO's baseline is the critic, not the group, so 1 is
      the usual; the losses do not read it.
    gamma: discount, in [0, 1].
    gae_lambda: GAE lambda of the actor's advantages, in [0, 1].
    critic_lambda: GAE lambda of the critic's value targets (VC-PPO decouples
      it from the actor's; 1.0 is the unbiased Monte Carlo return).
    epsilon: ratio clip range; `epsilon_low` / `epsilon_high` default to it.
    epsilon_c: dual-clip constant (> 1) or None.
    entropy_coef: weight of the entropy bonus.
    clip_range_value: value clip range around the rollout values, or None.
    vf_coef: weight of the value loss.
    beta: KL(policy || reference) coefficient; 0 disables it.
    kl_method: a `losses.KL_ESTIMATORS` name.
    kl_in_reward: True: `-beta * KL` per token is added to the rewards before
      GAE (classic RLHF); False: `beta * KL` is a loss term (as GRPO).
    kl_clamp: optional clip of the per-token KL estimate.
    critic_warmup_steps: iterations at the start of a run in which only the
      critic trains (the actor's weights and optimizer state do not move).
    whiten_advantages: whiten advantages over the batch's loss tokens.
    credit: "token": GAE over the sampled tokens (each token a step); "turn": GAE over
      an episode's turns (`advantages.turn_gae`: a turn's rewards summed, its value read
      at the token `turn_value` names, every token of the turn given the turn's advantage);
      `gamma`, `gae_lambda` and `critic_lambda` then discount per turn, not per token.
      A batch without `turn_ids` is one turn per row.
    turn_value: with `credit="turn"`, the token whose value is the turn's ("end": its
      last sampled token, which has read the action; "start": its first, which has read
      only the observation, V(s); `advantages.turn_gae` says why "start" is the state value).
    policy_loss, loss_agg_mode, tis_cap: as in GRPOConfig.
  """

  num_iterations: int = 1
  mini_batch_size: int | None = None
  num_generations: int = 1
  gamma: float = 1.0
  gae_lambda: float = 0.95
  critic_lambda: float = 1.0
  epsilon: float = 0.2
  epsilon_low: float | None = None
  epsilon_high: float | None = None
  epsilon_c: float | None = None
  entropy_coef: float = 0.0
  clip_range_value: float | None = 0.2
  vf_coef: float = 0.1
  beta: float = 0.05
  kl_method: str = "k1"
  kl_in_reward: bool = True
  kl_clamp: float | None = None
  critic_warmup_steps: int = 0
  whiten_advantages: bool = True
  credit: str = "token"
  turn_value: str = "end"
  policy_loss: str = "clipped"
  loss_agg_mode: str = "token-mean"
  tis_cap: float | None = None

  @property
  def rule(self) -> str:
    """The `credit.RULES` name this config selects."""
    return "gae" if self.credit == "token" else f"{self.credit}_gae"

  def __post_init__(self):
    _require(0.0 <= self.epsilon < 1.0, self, "epsilon", "use a value in [0, 1)")
    _one_of(self, "credit", credit_lib.credits("ppo"))
    _one_of(self, "turn_value", adv_lib.TURN_VALUES)
    for side in ("epsilon_low", "epsilon_high"):
      if getattr(self, side) is None:  # Tunix: both sides default to epsilon
        object.__setattr__(self, side, self.epsilon)
    for name in ("gamma", "gae_lambda", "critic_lambda"):
      _require(0.0 <= getattr(self, name) <= 1.0, self, name, "use a value in [0, 1]")
    _require(self.num_generations >= 1, self, "num_generations", "use >= 1 samples per prompt")
    _require(
      self.clip_range_value is None or self.clip_range_value > 0,
      self,
      "clip_range_value",
      "use a positive clip range or None",
    )
    _require(
      math.isfinite(self.vf_coef) and self.vf_coef > 0.0,
      self,
      "vf_coef",
      "use a finite value > 0 (the critic trains on it)",
    )
    _require(
      self.critic_warmup_steps >= 0,
      self,
      "critic_warmup_steps",
      "use >= 0 critic-only iterations",
    )
    _validate_policy_fields(self)


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
  loss, metrics = losses.policy_loss(
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
  if tis_BxT is not None:  # loss tokens whose weight hit the cap
    mask = mask_BxT.astype(jnp.float32)
    capped = (tis_BxT >= config.tis_cap).astype(jnp.float32)
    metrics["tis_clip_frac"] = jnp.sum(capped * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  return loss, metrics


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
    advantages: `[batch]` or `[batch, seq]` (e.g. from `credit.advantages`).
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


def ppo_advantages(
  scores_N, values_BxT, logp_BxT, ref_logp_BxT, mask_BxT, config, turn_ids_BxT=None
):
  """PPO advantages, value targets and token rewards, each `[N, T]` float32.

  A sequence score goes on the last loss token (per-token scores, e.g. per-turn
  rewards already placed, are taken as they are, off `loss_mask` dropped); with `kl_in_reward` and
  `beta > 0`, `-beta * KL(logp || ref)` goes on every loss token. The config's credit rule
  (`credit.RULES`: gae, turn_gae) with `gae_lambda` gives the advantages (whitened over
  loss tokens when `whiten_advantages`), with `critic_lambda` the returns (value targets).
  Everything off `loss_mask` is 0, and masked slots are skipped by GAE.

  Args:
    scores_N: `[N]` sequence rewards, or `[N, T]` per-token rewards.
    values_BxT: `[N, T]` critic values from the rollout.
    logp_BxT: `[N, T]` logprobs of the policy that sampled (for the KL reward).
    ref_logp_BxT: `[N, T]` reference logprobs; may be None unless the KL is in
      the reward.
    mask_BxT: `[N, T]` loss mask.
    config: PPOConfig.
    turn_ids_BxT: `[N, T]` the turn of each slot (`credit="turn"`; None: one turn).
  """
  if scores_N.ndim == 2:
    rewards_BxT = jnp.where(mask_BxT > 0, scores_N.astype(jnp.float32), 0.0)
  else:
    rewards_BxT = adv_lib.sequence_to_token_rewards(scores_N, mask_BxT)
  if config.kl_in_reward and config.beta > 0:
    if ref_logp_BxT is None:
      raise ValueError("PPOConfig.kl_in_reward with beta > 0 needs ref_logp; pass it or set beta=0")
    rewards_BxT = losses.kl_in_rewards(
      rewards_BxT, logp_BxT, ref_logp_BxT, mask_BxT, config.beta, config.kl_method, config.kl_clamp
    )
  inputs = credit_lib.CreditInputs(rewards_BxT, mask_BxT, turn_ids_BxT, values=values_BxT)
  adv_BxT, returns_BxT = credit_lib.advantages(inputs, config)
  if config.whiten_advantages:
    adv_BxT = adv_lib.masked_whiten(adv_BxT, mask_BxT)
  return adv_BxT, returns_BxT, rewards_BxT


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
  ref_logp=None,
  value_scale=1.0,
):
  """PPO loss: policy loss (+ beta * KL unless it is in the reward) + vf_coef * value loss
  - entropy bonus.

  Shapes `[batch, seq]`; `logp_BxT` and `values_BxT` are differentiated (actor,
  critic); `old_logp`, `old_values` and `returns` come from the rollout.
  `ref_logp` (optional) adds the `kl` metric, and the loss term when
  `not config.kl_in_reward and beta > 0`. `value_scale`: the unit the value loss is
  measured in (`critic.value_scale`). Returns `(loss, metrics)`.
  """
  max_tokens = mask_BxT.shape[1]
  loss, metrics = _policy_term(
    logp_BxT, old_logp_BxT, advantages_BxT, mask_BxT, config, sampler_logp, max_tokens
  )
  metrics["pg_loss"] = loss
  kl_in_loss = not config.kl_in_reward and config.beta > 0
  if kl_in_loss and ref_logp is None:
    raise ValueError("PPOConfig.kl_in_reward=False with beta > 0 needs ref_logp in the loss")
  if ref_logp is not None:
    kl_BxT = losses.kl_penalty(logp_BxT, ref_logp, config.kl_method, config.kl_clamp, mask=mask_BxT)
    kl = losses.aggregate(kl_BxT, mask_BxT, config.loss_agg_mode, max_tokens)
    metrics["kl"] = kl
    if kl_in_loss:
      loss = loss + config.beta * kl
  vf_loss, vf_metrics = losses.value_loss(
    values_BxT,
    old_values_BxT,
    returns_BxT,
    mask_BxT,
    clip_range=config.clip_range_value,
    aggregation=config.loss_agg_mode,
    max_tokens=max_tokens,
    scale=value_scale,
  )
  metrics.update(vf_metrics, vf_loss=vf_loss)
  loss = loss + config.vf_coef * vf_loss
  loss, metrics = _add_entropy(loss, metrics, entropy, mask_BxT, config, max_tokens)
  metrics["loss"] = loss
  return loss, metrics


def _sampler_gap(logp_BxT, sampler_logp_BxT, mask_BxT) -> dict:
  """|trainer - sampler| logprob over loss tokens: its max and mean (how far the
  policy that sampled, e.g. an int8 copy or an older version, is from the trainer's)."""
  gap = jnp.abs(jax.lax.stop_gradient(logp_BxT) - sampler_logp_BxT) * mask_BxT
  return {
    "sampler_logp_gap": gap.max(),
    "sampler_logp_gap_mean": gap.sum() / jnp.maximum(mask_BxT.sum(), 1),
  }


def make_grpo_loss_fn(config: GRPOConfig, fwd: policy.ForwardConfig):
  """`loss_fn(trainable, frozen, batch: RLBatch) -> (loss, metrics)` for the train step
  (`trainable = {"policy": ...}`).

  Without `batch.old_logp` (num_iterations == 1) the old logprobs are the
  current ones under stop_gradient: the ratio is exactly 1 and the gradient is
  the on-policy policy gradient. `sampler_logp_gap` is the largest
  |trainer - sampler| logprob over loss tokens (`_mean`: their mean).
  """

  def loss_fn(trainable, frozen, batch: RLBatch):
    batch.check_shapes()
    params, adapters = policy.policy_params(trainable["policy"], frozen, fwd)
    logp, entropy = policy.completion_logprobs(params, adapters, batch, fwd, return_entropy=True)
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
    return loss, {**metrics, **_sampler_gap(logp, batch.sampler_logp, mask)}

  return loss_fn


def make_ppo_loss_fn(config: PPOConfig, fwd: policy.ForwardConfig, layout: critic_lib.CriticLayout):
  """`loss_fn(trainable, frozen, batch) -> (loss, metrics)` of actor and critic together.

  `trainable = {"policy": ..., "critic": ...}`; `frozen` is the base params
  (LoRA actor or lora critic trunk; the reference). The batch carries either
  the rollout's `values`, `returns` and token-level `advantages`, or, when it
  feeds a single optimizer step, only `scores`: then the rollout values are
  this pass's own under stop_gradient (the critic has not moved since the
  rollout), GAE runs here, and the metrics carry `value_moments` of the batch
  (no separate value pass). As in GRPO, without `batch.old_logp` the old
  logprobs are the current ones under stop_gradient.
  """

  def loss_fn(trainable, frozen, batch: RLBatch):
    batch.check_shapes()
    params, adapters = policy.policy_params(trainable["policy"], frozen, fwd)
    hidden_BxTxD = policy.completion_hidden(params, adapters, batch, fwd)
    logp, entropy = policy.logprobs_from_hidden(hidden_BxTxD, params, batch, fwd, True)
    shared = hidden_BxTxD if layout.mode == "shared" else None
    values = critic_lib.values(trainable["critic"], frozen, batch, layout, fwd, shared)
    mask = batch.loss_mask
    old = jax.lax.stop_gradient(logp) if batch.old_logp is None else batch.old_logp
    moments = {}
    if batch.values is None:
      if batch.scores is None:
        raise ValueError("the PPO loss needs batch.values/returns/advantages or batch.scores")
      old_values = jax.lax.stop_gradient(values)
      advantages, returns, _ = ppo_advantages(
        batch.scores, old_values, batch.sampler_logp, batch.ref_logp, mask, config, batch.turn_ids
      )
      moments = value_moments(old_values, returns, advantages, mask)
    else:
      old_values, advantages, returns = batch.values, batch.advantages, batch.returns
    loss, metrics = ppo_loss(
      logp,
      old,
      advantages,
      values,
      old_values,
      returns,
      mask,
      config,
      entropy=entropy,
      sampler_logp=batch.sampler_logp,
      ref_logp=batch.ref_logp,
      value_scale=critic_lib.value_scale(trainable["critic"]),
    )
    return loss, {**metrics, **moments, **_sampler_gap(logp, batch.sampler_logp, mask)}

  return loss_fn


def value_moments(values_BxT, returns_BxT, advantages_BxT, mask_BxT) -> dict:
  """Sums over loss tokens (`moments/...`) from which `value_stats` gives batch statistics.

  Sums add up over micro-batches and devices, and the train step's mean of
  them only scales them all by one factor, so the statistics stay exact for
  the whole batch.
  """
  series = {
    "returns": returns_BxT,
    "values": values_BxT,
    "advantages": advantages_BxT,
    "residual": returns_BxT - values_BxT,
  }
  moments = {"moments/count": jnp.sum(mask_BxT)}
  for name, x in series.items():
    x = jnp.where(mask_BxT > 0, x, 0.0)
    moments[f"moments/{name}/sum"] = jnp.sum(x)
    moments[f"moments/{name}/sum_sq"] = jnp.sum(x * x)
  return moments


def value_stats(moments) -> dict[str, float]:
  """`explained_variance` and mean / std of returns, values, advantages (host, float64).

  explained_variance = 1 - Var[returns - values] / Var[returns] over loss
  tokens (1: perfect; 0: no better than a constant); NaN when the returns do
  not vary (variance <= 1e-6 of their mean square: nothing to explain).
  """
  m = {k: float(v) for k, v in moments.items()}
  n = max(m["moments/count"], 1e-12)
  mean = lambda k: m[f"moments/{k}/sum"] / n
  var = lambda k: max(m[f"moments/{k}/sum_sq"] / n - mean(k) ** 2, 0.0)
  stats = {}
  for name in ("returns", "values", "advantages"):
    stats[f"{name}/mean"], stats[f"{name}/std"] = mean(name), var(name) ** 0.5
  varies = var("returns") > 1e-6 * m["moments/returns/sum_sq"] / n
  stats["explained_variance"] = 1.0 - var("residual") / var("returns") if varies else float("nan")
  return stats
