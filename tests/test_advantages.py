"""Property tests for rlpost.advantages against numpy loop references."""

import functools
import types

from absl.testing import parameterized
import chex
from hypothesis import assume, given, settings, strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.rl import advantages as adv
from rlpost.rl import credit

SETTINGS = settings(max_examples=40, deadline=None)

_gae = jax.jit(adv.gae)
_reinforce_pp = jax.jit(adv.reinforce_pp, static_argnames=("group_size",))
_grpo = jax.jit(adv.grpo, static_argnums=1)  # one program per shape, as the examples vary


def _ragged_mask(rng, batch, seq):
  """Random holes, random trailing padding and sometimes an empty row."""
  mask = rng.random((batch, seq)) < 0.8
  for b in range(batch):
    mask[b, rng.integers(0, seq + 1) :] = False
  if batch > 1 and rng.random() < 0.3:
    mask[rng.integers(0, batch)] = False
  return mask


def _np_gae(rewards, values, mask, gamma, lam):
  """O(T^2) direct sum over each row's valid positions (float64)."""
  advantages = np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    idx = np.flatnonzero(mask[b])
    r, v = rewards[b, idx].astype(np.float64), values[b, idx].astype(np.float64)
    v_next = np.append(v[1:], 0.0)
    delta = r + gamma * v_next - v
    for k in range(len(idx)):
      advantages[b, idx[k]] = sum((gamma * lam) ** (j - k) * delta[j] for j in range(k, len(idx)))
  returns = np.where(mask, advantages + values, 0.0)
  return advantages, returns


token_shapes = st.tuples(st.sampled_from([1, 3]), st.sampled_from([1, 6, 11]))


@SETTINGS
@given(
  shape=token_shapes, seed=st.integers(0, 2**16), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0)
)
def test_gae_matches_direct_sum(shape, seed, gamma, lam):
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, *shape)
  rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  got_adv, got_ret = _gae(rewards, values, mask, gamma=gamma, lam=lam)
  want_adv, want_ret = _np_gae(rewards, values, mask, gamma, lam)
  np.testing.assert_allclose(got_adv, want_adv, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(got_ret, want_ret, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(shape=token_shapes, seed=st.integers(0, 2**16))
def test_gae_gamma_lam_one_is_reward_to_go_minus_values(shape, seed):
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, *shape)
  rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  got, _ = _gae(rewards, values, mask, gamma=1.0, lam=1.0)
  want = np.zeros(shape)
  for b in range(shape[0]):
    for t in range(shape[1]):
      if mask[b, t]:
        want[b, t] = np.sum(rewards[b, t:][mask[b, t:]]) - values[b, t]
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(
  shape=token_shapes,
  seed=st.integers(0, 2**16),
  gamma=st.floats(0.5, 1.0),
  lam=st.floats(0.5, 1.0),
  junk=st.sampled_from([np.nan, np.inf, 1e6, -3.0]),
)
def test_gae_ignores_masked_positions(shape, seed, gamma, lam, junk):
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, *shape)
  rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  clean = _gae(rewards, values, mask, gamma=gamma, lam=lam)
  dirty = _gae(
    np.where(mask, rewards, junk), np.where(mask, values, -junk), mask, gamma=gamma, lam=lam
  )
  chex.assert_trees_all_equal(clean, dirty)
  assert np.all(np.asarray(clean[0])[~mask] == 0.0)
  assert np.all(np.asarray(clean[1])[~mask] == 0.0)


@SETTINGS
@given(shape=token_shapes, seed=st.integers(0, 2**16))
def test_gae_undiscounted_with_zero_values_gives_every_token_the_trajectory_return(shape, seed):
  """gamma = lambda = 1, V = 0, the score on the last action token (PPO's token rewards)."""
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, *shape)
  scores = rng.normal(size=shape[0]).astype(np.float32)
  rewards = adv.sequence_to_token_rewards(scores, mask)
  got_adv, got_ret = _gae(rewards, np.zeros(shape, np.float32), mask, gamma=1.0, lam=1.0)
  want = np.where(mask, scores[:, None], 0.0)
  np.testing.assert_allclose(got_adv, want, rtol=1e-6)
  np.testing.assert_allclose(got_ret, want, rtol=1e-6)


@SETTINGS
@given(
  seed=st.integers(0, 2**16),
  gamma=st.floats(0.5, 1.0),
  lam=st.floats(0.0, 1.0),
  inserts=st.lists(st.integers(0, 8), min_size=1, max_size=6),
)
def test_gae_inserting_masked_tokens_changes_nothing_at_action_tokens(seed, gamma, lam, inserts):
  """Tool / environment tokens (loss_mask = 0) spliced in anywhere are skipped by GAE."""
  rng = np.random.default_rng(seed)
  batch, seq = 2, 8
  rewards = rng.normal(size=(batch, seq)).astype(np.float32)
  values = rng.normal(size=(batch, seq)).astype(np.float32)
  mask = np.ones((batch, seq), bool)
  adv_clean, ret_clean = _gae(rewards, values, mask, gamma=gamma, lam=lam)
  # Insert masked columns (junk rewards and values) before the given positions.
  cols = sorted(inserts, reverse=True)
  r2, v2, m2 = rewards, values, mask
  for c in cols:
    r2 = np.insert(r2, c, rng.normal(size=batch) * 100, axis=1)
    v2 = np.insert(v2, c, rng.normal(size=batch) * 100, axis=1)
    m2 = np.insert(m2, c, False, axis=1)
  adv_ins, ret_ins = _gae(r2, v2, m2, gamma=gamma, lam=lam)
  np.testing.assert_allclose(np.asarray(adv_ins)[m2].reshape(batch, seq), adv_clean, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(ret_ins)[m2].reshape(batch, seq), ret_clean, rtol=1e-6)
  assert np.all(np.asarray(adv_ins)[~m2] == 0.0) and np.all(np.asarray(ret_ins)[~m2] == 0.0)


def _np_group_stats(rewards, group):
  r = rewards.astype(np.float64).reshape(-1, group)
  return r, r.mean(1, keepdims=True), r.std(1, ddof=1, keepdims=True)


group_rewards = st.tuples(
  st.sampled_from([2, 3, 4]), st.sampled_from([1, 2, 5]), st.integers(0, 2**16)
)


@pytest.mark.slow
@SETTINGS
@given(spec=group_rewards)
def test_grpo_properties(spec):
  group, num_prompts, seed = spec
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=num_prompts * group).astype(np.float32)
  r, mean, std = _np_group_stats(rewards, group)
  assume(np.all(std > 0.05))
  got = np.asarray(_grpo(rewards, group)).reshape(-1, group)
  np.testing.assert_allclose(got, (r - mean) / (std + 1e-6), atol=1e-5)
  np.testing.assert_allclose(got.mean(1), 0.0, atol=1e-5)
  shift = np.repeat(rng.normal(size=num_prompts) * 10, group).astype(np.float32)
  scale = np.float32(rng.uniform(0.1, 10.0))
  np.testing.assert_allclose(_grpo(rewards + shift, group), got.reshape(-1), atol=1e-4)
  np.testing.assert_allclose(_grpo(rewards * scale, group), got.reshape(-1), atol=1e-4)


@SETTINGS
@given(group=st.sampled_from([2, 3, 5, 8]), value=st.floats(-1e3, 1e3, width=32))
def test_group_estimators_zero_for_equal_rewards(group, value):
  rewards = np.full(2 * group, value, np.float32)
  for fn in (adv.grpo, adv.drgrpo, adv.rloo):
    np.testing.assert_array_equal(fn(rewards, group), 0.0)
  np.testing.assert_array_equal(adv.zero_signal_groups(rewards, group), True)


class GroupEstimatorTest(parameterized.TestCase):
  """RLOO / Dr. GRPO / zero-signal against numpy loops, jitted and not."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(group=(2, 3, 4), seed=(0, 1))
  def test_against_loops(self, group, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, size=5 * group).astype(np.float32)
    rewards[:group] = 1.0  # At least one zero-signal group.
    got_rloo = self.variant(functools.partial(adv.rloo, group_size=group))(rewards)
    got_dr = self.variant(functools.partial(adv.drgrpo, group_size=group))(rewards)
    got_zero = self.variant(functools.partial(adv.zero_signal_groups, group_size=group))(rewards)
    want_rloo, want_dr = np.zeros(len(rewards)), np.zeros(len(rewards))
    want_zero = []
    for p in range(len(rewards) // group):
      members = list(range(p * group, (p + 1) * group))
      want_zero.append(len({rewards[i] for i in members}) == 1)
      for i in members:
        others = [rewards[j] for j in members if j != i]
        want_rloo[i] = rewards[i] - sum(others) / len(others)
        want_dr[i] = rewards[i] - sum(rewards[j] for j in members) / group
    np.testing.assert_allclose(got_rloo, want_rloo, atol=1e-6)
    np.testing.assert_allclose(got_dr, want_dr, atol=1e-6)
    np.testing.assert_array_equal(got_zero, want_zero)


def test_group_estimators_reject_bad_group_sizes():
  with pytest.raises(ValueError, match="multiple of group_size"):
    adv.drgrpo(jnp.zeros(5), 2)
  with pytest.raises(ValueError, match="group_size >= 2"):
    adv.grpo(jnp.zeros(4), 1)
  with pytest.raises(ValueError, match="group_size >= 2"):
    adv.rloo(jnp.zeros(4), 1)


def test_estimators_take_a_plain_list_of_rewards():
  """Every episode estimator in the credit table takes rewards as a Python list (as a reward function
  returns them), giving what the array gives; a list of the wrong length still fails naming
  the shape and group size.

  Mutation caught: `_groups` / `reinforce_pp` reading `.shape` / `.astype` of the input
  (AttributeError: 'list' object has no attribute 'shape').
  """
  rewards = [1.0, 0.0, 0.0, 2.0, 1.0, 1.0]
  config = types.SimpleNamespace(num_generations=2)
  for name in credit.episode_estimators():
    rule = credit.RULES[name]
    want = rule.fn(credit.CreditInputs(jnp.asarray(rewards), None), config)
    np.testing.assert_allclose(rule.fn(credit.CreditInputs(rewards, None), config), want)
    if rule.groups:
      with pytest.raises(ValueError, match=r"got shape \(5,\), group_size=2"):
        rule.fn(credit.CreditInputs(rewards[:5], None), config)


@pytest.mark.slow
@SETTINGS
@given(shape=token_shapes, seed=st.integers(0, 2**16), shift_mean=st.booleans())
def test_masked_statistics(shape, seed, shift_mean):
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, *shape)
  assume(mask.sum() >= 2)
  x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
  dirty = np.where(mask, x, np.nan)
  valid = x[mask].astype(np.float64)
  np.testing.assert_allclose(adv.masked_mean(dirty, mask), valid.mean(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(adv.masked_var(dirty, mask), valid.var(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(
    adv.masked_var(dirty, mask, unbiased=True), valid.var(ddof=1), rtol=1e-4, atol=1e-6
  )
  white = np.asarray(adv.masked_whiten(dirty, mask, shift_mean=shift_mean))
  want = (x - valid.mean()) / np.sqrt(valid.var() + 1e-8)
  want = want + valid.mean() if not shift_mean else want
  np.testing.assert_allclose(white[mask], want[mask], rtol=1e-4, atol=1e-5)
  assert np.all(white[~mask] == 0.0)


def test_masked_mean_of_nothing_is_zero():
  assert float(adv.masked_mean(jnp.ones((2, 3)), jnp.zeros((2, 3)))) == 0.0


def _np_reinforce_pp(rewards, mask, kl, beta, gamma, group):
  """Loop reference: last-token score, KL shaping, reward-to-go, whitening."""
  rewards = rewards.astype(np.float64)
  if group:
    r = rewards.reshape(-1, group)
    rewards = (r - r.mean(1, keepdims=True)).reshape(-1)
  returns = np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    idx = np.flatnonzero(mask[b])
    step_rewards = [-beta * kl[b, t] for t in idx]
    if len(idx):
      step_rewards[-1] += rewards[b]
    running = 0.0
    for k in reversed(range(len(idx))):
      running = step_rewards[k] + gamma * running
      returns[b, idx[k]] = running
  valid = returns[mask]
  white = (returns - valid.mean()) / np.sqrt(valid.var() + 1e-8)
  return np.where(mask, white, 0.0)


@SETTINGS
@given(
  seed=st.integers(0, 2**16),
  gamma=st.sampled_from([1.0, 0.9]),
  beta=st.sampled_from([0.0, 0.3]),
  group=st.sampled_from([None, 2]),
)
def test_reinforce_pp_token_level(seed, gamma, beta, group):
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, 4, 7)
  assume(mask.sum() >= 2)
  rewards = rng.normal(size=4).astype(np.float32)
  kl = rng.normal(size=(4, 7)).astype(np.float32)
  got = _reinforce_pp(
    rewards, mask, kl_BxT=np.where(mask, kl, np.nan), beta=beta, gamma=gamma, group_size=group
  )
  want = _np_reinforce_pp(rewards, mask, kl, beta, gamma, group)
  # Every return tied (groups of 2 without KL: the group mean takes all): nothing is left
  # to whiten but float32 rounding, which sqrt(var + 1e-8) scales by up to 1e4.
  tied = not np.abs(want).any()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-2 if tied else 1e-4)


def test_reinforce_pp_sequence_level_is_batch_whitened():
  rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.5], np.float32)
  got = adv.reinforce_pp(rewards)
  want = (rewards - rewards.mean()) / np.sqrt(rewards.var() + 1e-8)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_array_equal(adv.reinforce_pp(np.full(4, 0.1, np.float32)), 0.0)


def test_sequence_to_token_rewards_uses_last_valid_token():
  mask = np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], bool)
  got = adv.sequence_to_token_rewards(np.array([2.0, 3.0, -1.0]), mask)
  want = np.zeros((3, 5))
  want[0, 3], want[2, 0] = 2.0, -1.0
  np.testing.assert_array_equal(got, want)


def _np_overlong(length, max_len, buffer_len, factor):
  """DAPO's piecewise definition, written out."""
  if length <= max_len - buffer_len:
    return 0.0
  if length <= max_len:
    return factor * ((max_len - buffer_len) - length) / buffer_len
  return -factor


@pytest.mark.parametrize(
  "max_len,buffer_len,factor", [(20, 5, 1.0), (4096, 1024, 0.5), (8, 8, 2.0)]
)
def test_overlong_penalty(max_len, buffer_len, factor):
  lengths = np.array(
    sorted(
      {
        0,
        1,
        max_len - buffer_len - 1,
        max_len - buffer_len,
        max_len - buffer_len + 1,
        max_len - buffer_len // 2,
        max_len - 1,
        max_len,
        max_len + 1,
        3 * max_len,
      }
    )
  )
  lengths = lengths[lengths >= 0]
  got = adv.overlong_penalty(lengths, max_len=max_len, buffer_len=buffer_len, penalty_factor=factor)
  want = [_np_overlong(n, max_len, buffer_len, factor) for n in lengths]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert float(got[lengths == max_len][0]) == -factor
  assert float(got[lengths == max_len - buffer_len][0]) == 0.0


def test_overlong_penalty_rejects_bad_buffer():
  with pytest.raises(ValueError, match="buffer_len"):
    adv.overlong_penalty(jnp.arange(3), max_len=10, buffer_len=0)


# ------------------------------------------------------------------ turn-level GAE

_turn_gae = jax.jit(adv.turn_gae, static_argnames="value_at")


def _turns(rng, batch, seq):
  """A ragged mask and turn ids that only grow along a row (masked slots: observations
  between turns, holes inside one, padding)."""
  mask = _ragged_mask(rng, batch, seq)
  ids = np.cumsum(rng.random((batch, seq)) < 0.35, axis=1).astype(np.int32)
  return mask, ids


def _np_turn_gae(rewards, values, mask, ids, gamma, lam, value_at="end"):
  """The obvious reference: per row, the turns as runs of valid tokens with one id; a turn's
  reward the sum of its tokens', its value the last token's (or the first's); GAE over
  turns (float64)."""
  advantages, returns = np.zeros(rewards.shape), np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    idx = np.flatnonzero(mask[b])
    runs = np.split(idx, np.flatnonzero(np.diff(ids[b, idx])) + 1) if idx.size else []
    r = np.array([rewards[b, run].astype(np.float64).sum() for run in runs])
    v = np.array([float(values[b, run[-1 if value_at == "end" else 0]]) for run in runs])
    v_next = np.append(v[1:], 0.0)
    delta = r + gamma * v_next - v
    for k, run in enumerate(runs):
      a = sum((gamma * lam) ** (j - k) * delta[j] for j in range(k, len(runs)))
      advantages[b, run], returns[b, run] = a, a + v[k]
  return advantages, returns


@SETTINGS
@given(
  shape=token_shapes,
  seed=st.integers(0, 2**16),
  gamma=st.floats(0.0, 1.0),
  lam=st.floats(0.0, 1.0),
  value_at=st.sampled_from(adv.TURN_VALUES),
)
def test_turn_gae_matches_the_per_turn_direct_sum(shape, seed, gamma, lam, value_at):
  """Against the O(turns^2) reference, with observation slots, holes and padding, a turn's
  value read at its last or its first token; masked slots hold junk that must never be read.

  Mutations caught: a turn's reward sum not reset at its end (`turn_gae_rewards_summed_
  across_turns`); every valid token taken as a turn's end (`turn_ends_every_token`); a
  start value not carried over the turn's later tokens (`turn_start_value_not_carried`)."""
  rng = np.random.default_rng(seed)
  mask, ids = _turns(rng, *shape)
  rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  junk_r, junk_v = np.where(mask, rewards, np.nan), np.where(mask, values, np.inf)
  got_adv, got_ret = _turn_gae(junk_r, junk_v, mask, ids, gamma=gamma, lam=lam, value_at=value_at)
  want_adv, want_ret = _np_turn_gae(rewards, values, mask, ids, gamma, lam, value_at)
  np.testing.assert_allclose(got_adv, want_adv, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(got_ret, want_ret, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(shape=token_shapes, seed=st.integers(0, 2**16))
def test_turn_gae_gamma_lam_one_is_each_turns_reward_to_go_minus_its_value(shape, seed):
  """gamma = lambda = 1: a turn's advantage is the rewards of it and every later turn minus
  its value (at its last token); one id per row makes it `sum(r) - V_last` everywhere."""
  rng = np.random.default_rng(seed)
  mask, ids = _turns(rng, *shape)
  rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  got, _ = _turn_gae(rewards, values, mask, ids, gamma=1.0, lam=1.0)
  ends = np.asarray(adv.turn_ends(mask, ids))
  for b in range(shape[0]):
    for t in np.flatnonzero(mask[b]):
      end = t + np.argmax(ends[b, t:])  # the end of t's turn
      later = mask[b] & (ids[b] >= ids[b, t])  # its whole turn and every later one
      want = rewards[b, later].sum() - values[b, end]
      np.testing.assert_allclose(got[b, t], want, atol=1e-5, rtol=1e-5)
  one, one_ret = _turn_gae(rewards, values, mask, np.zeros_like(ids), gamma=0.9, lam=0.5)
  for b in range(shape[0]):
    idx = np.flatnonzero(mask[b])
    if idx.size:
      np.testing.assert_allclose(one[b, idx], rewards[b, idx].sum() - values[b, idx[-1]], 1e-5)
      np.testing.assert_allclose(one_ret[b, idx], rewards[b, idx].sum(), 1e-5, 1e-5)


@SETTINGS
@given(
  shape=token_shapes, seed=st.integers(0, 2**16), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0)
)
def test_turn_gae_with_every_token_its_own_turn_is_token_gae(shape, seed, gamma, lam):
  """Turn ids that change at every valid token make a turn of each: the token-level GAE."""
  rng = np.random.default_rng(seed)
  mask = _ragged_mask(rng, *shape)
  rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  ids = np.broadcast_to(np.arange(shape[1], dtype=np.int32), shape)
  got = _turn_gae(rewards, values, mask, ids, gamma=gamma, lam=lam)
  chex.assert_trees_all_close(got, _gae(rewards, values, mask, gamma=gamma, lam=lam), atol=1e-6)


def test_turn_gae_hand_worked_three_turns():
  """Turns at slots (0, 1), (3, 4), (6), observations at 2 and 5, padding at 7; gamma 0.9,
  lambda 0.5. Turn rewards 0.4, -0.2, 1.0; values at the turns' last tokens 0.3, 0.6, 0.8:
  delta = (0.4 + 0.54 - 0.3, -0.2 + 0.72 - 0.6, 1.0 - 0.8) = (0.64, -0.08, 0.2);
  A = (0.64 + 0.45 * 0.01, -0.08 + 0.45 * 0.2, 0.2) = (0.6445, 0.01, 0.2);
  returns A + V = (0.9445, 0.61, 1.0)."""
  mask = np.array([[1, 1, 0, 1, 1, 0, 1, 0]], bool)
  ids = np.array([[0, 0, 0, 1, 1, 1, 2, -1]], np.int32)
  rewards = np.array([[-0.1, 0.5, 9.0, 0.0, -0.2, 9.0, 1.0, 9.0]], np.float32)
  values = np.array([[5.0, 0.3, 9.0, 7.0, 0.6, 9.0, 0.8, 9.0]], np.float32)
  got_adv, got_ret = _turn_gae(rewards, values, mask, ids, gamma=0.9, lam=0.5)
  np.testing.assert_allclose(got_adv, [[0.6445, 0.6445, 0, 0.01, 0.01, 0, 0.2, 0]], atol=1e-6)
  np.testing.assert_allclose(got_ret, [[0.9445, 0.9445, 0, 0.61, 0.61, 0, 1.0, 0]], atol=1e-6)


def test_turn_gae_hand_worked_three_turns_valued_at_their_first_tokens():
  """The example above with each turn's value read at its first token: values 5.0, 7.0,
  0.8 (turn 2 has one token). delta = (0.4 + 6.3 - 5.0, -0.2 + 0.72 - 7.0, 1.0 - 0.8) =
  (1.7, -6.48, 0.2); A = (1.7 + 0.45 * -6.39, -6.48 + 0.45 * 0.2, 0.2) =
  (-1.1755, -6.39, 0.2); returns A + V = (3.8245, 0.61, 1.0)."""
  mask = np.array([[1, 1, 0, 1, 1, 0, 1, 0]], bool)
  ids = np.array([[0, 0, 0, 1, 1, 1, 2, -1]], np.int32)
  rewards = np.array([[-0.1, 0.5, 9.0, 0.0, -0.2, 9.0, 1.0, 9.0]], np.float32)
  values = np.array([[5.0, 0.3, 9.0, 7.0, 0.6, 9.0, 0.8, 9.0]], np.float32)
  got_adv, got_ret = _turn_gae(rewards, values, mask, ids, gamma=0.9, lam=0.5, value_at="start")
  np.testing.assert_allclose(got_adv, [[-1.1755, -1.1755, 0, -6.39, -6.39, 0, 0.2, 0]], atol=1e-5)
  np.testing.assert_allclose(got_ret, [[3.8245, 3.8245, 0, 0.61, 0.61, 0, 1.0, 0]], atol=1e-5)


# ------------------------------------------------------------------ turn-level GRPO

_turn_grpo = jax.jit(adv.turn_grpo, static_argnums=3)


def _np_turn_grpo(rewards, mask, ids, G):
  """The obvious reference (float64): per row, its turns as runs of valid tokens with one
  id; a turn's reward-to-go the row's valid rewards from the run's first token on; the
  baseline the mean over the group's rows with that turn id; the scale the group's pooled
  std of the deviations (sum of squares over the sum of each turn's rows - 1); a group
  whose rewards-to-go tie at every turn 0."""
  N = rewards.shape[0]
  r = np.where(mask, rewards, 0.0).astype(np.float64)
  to_go = [{} for _ in range(N)]  # row -> {turn id: (reward-to-go, its slots)}
  for b in range(N):
    idx = np.flatnonzero(mask[b])
    runs = np.split(idx, np.flatnonzero(np.diff(ids[b, idx])) + 1) if idx.size else []
    for run in runs:
      to_go[b][int(ids[b, run[0]])] = (r[b, run[0] :].sum(), run)
  out = np.zeros(rewards.shape)
  for first in range(0, N, G):
    group = range(first, first + G)
    turns = {k for b in group for k in to_go[b]}
    at = {k: [to_go[j][k][0] for j in group if k in to_go[j]] for k in turns}
    if all(max(v) == min(v) for v in at.values()):
      continue
    squares = sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in at.values())
    std = np.sqrt(squares / max(sum(len(v) - 1 for v in at.values()), 1))
    for b in group:
      for k, (value, run) in to_go[b].items():
        out[b, run] = (value - np.mean(at[k])) / (std + 1e-6)
  return out


@SETTINGS
@given(
  groups=st.sampled_from([1, 2]),
  G=st.sampled_from([2, 3]),
  seq=st.sampled_from([1, 6, 11]),
  seed=st.integers(0, 2**16),
)
def test_turn_grpo_matches_the_per_turn_reference(groups, G, seq, seed):
  """Against the obvious loop, with observation slots, holes, padding, empty rows and
  turns that not every row of a group reaches; masked slots hold junk never read.

  Mutations caught: the baseline averaged over every row of the group, rows without the
  turn counted as 0 (`turn_grpo_baseline_over_all_rows`); rewards so far instead of to go
  (`turn_grpo_rewards_so_far`)."""
  rng = np.random.default_rng(seed)
  shape = (groups * G, seq)
  mask, ids = _turns(rng, *shape)
  rewards = (np.round(4 * rng.normal(size=shape)) / 4).astype(np.float32)  # exact sums
  junk = np.where(mask, rewards, np.nan)
  got = _turn_grpo(junk, mask, ids, G)
  np.testing.assert_allclose(got, _np_turn_grpo(rewards, mask, ids, G), atol=1e-4, rtol=1e-4)


@SETTINGS
@given(G=st.sampled_from([2, 4]), seq=st.sampled_from([1, 6, 11]), seed=st.integers(0, 2**16))
def test_turn_grpo_with_one_turn_per_row_is_grpo(G, seq, seed):
  """One turn per row (reward on its last token): `grpo` of the returns on every valid
  token, up to float32 rounding (the pooled std sums its squares in another order)."""
  rng = np.random.default_rng(seed)
  N = 2 * G
  mask = np.zeros((N, seq), bool)
  rewards = np.zeros((N, seq), np.float32)
  returns = rng.normal(size=N).astype(np.float32)
  for b in range(N):
    n = rng.integers(1, seq + 1)
    mask[b, :n], rewards[b, n - 1] = True, returns[b]
  ids = np.where(mask, 0, -1).astype(np.int32)
  got = np.asarray(_turn_grpo(rewards, mask, ids, G))
  want = np.where(mask, np.asarray(_grpo(returns, G))[:, None], 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_turn_grpo_hand_worked_three_rows():
  """One group of 3. Row 0: turns at slots (0, 1), (3), (5), rewards 0.2, -0.5, 1.0
  (return 0.7). Row 1: turns (0), (2, 3), rewards 0.2, 0.4 (return 0.6). Row 2: turn (0),
  reward -0.8 (a hole at once: return -0.8). Rewards to go: row 0 (0.7, 0.5, 1.0), row 1
  (0.6, 0.4), row 2 (-0.8). Baselines: turn 0 mean(0.7, 0.6, -0.8) = 0.1667, turn 1
  mean(0.5, 0.4) = 0.45, turn 2 1.0 (row 0 alone). Deviations: turn 0 (0.5333, 0.4333,
  -0.9667), turn 1 (0.05, -0.05), turn 2 (0); squares 1.4117 over (3-1) + (2-1) + (1-1) =
  3: pooled std 0.6860. Advantages: row 0 (0.7775, 0.0729, 0), row 1 (0.6317, -0.0729),
  row 2 -1.4092."""
  mask = np.array([[1, 1, 0, 1, 0, 1], [1, 0, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]], bool)
  ids = np.array([[0, 0, 0, 1, 1, 2], [0, 0, 1, 1, -1, -1], [0, -1, -1, -1, -1, -1]], np.int32)
  rewards = np.array(
    [[0.0, 0.2, 9.0, -0.5, 9.0, 1.0], [0.2, 9.0, 0.0, 0.4, 9.0, 9.0], [-0.8] + [9.0] * 5],
    np.float32,
  )
  want = [
    [0.7775, 0.7775, 0, 0.0729, 0, 0],
    [0.6317, 0, -0.0729, -0.0729, 0, 0],
    [-1.4092, 0, 0, 0, 0, 0],
  ]
  np.testing.assert_allclose(_turn_grpo(rewards, mask, ids, 3), want, atol=1e-4)


def test_turn_grpo_returns_that_tie_over_turns_that_differ_stay_finite_and_scaled():
  """Two rows whose returns tie (0.1 + 0.2 - 0.3 and 0.0: equal but for float rounding)
  while their turns differ: the pooled std of the turns' deviations scales them, so the
  advantages are O(1), not divided by the returns' std of ~0. Turn 0: to-go 0.0 and 0.0;
  turn 1: 0.2 - 0.3 = -0.1 and 0 (row 1 a single turn 0 then turn 1 of reward 0).

  Mutation caught: the scale the std of the returns (`turn_grpo_scaled_by_the_returns_std`,
  session 35's first version, found by the reference test's examples)."""
  mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
  ids = np.array([[0, 1, 2], [0, 1, -1]], np.int32)
  rewards = np.array([[0.1, 0.2, -0.3], [0.0, 0.0, 0.0]], np.float32)
  got = np.asarray(_turn_grpo(rewards, mask, ids, 2))
  assert np.all(np.isfinite(got)) and np.abs(got).max() < 2.0, got
  np.testing.assert_allclose(got, _np_turn_grpo(rewards, mask, ids, 2), atol=1e-4)


@SETTINGS
@given(seed=st.integers(0, 2**16), bonus=st.floats(-2.0, 2.0))
def test_turn_grpo_a_reward_every_row_earns_moves_nothing(seed, bonus):
  """A reward that every row of the group earns at a turn all of them reach leaves every
  advantage as it was: the turn's baseline and the earlier ones move with it.

  Mutation caught: every turn's baseline the group's mean episode return
  (`turn_grpo_baseline_the_mean_return`: the later turns' credit moves with the bonus)."""
  rng = np.random.default_rng(seed)
  G, seq = 3, 11
  mask, ids = _turns(rng, G, seq)
  mask[:, :2], ids[:, :2] = True, 0  # every row has turn 0 at slots 0-1
  rewards = np.round(rng.normal(size=(G, seq)), 1).astype(np.float32)
  assume(len(set(np.where(mask, rewards, 0).sum(axis=1).tolist())) > 1)
  moved = rewards.copy()
  moved[:, 1] += bonus
  np.testing.assert_allclose(
    _turn_grpo(moved, mask, ids, G), _turn_grpo(rewards, mask, ids, G), atol=2e-4
  )
