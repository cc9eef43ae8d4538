"""Tests for rlpost.rl.objectives: config validation and loss composition."""

import dataclasses

import jax
import numpy as np
import pytest

from rlpost.rl import advantages as adv_lib
from rlpost.rl import losses
from rlpost.rl import objectives

GRPO, PPO = objectives.GRPOConfig, objectives.PPOConfig


@pytest.mark.parametrize(
  "cls,kwargs,field,hint",
  [
    (
      GRPO,
      dict(advantage_estimator="ppo"),
      "advantage_estimator",
      "grpo, drgrpo, rloo, reinforce_pp",
    ),
    (GRPO, dict(num_generations=1), "num_generations", ">= 2"),
    (GRPO, dict(advantage_estimator="rloo", num_generations=1), "num_generations", ">= 2"),
    (
      GRPO,
      dict(num_generations=0, advantage_estimator="reinforce_pp"),
      "num_generations",
      "at least 1",
    ),
    (GRPO, dict(epsilon_c=1.0), "epsilon_c", "> 1"),
    (GRPO, dict(epsilon_low=1.0), "epsilon_low", "[0, 1)"),
    (GRPO, dict(kl_method="k4"), "kl_method", "low_var_kl"),
    (GRPO, dict(loss_agg_mode="sum"), "loss_agg_mode", "seq-mean-token-sum-norm"),
    (GRPO, dict(policy_loss="seq"), "policy_loss", "clipped, gspo"),
    (GRPO, dict(num_iterations=0), "num_iterations", ">= 1"),
    (GRPO, dict(beta=-0.1), "beta", ">= 0"),
    (GRPO, dict(tis_cap=0.0), "tis_cap", "positive"),
    (PPO, dict(gamma=1.5), "gamma", "[0, 1]"),
    (PPO, dict(gae_lambda=-0.1), "gae_lambda", "[0, 1]"),
    (PPO, dict(clip_range_value=0.0), "clip_range_value", "positive"),
    (PPO, dict(kl_method="kl2"), "kl_method", "k3"),
    (PPO, dict(critic_lambda=1.5), "critic_lambda", "[0, 1]"),
    (PPO, dict(critic_warmup_steps=-1), "critic_warmup_steps", ">= 0"),
    (PPO, dict(mini_batch_size=0), "mini_batch_size", "None for the whole batch"),
    (PPO, dict(epsilon=1.0), "epsilon", "[0, 1)"),
    (PPO, dict(credit="episode"), "credit", "token, turn"),
    (PPO, dict(turn_value="middle"), "turn_value", "end, start"),
  ],
)
def test_config_validation_names_field_and_fix(cls, kwargs, field, hint):
  with pytest.raises(ValueError) as err:
    cls(**kwargs)
  message = str(err.value)
  assert message.startswith(f"{cls.__name__}.{field}="), message
  assert hint in message, message


@pytest.mark.parametrize(
  "cls, field",
  [(GRPO, "beta"), (GRPO, "entropy_coef"), (PPO, "beta"), (PPO, "entropy_coef"), (PPO, "vf_coef")],
)
def test_infinite_loss_weights_fail_at_construction(cls, field):
  """A loss weight of inf (`--config.algo.beta=inf`) fails when the config is built, naming
  the field; it used to pass and make every train step non-finite (inf * a zero KL is NaN),
  stopping the run after train.max_bad_steps with advice about the learning rate.

  Mutation caught: `beta >= 0` / `entropy_coef >= 0` / `vf_coef > 0` without isfinite.
  """
  with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{field}=inf: use a finite value"):
    cls(**{field: float("inf")})


def test_configs_are_frozen_hashable_static_args():
  config = GRPO(advantage_estimator="reinforce_pp", num_generations=1)
  assert hash(config) == hash(dataclasses.replace(config))
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.beta = 1.0  # pytype: disable=not-writable
  hash(PPO())


def _batch(seed=0, batch=4, seq=5):
  rng = np.random.default_rng(seed)
  mask = rng.random((batch, seq)) < 0.8
  mask[:, 0] = True
  old = -rng.exponential(size=(batch, seq)).astype(np.float32)
  logp = old + rng.uniform(-0.5, 0.5, (batch, seq)).astype(np.float32)
  ref = -rng.exponential(size=(batch, seq)).astype(np.float32)
  entropy = rng.uniform(0, 2, (batch, seq)).astype(np.float32)
  adv = rng.normal(size=batch).astype(np.float32)
  return mask, old, logp, ref, entropy, adv


def test_grpo_loss_at_ratio_one_matches_numpy():
  mask, old, _, ref, entropy, adv = _batch()
  config = GRPO(beta=0.1, entropy_coef=0.01, kl_method="k3")
  loss, metrics = objectives.grpo_loss(old, old, ref, adv, mask, config, entropy=entropy)
  d = old.astype(np.float64) - ref
  k3 = np.exp(-d) + d - 1
  adv_bt = np.broadcast_to(adv[:, None], mask.shape)
  want = -adv_bt[mask].mean() + 0.1 * k3[mask].mean() - 0.01 * entropy[mask].mean()
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(metrics["kl"], k3[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["entropy"], entropy[mask].mean(), rtol=1e-5)
  assert float(metrics["loss"]) == float(loss)


@pytest.mark.parametrize("policy_loss", list(losses.POLICY_LOSSES))
def test_grpo_loss_composes_pieces(policy_loss):
  mask, old, logp, ref, entropy, adv = _batch(1)
  sampler = old + 0.05
  config = GRPO(
    beta=0.04,
    kl_method="k1",
    policy_loss=policy_loss,
    loss_agg_mode="seq-mean-token-mean",
    epsilon_high=0.28,
    tis_cap=1.5,
    entropy_coef=0.001,
  )
  step = jax.jit(objectives.grpo_loss, static_argnames="config")
  loss, metrics = step(
    logp, old, ref, adv, mask, config=config, entropy=entropy, sampler_logp=sampler
  )
  tis = losses.truncated_is_weights(old, sampler, mask, 1.5)
  pg, _ = losses.policy_loss(
    logp,
    old,
    adv,
    mask,
    epsilon_high=0.28,
    name=policy_loss,
    tis_weights=tis,
    aggregation="seq-mean-token-mean",
  )
  agg = lambda x: losses.aggregate(x, mask, "seq-mean-token-mean")
  want = pg + 0.04 * agg(logp - ref) - 0.001 * agg(entropy)
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-6)


def test_tis_clip_fraction_counts_the_loss_tokens_whose_weight_hit_the_cap():
  """Against numpy: the share of masked-in tokens with exp(old - sampler) >= cap.

  Mutation caught: averaging over every token instead of the loss tokens.
  """
  mask, old, logp, ref, entropy, adv = _batch(3)
  gap = np.random.default_rng(3).uniform(0.0, 1.0, size=old.shape).astype(np.float32)
  sampler = old - gap
  _, metrics = objectives.grpo_loss(
    logp, old, ref, adv, mask, GRPO(tis_cap=1.5), sampler_logp=sampler
  )
  m = np.asarray(mask) > 0
  want = np.mean(gap[m] >= np.log(1.5))
  assert 0.1 < want < 0.9  # the case is not degenerate
  np.testing.assert_allclose(metrics["tis_clip_frac"], want, atol=1e-6)
  _, off = objectives.grpo_loss(logp, old, ref, adv, mask, GRPO())
  assert "tis_clip_frac" not in off


def test_grpo_loss_missing_inputs_raise():
  mask, old, logp, ref, entropy, adv = _batch(2)
  with pytest.raises(ValueError, match="ref_logp"):
    objectives.grpo_loss(logp, old, None, adv, mask, GRPO(beta=0.1))
  with pytest.raises(ValueError, match="sampler_logp"):
    objectives.grpo_loss(logp, old, ref, adv, mask, GRPO(tis_cap=2.0))
  with pytest.raises(ValueError, match="return_entropy"):
    objectives.grpo_loss(logp, old, ref, adv, mask, GRPO(entropy_coef=0.1))
  loss, metrics = objectives.grpo_loss(logp, old, None, adv, mask, GRPO(beta=0.0), entropy=entropy)
  assert "kl" not in metrics and np.isfinite(float(loss))


def _np_ppo_advantages(scores, values, logp, ref, mask, beta, gamma, lam):
  """Loop reference: last-token score, k1 penalty, GAE recursion, whitening."""
  adv = np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    idx = list(np.flatnonzero(mask[b]))
    next_value, next_adv = 0.0, 0.0
    for k, t in reversed(list(enumerate(idx))):
      reward = -beta * (float(logp[b, t]) - float(ref[b, t]))
      if k == len(idx) - 1:
        reward += scores[b]
      delta = reward + gamma * next_value - values[b, t]
      next_adv = delta + gamma * lam * next_adv
      next_value = values[b, t]
      adv[b, t] = next_adv
  returns = np.where(mask, adv + values, 0.0)
  valid = adv[mask]
  white = np.where(mask, (adv - valid.mean()) / np.sqrt(valid.var() + 1e-8), 0)
  return white, returns


def test_ppo_advantages_and_loss():
  mask, old, logp, ref, entropy, _ = _batch(3)
  rng = np.random.default_rng(3)
  scores = rng.normal(size=mask.shape[0]).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  config = PPO(gamma=0.95, gae_lambda=0.9, critic_lambda=0.9, beta=0.1, entropy_coef=0.01)
  adv, returns, _ = objectives.ppo_advantages(scores, values, old, ref, mask, config)
  want_adv, want_ret = _np_ppo_advantages(scores, values, old, ref, mask, 0.1, 0.95, 0.9)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(returns, want_ret, rtol=1e-4, atol=1e-5)
  # Decoupled lambdas (VC-PPO): advantages from gae_lambda, value targets from critic_lambda.
  decoupled = dataclasses.replace(config, critic_lambda=1.0)
  adv_d, returns_d, _ = objectives.ppo_advantages(scores, values, old, ref, mask, decoupled)
  _, want_ret_1 = _np_ppo_advantages(scores, values, old, ref, mask, 0.1, 0.95, 1.0)
  np.testing.assert_allclose(adv_d, want_adv, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(returns_d, want_ret_1, rtol=1e-4, atol=1e-5)
  assert not np.allclose(returns_d, want_ret, atol=1e-3)  # the two lambdas really differ here
  new_values = values + rng.uniform(-0.3, 0.3, values.shape).astype(np.float32)
  # Non-default clip ranges, checked against NumPy (mutation caught: ppo_loss ignoring
  # clip_range_value, epsilon_low or epsilon_high and using the library defaults).
  config = PPO(
    gamma=0.95,
    gae_lambda=0.9,
    beta=0.1,
    entropy_coef=0.01,
    epsilon_low=0.1,
    epsilon_high=0.3,
    clip_range_value=0.05,
    vf_coef=0.5,
    critic_lambda=0.9,
  )
  adv = np.asarray(adv)
  loss, metrics = objectives.ppo_loss(
    logp, old, adv, new_values, values, returns, mask, config, entropy=entropy
  )
  ratio = np.exp(logp.astype(np.float64) - old)
  pg_tok = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.9, 1.3))
  v_clip = values + np.clip(new_values - values, -0.05, 0.05)
  vf_tok = 0.5 * np.maximum((new_values - want_ret) ** 2, (v_clip - want_ret) ** 2)
  mean = lambda x: x[mask].mean()
  # The clip ranges matter on this batch: each bound is hit and each term has clipped tokens.
  assert ((ratio < 0.9) & mask).any() and ((ratio > 1.1) & (ratio < 1.3) & mask).any()
  assert (((new_values - values) ** 2 > 0.05**2) & mask).any()
  np.testing.assert_allclose(metrics["pg_loss"], mean(pg_tok), rtol=1e-5)
  np.testing.assert_allclose(metrics["vf_loss"], mean(vf_tok), rtol=1e-5)
  np.testing.assert_allclose(
    loss, mean(pg_tok) + 0.5 * mean(vf_tok) - 0.01 * mean(entropy), rtol=1e-5
  )


@pytest.mark.parametrize("turn_value", ["end", "start"])
def test_ppo_turn_credit_reads_each_turns_value_where_the_config_says(turn_value):
  """`credit="turn"`: the advantages and returns are `turn_gae`'s with `value_at` the
  config's `turn_value` (and not the other's: the values differ inside a turn here).

  Mutation caught: `ppo_advantages` not passing `turn_value` on (always "end")."""
  mask, old, _, ref, _, _ = _batch(4)
  rng = np.random.default_rng(4)
  scores = rng.normal(size=mask.shape).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  ids = np.cumsum(rng.random(mask.shape) < 0.3, axis=1).astype(np.int32)
  config = PPO(gamma=0.9, gae_lambda=0.8, critic_lambda=0.8, beta=0.0, credit="turn")
  config = dataclasses.replace(config, turn_value=turn_value, whiten_advantages=False)
  adv, returns, _ = objectives.ppo_advantages(scores, values, old, ref, mask, config, ids)
  for value_at in ("end", "start"):
    want = adv_lib.turn_gae(scores, values, mask, ids, gamma=0.9, lam=0.8, value_at=value_at)
    same = np.allclose(adv, want[0], atol=1e-6) and np.allclose(returns, want[1], atol=1e-6)
    assert same == (value_at == turn_value), value_at


def test_ppo_epsilon_sides_default_to_epsilon():
  assert (PPO(epsilon=0.3).epsilon_low, PPO(epsilon=0.3).epsilon_high) == (0.3, 0.3)
  assert PPO(epsilon=0.3, epsilon_high=0.28).epsilon_high == 0.28


def test_ppo_kl_goes_to_the_reward_or_to_the_loss():
  """kl_in_reward: -beta * k1 per token in the rewards, no loss term; else beta * KL in the loss."""
  mask, old, logp, ref, _, _ = _batch(5)
  rng = np.random.default_rng(5)
  scores = rng.normal(size=mask.shape[0]).astype(np.float32)
  values = np.zeros(mask.shape, np.float32)
  in_reward = PPO(beta=0.2, whiten_advantages=False, gae_lambda=1.0)
  _, _, rewards = objectives.ppo_advantages(scores, values, old, ref, mask, in_reward)
  last = adv_lib.sequence_to_token_rewards(scores, mask)
  want = np.where(mask, np.asarray(last) - 0.2 * (old.astype(np.float64) - ref), 0.0)
  np.testing.assert_allclose(rewards, want, rtol=1e-5, atol=1e-6)
  in_loss = dataclasses.replace(in_reward, kl_in_reward=False)
  _, _, rewards = objectives.ppo_advantages(scores, values, old, ref, mask, in_loss)
  np.testing.assert_allclose(rewards, last)
  args = (logp, old, np.zeros(mask.shape, np.float32), values, values, values, mask)
  loss_r, m_r = objectives.ppo_loss(*args, in_reward, ref_logp=ref)
  loss_l, m_l = objectives.ppo_loss(*args, in_loss, ref_logp=ref)
  np.testing.assert_allclose(m_r["kl"], m_l["kl"])
  np.testing.assert_allclose(loss_l - loss_r, 0.2 * m_l["kl"], rtol=1e-5)
  with pytest.raises(ValueError, match="ref_logp"):
    objectives.ppo_loss(*args, in_loss)


def test_value_stats_from_summed_moments_equal_the_direct_statistics():
  """Moments of two halves added (what the train step's mean does, up to one factor)
  give the whole batch's explained variance, means and stds; constant returns: NaN."""
  rng = np.random.default_rng(0)
  returns = rng.normal(2.0, 1.5, (6, 9)).astype(np.float32)
  values = (returns + rng.normal(0, 0.5, (6, 9))).astype(np.float32)
  adv = rng.normal(0, 1, (6, 9)).astype(np.float32)
  mask = (rng.random((6, 9)) > 0.3).astype(np.float32)
  halves = [
    objectives.value_moments(values[s], returns[s], adv[s], mask[s])
    for s in (slice(0, 3), slice(3, 6))
  ]
  stats = objectives.value_stats(jax.tree.map(lambda a, b: (a + b) / 2, *halves))
  on = mask > 0
  r, v, a = (x[on].astype(np.float64) for x in (returns, values, adv))
  np.testing.assert_allclose(stats["explained_variance"], 1 - np.var(r - v) / np.var(r), rtol=1e-4)
  for name, x in (("returns", r), ("values", v), ("advantages", a)):
    np.testing.assert_allclose(stats[f"{name}/mean"], x.mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(stats[f"{name}/std"], x.std(), rtol=1e-4)
  flat = objectives.value_moments(values, np.full_like(returns, 3.0), adv, mask)
  assert np.isnan(objectives.value_stats(flat)["explained_variance"])
