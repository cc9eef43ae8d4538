"""Property tests for rlpost.rl.losses against hand-written numpy references."""

from hypothesis import given, settings, strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.rl import losses

SETTINGS = settings(max_examples=30, deadline=None)
MODES = tuple(losses.AGGREGATIONS)
POLICY_LOSSES = tuple(losses.POLICY_LOSSES)
MAX_TOKENS = 16
# Jitted: one program per (shape, mode), not one per op, as the examples vary the data.
_aggregate = jax.jit(losses.aggregate, static_argnums=(2, 3))

_STATIC = ("epsilon_low", "epsilon_high", "epsilon_c", "name", "aggregation", "max_tokens")
_policy_loss = jax.jit(losses.policy_loss, static_argnames=_STATIC)


def _policy_grad(logp, old_logp, advantages, mask, **kwargs):
  return jax.grad(lambda lp: losses.policy_loss(lp, old_logp, advantages, mask, **kwargs)[0])(logp)


_policy_grad_jit = jax.jit(_policy_grad, static_argnames=_STATIC)


def _ragged_mask(rng, batch, seq):
  mask = rng.random((batch, seq)) < 0.75
  for b in range(batch):
    mask[b, rng.integers(1, seq + 1) :] = False
  if rng.random() < 0.4:
    mask[rng.integers(0, batch)] = False
  return mask


def _np_aggregate(loss, mask, mode, max_tokens=None):
  """Loops: the four aggregation modes as written in the papers."""
  if mode == "token-mean":
    return loss[mask].sum() / max(mask.sum(), 1)
  per_seq = []
  for row, row_mask in zip(loss, mask):
    if not row_mask.any():
      continue
    vals = row[row_mask].astype(np.float64)
    per_seq.append(
      {
        "seq-mean-token-mean": vals.mean(),
        "seq-mean-token-sum": vals.sum(),
        "seq-mean-token-sum-norm": vals.sum() / (max_tokens or 1),
      }[mode]
    )
  return float(np.mean(per_seq)) if per_seq else 0.0


def _np_agg_weights(mask, mode, max_tokens=None):
  """d aggregate / d loss_bt, derived by hand for each mode."""
  mask = mask.astype(np.float64)
  rows = max((mask.sum(1) > 0).sum(), 1)
  if mode == "token-mean":
    return mask / max(mask.sum(), 1)
  if mode == "seq-mean-token-mean":
    return mask / np.maximum(mask.sum(1, keepdims=True), 1) / rows
  if mode == "seq-mean-token-sum":
    return mask / rows
  return mask / max_tokens / rows


def _inputs(seed, batch=4, seq=6, log_ratio_scale=1.0):
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, batch, seq)
  old_logp = -rng.exponential(size=(batch, seq)).astype(np.float32)
  logp = old_logp + (rng.uniform(-1, 1, size=(batch, seq)) * log_ratio_scale).astype(np.float32)
  adv_seq = rng.normal(size=batch).astype(np.float32)
  adv_tok = rng.normal(size=(batch, seq)).astype(np.float32)
  return rng, logp, old_logp, mask, adv_seq, adv_tok


@SETTINGS
@given(
  seed=st.integers(0, 2**16),
  mode=st.sampled_from(MODES),
  batch=st.sampled_from([1, 3, 5]),
  seq=st.sampled_from([1, 4, 9]),
)
def test_aggregate_matches_numpy(seed, mode, batch, seq):
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, batch, seq)
  loss = rng.normal(size=(batch, seq)).astype(np.float32)
  got = _aggregate(np.where(mask, loss, np.nan), mask, mode, MAX_TOKENS)
  want = _np_aggregate(loss, mask, mode, MAX_TOKENS)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_aggregate_errors_list_valid_modes():
  with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
    losses.aggregate(jnp.ones((2, 2)), jnp.ones((2, 2)), "mean")
  with pytest.raises(ValueError, match="max_tokens"):
    losses.aggregate(jnp.ones((2, 2)), jnp.ones((2, 2)), "seq-mean-token-sum-norm")


@pytest.mark.slow
@SETTINGS
@given(
  seed=st.integers(0, 2**16),
  mode=st.sampled_from(MODES),
  name=st.sampled_from(POLICY_LOSSES),
  seq_adv=st.booleans(),
)
def test_ratio_one_is_plain_policy_gradient(seed, mode, name, seq_adv):
  _, _, old_logp, mask, adv_seq, adv_tok = _inputs(seed)
  advantages = adv_seq if seq_adv else adv_tok
  adv_bt = np.broadcast_to(adv_seq[:, None], mask.shape) if seq_adv else adv_tok
  kwargs = dict(aggregation=mode, max_tokens=MAX_TOKENS, name=name)
  loss, metrics = _policy_loss(old_logp, old_logp, advantages, mask, **kwargs)
  grad = _policy_grad_jit(old_logp, old_logp, advantages, mask, **kwargs)
  np.testing.assert_allclose(loss, _np_aggregate(-adv_bt, mask, mode, MAX_TOKENS), atol=1e-6)
  # Plain REINFORCE: d/dlogp aggregate(-A * logp) = -A * d aggregate / d x.
  np.testing.assert_allclose(grad, -adv_bt * _np_agg_weights(mask, mode, MAX_TOKENS), atol=1e-6)
  assert float(metrics.get("clip_frac_high", 0.0)) == 0.0
  assert float(metrics.get("clip_frac_low", 0.0)) == 0.0
  np.testing.assert_allclose(metrics["ratio_mean"], 1.0 if mask.any() else 0.0)


@pytest.mark.slow
@SETTINGS
@given(
  seed=st.integers(0, 2**16),
  mode=st.sampled_from(MODES),
  eps=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
  epsilon_c=st.sampled_from([None, 3.0]),
)
def test_clipped_tokens_have_zero_gradient(seed, mode, eps, epsilon_c):
  _, logp, old_logp, mask, _, adv = _inputs(seed, log_ratio_scale=1.5)
  kwargs = dict(
    epsilon_low=eps[0],
    epsilon_high=eps[1],
    epsilon_c=epsilon_c,
    aggregation=mode,
    max_tokens=MAX_TOKENS,
  )
  loss, metrics = _policy_loss(logp, old_logp, adv, mask, **kwargs)
  grad = np.asarray(_policy_grad_jit(logp, old_logp, adv, mask, **kwargs))
  ratio = np.exp(logp.astype(np.float64) - old_logp)
  high = (ratio > 1 + eps[1]) & (adv > 0) & mask
  low = (ratio < 1 - eps[0]) & (adv < 0) & mask
  per_token = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps[0], 1 + eps[1]))
  dual = np.zeros_like(mask)
  if epsilon_c is not None:
    dual = (adv < 0) & (per_token > -epsilon_c * adv) & mask
    per_token = np.where(adv < 0, np.minimum(per_token, -epsilon_c * adv), per_token)
  assert np.all(grad[high | low | dual] == 0.0)
  active = mask & ~(high | low | dual)
  want = -adv * ratio * _np_agg_weights(mask, mode, MAX_TOKENS)
  np.testing.assert_allclose(grad[active], want[active], rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(
    loss, _np_aggregate(per_token, mask, mode, MAX_TOKENS), rtol=1e-5, atol=1e-6
  )
  count = max(mask.sum(), 1)
  np.testing.assert_allclose(metrics["clip_frac_high"], high.sum() / count)
  np.testing.assert_allclose(metrics["clip_frac_low"], low.sum() / count)
  np.testing.assert_allclose(metrics["clip_frac_dual"], dual.sum() / count)
  log_r = np.log(ratio)
  np.testing.assert_allclose(
    metrics["approx_kl"], ((ratio - 1 - log_r) * mask).sum() / count, rtol=1e-4, atol=1e-7
  )


@pytest.mark.slow
@SETTINGS
@given(
  seed=st.integers(0, 2**16),
  mode=st.sampled_from(MODES),
  epsilon_high=st.sampled_from([0.2, 0.28, 5.0]),
)
def test_cispo_gradient_is_truncated_weight_times_policy_gradient(seed, mode, epsilon_high):
  """CISPO: d loss / d logp = -min(r, 1 + epsilon_high) * A * d aggregate / d x, on every
  valid token: where the clipped surrogate's gradient is 0, CISPO's is not."""
  _, logp, old_logp, mask, _, adv = _inputs(seed, log_ratio_scale=1.5)
  kwargs = dict(name="cispo", epsilon_high=epsilon_high, aggregation=mode, max_tokens=MAX_TOKENS)
  loss, metrics = _policy_loss(logp, old_logp, adv, mask, **kwargs)
  grad = np.asarray(_policy_grad_jit(logp, old_logp, adv, mask, **kwargs))
  ratio = np.exp(logp.astype(np.float64) - old_logp)
  weight = np.minimum(ratio, 1 + epsilon_high)
  weights = _np_agg_weights(mask, mode, MAX_TOKENS)
  np.testing.assert_allclose(grad, -weight * adv * weights, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(
    loss, _np_aggregate(-weight * adv, mask, mode, MAX_TOKENS), rtol=1e-5, atol=1e-6
  )
  count = max(mask.sum(), 1)
  truncated = (ratio > 1 + epsilon_high) & mask
  np.testing.assert_allclose(metrics["clip_frac_high"], truncated.sum() / count)
  # The clipped surrogate drops these tokens' gradient; CISPO keeps it.
  clipped = np.asarray(
    _policy_grad_jit(
      logp,
      old_logp,
      adv,
      mask,
      name="clipped",
      epsilon_high=epsilon_high,
      aggregation=mode,
      max_tokens=MAX_TOKENS,
    )
  )
  kept = truncated & (adv > 0) & (weights > 0)
  assert np.all(clipped[kept] == 0.0) and np.all(grad[kept] != 0.0)


@pytest.mark.slow
@SETTINGS
@given(
  seed=st.integers(0, 2**16),
  epsilon_c=st.sampled_from([1.5, 3.0, 10.0]),
  mode=st.sampled_from(MODES),
)
def test_dual_clip_bounds_negative_advantage_loss(seed, epsilon_c, mode):
  _, logp, old_logp, mask, _, adv = _inputs(seed, log_ratio_scale=4.0)
  adv = -np.abs(adv)
  kwargs = dict(epsilon_c=epsilon_c, aggregation=mode, max_tokens=MAX_TOKENS)
  loss, _ = _policy_loss(logp, old_logp, adv, mask, **kwargs)
  bound = _np_aggregate(epsilon_c * np.abs(adv), mask, mode, MAX_TOKENS)
  assert float(loss) <= bound * (1 + 1e-6) + 1e-7
  # Per token: a single valid token per row makes the loss the token loss.
  one = np.zeros_like(mask)
  one[:, 0] = True
  for b in range(mask.shape[0]):
    row_loss, _ = _policy_loss(
      logp[b : b + 1], old_logp[b : b + 1], adv[b : b + 1], one[b : b + 1], **kwargs
    )
    assert float(row_loss) <= epsilon_c * abs(adv[b, 0]) * (1 + 1e-6)
  with pytest.raises(ValueError, match="epsilon_c"):
    losses.policy_loss(logp, old_logp, adv, mask, epsilon_c=1.0)


@SETTINGS
@given(seed=st.integers(0, 2**16))
def test_gspo_ratio_is_sequence_geometric_mean(seed):
  _, logp, old_logp, mask, _, _ = _inputs(seed)
  ratio = losses.importance_ratio(logp, old_logp, mask, "sequence")
  want = np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    if mask[b].any():
      token_ratios = np.exp(logp[b][mask[b]].astype(np.float64) - old_logp[b][mask[b]])
      want[b][mask[b]] = np.prod(token_ratios) ** (1 / mask[b].sum())
  np.testing.assert_allclose(ratio, want, rtol=1e-5)
  # Per-token gradient: d(sum c * s_bt)/d logp_bt = c_bt * s_b, no cross terms.
  cot = np.random.default_rng(seed).normal(size=mask.shape).astype(np.float32)
  grad = jax.grad(
    lambda lp: jnp.sum(cot * losses.importance_ratio(lp, old_logp, mask, "sequence"))
  )(logp)
  np.testing.assert_allclose(grad, cot * want, rtol=1e-5, atol=1e-7)


@SETTINGS
@given(seed=st.integers(0, 2**16))
def test_gspo_loss_gradient_matches_sequence_objective(seed):
  """Unclipped, seq-mean-token-mean GSPO = the paper's sequence objective."""
  _, logp, old_logp, mask, adv, _ = _inputs(seed, log_ratio_scale=0.3)
  kwargs = dict(
    name="gspo", aggregation="seq-mean-token-mean", epsilon_low=0.99, epsilon_high=100.0
  )
  grad = _policy_grad_jit(logp, old_logp, adv, mask, **kwargs)

  def sequence_objective(lp):
    m = mask.astype(jnp.float32)
    s = jnp.exp(jnp.sum((lp - old_logp) * m, 1) / jnp.maximum(m.sum(1), 1))
    rows = mask.any(1)
    return -jnp.sum(jnp.where(rows, adv * s, 0.0)) / max(rows.sum(), 1)

  np.testing.assert_allclose(grad, jax.grad(sequence_objective)(logp), rtol=1e-5, atol=1e-7)


def test_gspo_clipped_sequence_has_zero_gradient():
  old_logp = np.full((2, 3), -1.0, np.float32)
  logp = old_logp + np.array([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]], np.float32)
  mask = np.ones((2, 3), bool)
  grad = _policy_grad_jit(logp, old_logp, np.array([1.0, 1.0], np.float32), mask, name="gspo")
  assert np.all(np.asarray(grad)[0] == 0.0)
  assert np.all(np.asarray(grad)[1] < 0.0)


@pytest.mark.parametrize("name", ["clipped", "gspo"])
def test_overflowing_ratio_keeps_clipped_tokens_finite(name):
  """A log-ratio beyond float32's exp range (95: e^95 overflows) on a token whose
  loss the clip fixes: closed forms from max(-A r, -A clip(r)) with r -> inf.
  A > 0: -A (1 + eps_high), gradient 0; A = 0: 0, gradient 0; A < 0 with dual
  clip c: -c A, gradient 0. The row has one valid token, so the GSPO sequence
  ratio is that token's ratio. Mutation: without the cap on the log-ratio's
  value in `importance_ratio`, exp gives inf and the loss or gradient is NaN
  (0 * inf in the backward pass)."""
  old_logp = np.array([[-96.0, -5.0]], np.float32)
  logp = np.array([[-1.0, -5.0]], np.float32)
  mask = np.array([[True, False]])
  for adv, epsilon_c, want in [(1.0, None, -1.28), (0.0, None, 0.0), (-1.0, 3.0, 3.0)]:
    kwargs = dict(name=name, epsilon_high=0.28, epsilon_c=epsilon_c)
    advantages = np.array([adv], np.float32)
    loss, metrics = losses.policy_loss(logp, old_logp, advantages, mask, **kwargs)
    grad = _policy_grad(logp, old_logp, advantages, mask, **kwargs)
    np.testing.assert_allclose(float(loss), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(grad), 0.0)
    assert np.isfinite(float(metrics["ratio_mean"]))


def test_truncated_is_weights():
  old = np.array([[-1.0, -2.0, -0.5, 0.0]], np.float32)
  sampler = np.array([[-1.5, -1.0, -0.5, -np.inf]], np.float32)
  mask = np.array([[1, 1, 1, 0]], bool)
  w = losses.truncated_is_weights(old, sampler, mask, cap=1.2)
  np.testing.assert_allclose(w, [[1.2, np.exp(-1.0), 1.0, 0.0]], rtol=1e-6)
  # a constant of the update: no gradient flows through the weights to either logprob
  for argnum in (0, 1):
    grad = jax.grad(lambda *a: losses.truncated_is_weights(*a, mask, 1.2).sum(), argnum)(
      old, np.where(mask, sampler, 0.0).astype(np.float32)
    )
    np.testing.assert_array_equal(grad, 0.0)
  _, logp, old_logp, mask, _, adv = _inputs(3)
  rng = np.random.default_rng(0)
  tis = rng.uniform(0.5, 2.0, mask.shape).astype(np.float32)
  plain = jax.grad(lambda lp: losses.policy_loss(lp, old_logp, adv, mask)[0])
  weighted = jax.grad(lambda lp: losses.policy_loss(lp, old_logp, adv, mask, tis_weights=tis)[0])
  np.testing.assert_allclose(weighted(logp), tis * plain(logp), rtol=1e-5, atol=1e-8)


@SETTINGS
@given(seed=st.integers(0, 2**16), clamp=st.sampled_from([None, 0.5]))
def test_kl_estimators(seed, clamp):
  rng = np.random.default_rng(seed)
  logp = -rng.exponential(size=(3, 5)).astype(np.float32)
  ref = -rng.exponential(size=(3, 5)).astype(np.float32)
  d = logp.astype(np.float64) - ref
  want = {"k1": d, "k2": 0.5 * d**2, "k3": np.exp(-d) + d - 1}
  aliases = {"kl": "k1", "mse_kl": "k2", "low_var_kl": "k3"}
  for kind, canonical in list(aliases.items()) + [(k, k) for k in want]:
    expected = want[canonical]
    if clamp is not None:
      expected = np.clip(expected, -clamp, clamp)
    np.testing.assert_allclose(
      losses.kl_penalty(logp, ref, kind, clamp), expected, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(losses.kl_penalty(logp, logp, kind), 0.0)
  assert np.all(np.asarray(losses.kl_penalty(logp, ref, "k3")) >= 0.0)


def test_k3_clamp_holds_when_exp_overflows():
  """kl_clamp bounds k3 = exp(-d) + d - 1 where exp(-d) overflows float32 (d = -98):
  closed form: value = clamp, gradient 0 (the clip is saturated). The second token
  (d = 0.5, unclamped) has k3 = e^-0.5 - 0.5 and d k3 / d logp = 1 - e^-0.5.
  Mutation: plain `jnp.clip` of the estimate in `kl_penalty` (no evaluation of the
  saturated entries at d = 0): exp(98) = inf and the backward pass gives
  0 * inf = NaN for the clamped token."""
  logp = np.array([[-100.0, -1.0]], np.float32)
  ref = np.array([[-2.0, -1.5]], np.float32)
  mask = np.ones((1, 2), bool)
  for kind in ("k3", "low_var_kl"):
    kl = losses.kl_penalty(logp, ref, kind, clamp=10.0, mask=mask)
    grad = jax.grad(lambda lp: jnp.sum(losses.kl_penalty(lp, ref, kind, clamp=10.0, mask=mask)))(
      logp
    )
    np.testing.assert_allclose(kl, [[10.0, np.exp(-0.5) - 0.5]], rtol=1e-6)
    np.testing.assert_allclose(grad, [[0.0, 1.0 - np.exp(-0.5)]], rtol=1e-6)


def test_kl_unknown_kind_lists_valid_names():
  with pytest.raises(ValueError, match="low_var_kl"):
    losses.kl_penalty(jnp.zeros(2), jnp.zeros(2), "k4")


def test_kl_monte_carlo_matches_exact_categorical_kl():
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(6))
  q = rng.dirichlet(np.ones(6))
  exact = float(np.sum(p * np.log(p / q)))
  samples = rng.choice(6, size=200_000, p=p)
  logp = np.log(p)[samples].astype(np.float32)
  ref = np.log(q)[samples].astype(np.float32)
  for kind in ("k1", "k3"):
    est = np.asarray(losses.kl_penalty(logp, ref, kind), np.float64)
    stderr = est.std() / np.sqrt(len(est))
    assert abs(est.mean() - exact) < 5 * stderr, (kind, est.mean(), exact)


def test_kl_in_rewards():
  rng = np.random.default_rng(1)
  mask = _ragged_mask(rng, 3, 5)
  rewards = rng.normal(size=(3, 5)).astype(np.float32)
  logp = -rng.exponential(size=(3, 5)).astype(np.float32)
  ref = -rng.exponential(size=(3, 5)).astype(np.float32)
  got = losses.kl_in_rewards(
    np.where(mask, rewards, np.nan), np.where(mask, logp, -np.inf), ref, mask, 0.1, "k3"
  )
  d = logp.astype(np.float64) - ref
  want = np.where(mask, rewards - 0.1 * (np.exp(-d) + d - 1), 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _np_value_loss(values, old, returns, mask, clip_range):
  clipped = old + np.clip(values - old, -clip_range, clip_range)
  per_token = np.maximum((values - returns) ** 2, (clipped - returns) ** 2)
  return 0.5 * per_token[mask].mean(), ((clipped - returns) ** 2 > (values - returns) ** 2)


@SETTINGS
@given(seed=st.integers(0, 2**16), clip_range=st.sampled_from([0.1, 0.5]))
def test_value_loss_clipping(seed, clip_range):
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, 3, 6)
  mask[0, 0] = True
  old = rng.normal(size=mask.shape).astype(np.float32)
  values = old + rng.uniform(-1, 1, mask.shape).astype(np.float32)
  returns = rng.normal(size=mask.shape).astype(np.float32)
  fn = lambda v: losses.value_loss(v, old, returns, mask, clip_range=clip_range)
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(values)
  want, clipped_won = _np_value_loss(values.astype(np.float64), old, returns, mask, clip_range)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(metrics["vf_clip_frac"], (clipped_won & mask).sum() / mask.sum())
  # The clipped branch wins only outside the clip range: no gradient there.
  assert np.all(np.asarray(grad)[clipped_won & mask] == 0.0)
  free = mask & ~clipped_won
  np.testing.assert_allclose(
    np.asarray(grad)[free], ((values - returns) / mask.sum())[free], rtol=1e-4
  )
  plain, _ = losses.value_loss(values, old, returns, mask, clip_range=None)
  np.testing.assert_allclose(plain, 0.5 * ((values - returns) ** 2)[mask].mean(), rtol=1e-5)


@SETTINGS
@given(seed=st.integers(0, 2**16), scale=st.sampled_from([0.05, 0.3, 4.0]))
def test_a_value_loss_in_other_units_is_the_loss_of_the_rescaled_values(seed, scale):
  """Normalised values: `value_loss(..., scale=s)` equals the loss of values, old values
  and returns all divided by s (clip range unchanged), and its gradient is that loss's
  gradient divided by s. Mutation caught: the clip range not scaled (clipping in return
  units while the loss is in normalised ones)."""
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, 3, 6)
  mask[0, 0] = True
  old = (scale * rng.normal(size=mask.shape)).astype(np.float32)
  values = old + (scale * rng.uniform(-1, 1, mask.shape)).astype(np.float32)
  returns = (scale * rng.normal(size=mask.shape)).astype(np.float32)
  scaled = lambda v: losses.value_loss(v, old, returns, mask, clip_range=0.2, scale=scale)
  unit = lambda v: losses.value_loss(v, old / scale, returns / scale, mask, clip_range=0.2)
  (got, got_m), got_g = jax.value_and_grad(scaled, has_aux=True)(values)
  (want, want_m), want_g = jax.value_and_grad(unit, has_aux=True)(values / scale)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  # (vf_clip_frac is not compared: inside the clip range the two terms tie, and which
  # one rounds higher differs between the two unit systems; the gradient is the same.)
  del got_m, want_m
  np.testing.assert_allclose(got_g, np.asarray(want_g) / scale, rtol=1e-3, atol=1e-6)


def _poisoned(x, mask, fill):
  return np.where(mask, x, fill).astype(np.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_losses_finite_with_inf_and_nan_at_masked_positions(mode, name):
  _, logp, old_logp, mask, adv_seq, adv_tok = _inputs(5)
  mask[1] = False
  ref = old_logp - 0.3
  kwargs = dict(aggregation=mode, max_tokens=MAX_TOKENS, epsilon_c=3.0, name=name)

  def total(lp, old, rf, adv, vals, rets, ent, sampler):
    tis = losses.truncated_is_weights(old, sampler, mask, 2.0)
    pg, metrics = losses.policy_loss(lp, old, adv, mask, tis_weights=tis, **kwargs)
    kl = losses.aggregate(losses.kl_penalty(lp, rf, "k3", mask=mask), mask, mode, MAX_TOKENS)
    vf, _ = losses.value_loss(vals, vals * 0.5, rets, mask, aggregation=mode, max_tokens=MAX_TOKENS)
    ent = losses.entropy_bonus(ent, mask, mode, MAX_TOKENS)
    return pg + kl + vf - ent + sum(jnp.sum(v) for v in metrics.values())

  clean = (logp, old_logp, ref, adv_tok, adv_tok, adv_seq[:, None] + adv_tok, -logp, old_logp)
  dirty = (
    _poisoned(logp, mask, -np.inf),
    _poisoned(old_logp, mask, -np.inf),
    _poisoned(ref, mask, np.nan),
    _poisoned(adv_tok, mask, np.nan),
    _poisoned(adv_tok, mask, np.inf),
    _poisoned(clean[5], mask, np.nan),
    _poisoned(-logp, mask, np.nan),
    _poisoned(old_logp, mask, np.inf),
  )
  argnums = (0, 4, 6)
  clean_val, clean_grads = jax.value_and_grad(total, argnums)(*clean)
  dirty_val, dirty_grads = jax.value_and_grad(total, argnums)(*dirty)
  assert np.isfinite(float(dirty_val))
  np.testing.assert_allclose(dirty_val, clean_val, rtol=1e-6)
  for g_clean, g_dirty in zip(clean_grads, dirty_grads):
    assert np.all(np.isfinite(g_dirty))
    np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-6, atol=1e-8)


def test_shape_mismatches_are_rejected():
  mask = jnp.ones((2, 3), bool)
  with pytest.raises(AssertionError):
    losses.policy_loss(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.zeros(2), mask)
  with pytest.raises(AssertionError):
    losses.policy_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros(3), mask)
  with pytest.raises(AssertionError):
    losses.aggregate(jnp.zeros((3, 2)), mask, "token-mean")
