"""Static algorithm configs (GRPO family, PPO) and the losses train steps call.

The configs are frozen, hashable dataclasses, validated on construction; pass
them as static arguments or close over them. `grpo_advantages` / `grpo_loss`
and `ppo_advantages` / `ppo_loss` compose the pure pieces in `advantages.py`
and `losses.py` according to a config.
"""
import dataclasses

from rlpost import advantages as adv_lib
from rlpost import losses

ADVANTAGE_ESTIMATORS = ('grpo', 'drgrpo', 'rloo', 'reinforce_pp')
_GROUP_ESTIMATORS = ('grpo', 'drgrpo', 'rloo')


def _require(ok, config, field, fix):
  if not ok:
    value = getattr(config, field)
    raise ValueError(f'{type(config).__name__}.{field}={value!r}: {fix}')


def _validate_policy_fields(c):
  """Checks the clipping / KL / aggregation fields both configs share."""
  _require(0.0 <= c.epsilon_low < 1.0, c, 'epsilon_low',
           'use a value in [0, 1)')
  _require(c.epsilon_high >= 0.0, c, 'epsilon_high', 'use a value >= 0')
  _require(c.epsilon_c is None or c.epsilon_c > 1.0, c, 'epsilon_c',
           'dual clip needs a value > 1 (e.g. 3.0), or None to disable it')
  _require(c.kl_kind in losses.KL_KINDS, c, 'kl_kind',
           f'use one of {", ".join(losses.KL_KINDS)}')
  _require(c.kl_clamp is None or c.kl_clamp > 0, c, 'kl_clamp',
           'use a positive value or None')
  _require(c.aggregation in losses.AGGREGATIONS, c, 'aggregation',
           f'use one of {", ".join(losses.AGGREGATIONS)}')
  _require(c.max_tokens is None or c.max_tokens > 0, c, 'max_tokens',
           'use a positive token count or None')
  _require(c.aggregation != 'seq-mean-token-sum-norm' or c.max_tokens, c,
           'max_tokens', 'seq-mean-token-sum-norm needs max_tokens (the '
           'generation budget in tokens)')
  _require(c.entropy_coef >= 0.0, c, 'entropy_coef', 'use a value >= 0')
  _require(c.tis_cap is None or c.tis_cap > 0, c, 'tis_cap',
           'use a positive cap (e.g. 2.0) or None to disable truncated IS')


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """GRPO-family settings (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++).

  Attributes:
    advantage_estimator: one of ADVANTAGE_ESTIMATORS.
    num_generations: samples per prompt G (rows are prompt-major `b*G+g`).
    beta: weight of the KL(policy || reference) loss term; 0 disables it.
    kl_kind: KL estimator for that term ('k1'/'k2'/'k3' or aliases).
    kl_clamp: optional clip of the per-token KL estimate.
    epsilon_low, epsilon_high: ratio clip range `[1-low, 1+high]` (DAPO
      clip-higher uses high=0.28).
    epsilon_c: dual-clip constant (> 1) or None.
    importance: 'token' (GRPO) or 'sequence' (GSPO).
    aggregation: loss aggregation mode (see `losses.aggregate`).
    max_tokens: constant for 'seq-mean-token-sum-norm'.
    entropy_coef: weight of the entropy bonus (needs per-token entropy).
    tis_cap: truncated importance sampling cap, or None.
    advantage_epsilon: added to the group std in 'grpo'.
  """
  advantage_estimator: str = 'grpo'
  num_generations: int = 4
  beta: float = 0.04
  kl_kind: str = 'k3'
  kl_clamp: float | None = None
  epsilon_low: float = 0.2
  epsilon_high: float = 0.2
  epsilon_c: float | None = None
  importance: str = 'token'
  aggregation: str = 'token-mean'
  max_tokens: int | None = None
  entropy_coef: float = 0.0
  tis_cap: float | None = None
  advantage_epsilon: float = 1e-6

  def __post_init__(self):
    _require(self.advantage_estimator in ADVANTAGE_ESTIMATORS, self,
             'advantage_estimator',
             f'use one of {", ".join(ADVANTAGE_ESTIMATORS)}')
    _require(self.num_generations >= 1, self, 'num_generations',
             'use at least 1 sample per prompt')
    _require(self.advantage_estimator not in _GROUP_ESTIMATORS
             or self.num_generations >= 2, self, 'num_generations',
             f'{self.advantage_estimator} compares samples of a group: use '
             ">= 2 (or advantage_estimator='reinforce_pp')")
    _require(self.beta >= 0.0, self, 'beta', 'use a value >= 0 (0 disables KL)')
    _require(self.importance in losses.IMPORTANCE_LEVELS, self, 'importance',
             f'use one of {", ".join(losses.IMPORTANCE_LEVELS)}')
    _require(self.advantage_epsilon > 0, self, 'advantage_epsilon',
             'use a small positive value such as 1e-6')
    _validate_policy_fields(self)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """PPO settings (token-level KL in the reward, GAE, clipped value loss).

  Attributes:
    gamma, lam: GAE discount and lambda, each in [0, 1].
    value_clip: value-loss clip range, or None for the plain squared error.
    vf_coef: weight of the value loss.
    kl_beta: coefficient of the per-token KL penalty folded into the rewards.
    kl_kind, kl_clamp: estimator used for that penalty.
    whiten_advantages: whiten GAE advantages over the batch's valid tokens.
    epsilon_low, epsilon_high, epsilon_c, aggregation, max_tokens,
    entropy_coef, tis_cap: as in GRPOConfig.
  """
  gamma: float = 1.0
  lam: float = 0.95
  value_clip: float | None = 0.2
  vf_coef: float = 0.1
  kl_beta: float = 0.05
  kl_kind: str = 'k1'
  kl_clamp: float | None = None
  whiten_advantages: bool = True
  epsilon_low: float = 0.2
  epsilon_high: float = 0.2
  epsilon_c: float | None = None
  aggregation: str = 'token-mean'
  max_tokens: int | None = None
  entropy_coef: float = 0.0
  tis_cap: float | None = None

  def __post_init__(self):
    _require(0.0 <= self.gamma <= 1.0, self, 'gamma', 'use a value in [0, 1]')
    _require(0.0 <= self.lam <= 1.0, self, 'lam', 'use a value in [0, 1]')
    _require(self.value_clip is None or self.value_clip > 0, self, 'value_clip',
             'use a positive clip range or None')
    _require(self.vf_coef >= 0.0, self, 'vf_coef', 'use a value >= 0')
    _require(self.kl_beta >= 0.0, self, 'kl_beta', 'use a value >= 0')
    _validate_policy_fields(self)


def grpo_advantages(rewards_N, config):
  """Sequence-level advantages `[N]` with `config.advantage_estimator`.

  'reinforce_pp' here whitens the rewards with batch statistics (its KL lives
  in the loss via `beta`); use `advantages.reinforce_pp` directly for the
  token-level variant with KL folded into the rewards.
  """
  name, group = config.advantage_estimator, config.num_generations
  if name == 'grpo':
    return adv_lib.grpo(rewards_N, group, epsilon=config.advantage_epsilon)
  if name == 'drgrpo':
    return adv_lib.drgrpo(rewards_N, group)
  if name == 'rloo':
    return adv_lib.rloo(rewards_N, group)
  return adv_lib.reinforce_pp(rewards_N)


def _policy_term(logp_BxT, old_logp_BxT, advantages, mask_BxT, config,
                 sampler_logp_BxT, importance):
  """Clipped policy loss with optional truncated IS, as configured."""
  tis_BxT = None
  if config.tis_cap is not None:
    if sampler_logp_BxT is None:
      raise ValueError('tis_cap is set: pass sampler_logp (the logprobs the '
                       'sampler reported) or set tis_cap=None')
    tis_BxT = losses.truncated_is_weights(
        old_logp_BxT, sampler_logp_BxT, mask_BxT, config.tis_cap)
  return losses.policy_loss(
      logp_BxT, old_logp_BxT, advantages, mask_BxT,
      epsilon_low=config.epsilon_low, epsilon_high=config.epsilon_high,
      epsilon_c=config.epsilon_c, importance=importance, tis_weights=tis_BxT,
      aggregation=config.aggregation, max_tokens=config.max_tokens)


def _add_entropy(loss, metrics, entropy_BxT, mask_BxT, config):
  if config.entropy_coef > 0 and entropy_BxT is None:
    raise ValueError('entropy_coef > 0 needs the per-token entropy: compute it '
                     'with token_logprobs(..., return_entropy=True)')
  if entropy_BxT is not None:
    ent = losses.entropy_bonus(entropy_BxT, mask_BxT, config.aggregation,
                               config.max_tokens)
    metrics['entropy'] = ent
    loss = loss - config.entropy_coef * ent
  return loss, metrics


def grpo_loss(logp_BxT, old_logp_BxT, ref_logp_BxT, advantages, mask_BxT,
              config, entropy=None, sampler_logp=None):
  """GRPO-family loss: clipped policy loss + beta * KL - entropy_coef * entropy.

  Args:
    logp_BxT: `[batch, seq]` current-policy logprobs (differentiated).
    old_logp_BxT: `[batch, seq]` logprobs of the policy that sampled the batch.
    ref_logp_BxT: `[batch, seq]` reference-policy logprobs; may be None when
      `config.beta == 0` (then no KL metric either).
    advantages: `[batch]` or `[batch, seq]` (e.g. from `grpo_advantages`).
    mask_BxT: `[batch, seq]` completion mask.
    config: GRPOConfig.
    entropy: optional `[batch, seq]` per-token entropy (required if
      `entropy_coef > 0`).
    sampler_logp: optional `[batch, seq]` logprobs the sampler reported
      (required if `tis_cap` is set).

  Returns:
    `(loss, metrics)`: scalar float32 loss to minimize and a dict of scalars.
  """
  loss, metrics = _policy_term(logp_BxT, old_logp_BxT, advantages, mask_BxT,
                               config, sampler_logp, config.importance)
  metrics['pg_loss'] = loss
  if config.beta > 0 and ref_logp_BxT is None:
    raise ValueError('GRPOConfig.beta > 0 needs ref_logp; pass it or set '
                     'beta=0')
  if ref_logp_BxT is not None:
    kl_BxT = losses.kl_penalty(logp_BxT, ref_logp_BxT, config.kl_kind,
                               config.kl_clamp, mask=mask_BxT)
    kl = losses.aggregate(kl_BxT, mask_BxT, config.aggregation,
                          config.max_tokens)
    metrics['kl'] = kl
    if config.beta > 0:
      loss = loss + config.beta * kl
  loss, metrics = _add_entropy(loss, metrics, entropy, mask_BxT, config)
  metrics['loss'] = loss
  return loss, metrics


def ppo_advantages(scores_N, values_BxT, logp_BxT, ref_logp_BxT, mask_BxT,
                   config):
  """PPO advantages and value targets `([N, T], [N, T])` float32.

  The sequence score goes on the last valid token, `-kl_beta * KL` on every
  valid token (when `kl_beta > 0`), then GAE; advantages are whitened over the
  valid tokens if `config.whiten_advantages` (returns are not).

  Args:
    scores_N: `[N]` sequence rewards.
    values_BxT: `[N, T]` critic values from the rollout.
    logp_BxT: `[N, T]` logprobs of the rollout policy (the `old_logp` of the
      subsequent `ppo_loss` calls).
    ref_logp_BxT: `[N, T]` reference logprobs; may be None if `kl_beta == 0`.
    mask_BxT: `[N, T]` completion mask.
    config: PPOConfig.
  """
  rewards_BxT = adv_lib.sequence_to_token_rewards(scores_N, mask_BxT)
  if config.kl_beta > 0:
    if ref_logp_BxT is None:
      raise ValueError('PPOConfig.kl_beta > 0 needs ref_logp; pass it or set '
                       'kl_beta=0')
    rewards_BxT = losses.kl_in_rewards(rewards_BxT, logp_BxT, ref_logp_BxT,
                                       mask_BxT, config.kl_beta, config.kl_kind,
                                       config.kl_clamp)
  adv_BxT, returns_BxT = adv_lib.gae(rewards_BxT, values_BxT, mask_BxT,
                                     gamma=config.gamma, lam=config.lam)
  if config.whiten_advantages:
    adv_BxT = adv_lib.masked_whiten(adv_BxT, mask_BxT)
  return adv_BxT, returns_BxT


def ppo_loss(logp_BxT, old_logp_BxT, advantages_BxT, values_BxT,
             old_values_BxT, returns_BxT, mask_BxT, config, entropy=None,
             sampler_logp=None):
  """PPO loss: clipped policy loss + vf_coef * value loss - entropy bonus.

  Shapes `[batch, seq]`; `values_BxT` is differentiated (critic), `old_values`
  and `returns` come from the rollout. Returns `(loss, metrics)`.
  """
  loss, metrics = _policy_term(logp_BxT, old_logp_BxT, advantages_BxT, mask_BxT,
                               config, sampler_logp, 'token')
  metrics['pg_loss'] = loss
  vf_loss, vf_metrics = losses.value_loss(
      values_BxT, old_values_BxT, returns_BxT, mask_BxT,
      clip_range=config.value_clip, aggregation=config.aggregation,
      max_tokens=config.max_tokens)
  metrics.update(vf_metrics, vf_loss=vf_loss)
  loss = loss + config.vf_coef * vf_loss
  loss, metrics = _add_entropy(loss, metrics, entropy, mask_BxT, config)
  metrics['loss'] = loss
  return loss, metrics
