"""Advantage estimators and masked statistics (pure jnp, jit-friendly).

Row order of group estimators is prompt-major: rows `b*G .. b*G + G-1` are the
`G` samples of prompt `b`, so `rewards_N.reshape(N // G, G)` gives the groups.
Masks are `[batch, seq]` bool or 0/1 over completion tokens; masked positions of
every `[batch, seq]` output are 0 and never influence valid positions.
"""

import chex
import einops
import jax
import jax.numpy as jnp


def _groups(rewards_N, group_size):
  """`[N]` (an array, or a list of numbers) -> `[N // G, G]` float32, checking that `G`
  divides `N`."""
  rewards_N = jnp.asarray(rewards_N)
  if rewards_N.ndim != 1 or group_size < 1 or rewards_N.shape[0] % group_size:
    raise ValueError(
      f"rewards must be [N] with N a multiple of group_size; "
      f"got shape {rewards_N.shape}, group_size={group_size}"
    )
  return einops.rearrange(rewards_N.astype(jnp.float32), "(p g) -> p g", g=group_size)


def _all_equal(r_PxG):
  """`[P, 1]` bool: True for groups whose rewards are all equal."""
  return (jnp.max(r_PxG, axis=1) == jnp.min(r_PxG, axis=1))[:, None]


def grpo(rewards_N, group_size, *, epsilon=1e-6):
  """GRPO (DeepSeekMath): `(r - group mean) / (group std + epsilon)`, `[N]` f32.

  The std is the unbiased (ddof=1) sample std, as in TRL and verl; it needs
  `group_size >= 2`. Groups whose rewards are all equal get advantage 0.
  """
  if group_size < 2:
    raise ValueError(
      f"grpo needs group_size >= 2 (std of one sample), got "
      f"{group_size}; use reinforce_pp for single samples"
    )
  r_PxG = _groups(rewards_N, group_size)
  mean_Px1 = jnp.mean(r_PxG, axis=1, keepdims=True)
  std_Px1 = jnp.std(r_PxG, axis=1, keepdims=True, ddof=1)
  adv_PxG = (r_PxG - mean_Px1) / (std_Px1 + epsilon)
  # Rounding in the mean of equal values would otherwise be divided by ~eps.
  return jnp.where(_all_equal(r_PxG), 0.0, adv_PxG).reshape(-1)


def drgrpo(rewards_N, group_size):
  """Dr. GRPO: `r - group mean` (no std normalization), `[N]` float32."""
  r_PxG = _groups(rewards_N, group_size)
  adv_PxG = r_PxG - jnp.mean(r_PxG, axis=1, keepdims=True)
  return jnp.where(_all_equal(r_PxG), 0.0, adv_PxG).reshape(-1)


def rloo(rewards_N, group_size):
  """RLOO: `r - mean of the other G-1 rewards of the group`, `[N]` float32."""
  if group_size < 2:
    raise ValueError(f"rloo needs group_size >= 2 (a leave-one-out baseline), got {group_size}")
  r_PxG = _groups(rewards_N, group_size)
  sum_Px1 = jnp.sum(r_PxG, axis=1, keepdims=True)
  others_PxG = (sum_Px1 - r_PxG) / (group_size - 1)
  return jnp.where(_all_equal(r_PxG), 0.0, r_PxG - others_PxG).reshape(-1)


def masked_mean(x, mask, axis=None):
  """Mean of `x` where `mask` is nonzero (NaN-safe); 0 when nothing is valid."""
  mask = jnp.broadcast_to(mask, x.shape).astype(jnp.float32)
  total = jnp.sum(jnp.where(mask > 0, x, 0.0) * mask, axis=axis)
  count = jnp.sum(mask, axis=axis)
  return jnp.where(count > 0, total / jnp.where(count > 0, count, 1.0), 0.0)


def masked_var(x, mask, *, unbiased=False):
  """Variance of `x` over valid positions (population variance by default)."""
  mask = jnp.broadcast_to(mask, x.shape).astype(jnp.float32)
  mean = masked_mean(x, mask)
  var = masked_mean(jnp.square(jnp.where(mask > 0, x - mean, 0.0)), mask)
  if unbiased:
    count = jnp.sum(mask)
    var = var * count / jnp.maximum(count - 1.0, 1.0)
  return var


def masked_whiten(x, mask, *, shift_mean=True, epsilon=1e-8):
  """`(x - mean) / sqrt(var + epsilon)` over valid positions; masked ones 0.

  With `shift_mean=False` the mean is added back (only the scale changes).
  """
  mask = jnp.broadcast_to(mask, x.shape)
  mean = masked_mean(x, mask)
  whitened = (x - mean) * jax.lax.rsqrt(masked_var(x, mask) + epsilon)
  if not shift_mean:
    whitened = whitened + mean
  return jnp.where(mask > 0, whitened, 0.0)


def sequence_to_token_rewards(rewards_N, mask_NxT):
  """Puts each sequence reward on its row's last valid token: `[N, T]` f32."""
  mask_NxT = mask_NxT.astype(bool)
  seq = mask_NxT.shape[1]
  last_N = seq - 1 - jnp.argmax(mask_NxT[:, ::-1], axis=1)
  is_last_NxT = jnp.arange(seq)[None, :] == last_N[:, None]
  return jnp.where(is_last_NxT & mask_NxT, rewards_N.astype(jnp.float32)[:, None], 0.0)


def _reverse_masked_scan(step_fn, init, xs_TxB):
  """Reverse `lax.scan` over time of `[T, B]` inputs, time-major."""
  _, ys = jax.lax.scan(step_fn, init, xs_TxB, reverse=True)
  return ys


def discounted_returns(rewards_BxT, mask_BxT, *, gamma=1.0):
  """Reward-to-go `sum_{s>=t valid} gamma^(#valid steps from t to s) r_s`.

  Masked positions are skipped (their rewards are ignored and they do not count
  as steps); they return 0. `[batch, seq]` float32.
  """
  chex.assert_equal_shape([rewards_BxT, mask_BxT])
  mask_TxB = mask_BxT.astype(bool).T
  rewards_TxB = jnp.where(mask_TxB, rewards_BxT.T, 0.0).astype(jnp.float32)

  def step(next_return_B, xs):
    r_B, m_B = xs
    ret_B = jnp.where(m_B, r_B + gamma * next_return_B, next_return_B)
    return ret_B, jnp.where(m_B, ret_B, 0.0)

  init_B = jnp.zeros(rewards_TxB.shape[1], jnp.float32)
  return _reverse_masked_scan(step, init_B, (rewards_TxB, mask_TxB)).T


def reinforce_pp(
  rewards_N, mask_BxT=None, *, kl_BxT=None, beta=0.0, gamma=1.0, group_size=None, epsilon=1e-8
):
  """REINFORCE++ advantages: returns whitened with batch (global) statistics.

  Without `mask_BxT`: sequence level, `(r - batch mean) / sqrt(batch var +
  epsilon)`, `[N]`. With `mask_BxT` (`[N, T]`): token level, as in the paper:
  the score sits on each row's last valid token, `-beta * kl_BxT` (a per-token
  KL estimate such as `losses.kl_penalty`) is added on every valid token,
  returns are the `gamma`-discounted reward-to-go, and they are whitened over
  all valid tokens of the batch; `[N, T]`, masked positions 0.

  Args:
    rewards_N: `[N]` sequence rewards.
    mask_BxT: optional `[N, T]` completion mask.
    kl_BxT: optional `[N, T]` per-token KL estimate (needs `mask_BxT`).
    beta: KL coefficient for the reward shaping.
    gamma: discount over tokens (1.0 in the paper).
    group_size: if set, subtract the group mean first ("REINFORCE++-baseline").
    epsilon: added to the variance before the square root.
  """
  rewards_N = jnp.asarray(rewards_N, jnp.float32)
  if group_size is not None:
    rewards_N = drgrpo(rewards_N, group_size)
  if mask_BxT is None:
    if kl_BxT is not None:
      raise ValueError("reinforce_pp: kl_BxT needs mask_BxT (token-level mode)")
    return masked_whiten(rewards_N, jnp.ones(rewards_N.shape, bool), epsilon=epsilon)
  token_rewards_BxT = sequence_to_token_rewards(rewards_N, mask_BxT)
  if kl_BxT is not None:
    token_rewards_BxT = token_rewards_BxT - beta * jnp.where(mask_BxT.astype(bool), kl_BxT, 0.0)
  returns_BxT = discounted_returns(token_rewards_BxT, mask_BxT, gamma=gamma)
  return masked_whiten(returns_BxT, mask_BxT, epsilon=epsilon)


def gae(rewards_BxT, values_BxT, mask_BxT, *, gamma, lam):
  """Generalized advantage estimation over valid tokens (reverse `lax.scan`).

  Padding convention: masked positions (inside or after a sequence) are skipped
  entirely. For a valid position `t`, "next" means the next *valid* position
  `t'` of the same row: `delta_t = r_t + gamma * V_t' - V_t` and
  `A_t = delta_t + gamma * lam * A_t'`; after the last valid token `V = A = 0`.
  Rewards and values at masked positions are never read, and masked outputs are
  0. `returns = advantages + values` (the value-function target).

  Args:
    rewards_BxT: `[batch, seq]` per-token rewards (e.g. score on the last token
      minus a KL penalty).
    values_BxT: `[batch, seq]` critic values.
    mask_BxT: `[batch, seq]` bool or 0/1.
    gamma: discount; lam: GAE lambda.

  Returns:
    `(advantages_BxT, returns_BxT)`, float32.
  """
  chex.assert_rank(mask_BxT, 2)
  chex.assert_equal_shape([rewards_BxT, values_BxT, mask_BxT])
  mask_TxB = mask_BxT.astype(bool).T
  rewards_TxB = jnp.where(mask_TxB, rewards_BxT.T, 0.0).astype(jnp.float32)
  values_TxB = jnp.where(mask_TxB, values_BxT.T, 0.0).astype(jnp.float32)

  def step(carry, xs):
    next_value_B, next_adv_B = carry
    r_B, v_B, m_B = xs
    delta_B = r_B + gamma * next_value_B - v_B
    adv_B = delta_B + gamma * lam * next_adv_B
    carry = (jnp.where(m_B, v_B, next_value_B), jnp.where(m_B, adv_B, next_adv_B))
    return carry, jnp.where(m_B, adv_B, 0.0)

  zeros_B = jnp.zeros(rewards_TxB.shape[1], jnp.float32)
  adv_TxB = _reverse_masked_scan(step, (zeros_B, zeros_B), (rewards_TxB, values_TxB, mask_TxB))
  returns_TxB = jnp.where(mask_TxB, adv_TxB + values_TxB, 0.0)
  return adv_TxB.T, returns_TxB.T


def turn_ends(mask_BxT, turn_ids_BxT):
  """`[B, T]` bool: the last valid token of each turn, i.e. of each run of valid tokens
  with one turn id (masked slots between them, e.g. observation tokens, do not split a
  run); a token whose next valid token belongs to another turn, or that has none."""
  chex.assert_equal_shape([mask_BxT, turn_ids_BxT])
  mask_TxB = mask_BxT.astype(bool).T
  ids_TxB = turn_ids_BxT.astype(jnp.int32).T

  def step(next_id_B, xs):
    m_B, id_B = xs
    return jnp.where(m_B, id_B, next_id_B), m_B & (id_B != next_id_B)

  none_B = jnp.full(ids_TxB.shape[1], jnp.iinfo(jnp.int32).min, jnp.int32)
  return _reverse_masked_scan(step, none_B, (mask_TxB, ids_TxB)).T


def turn_starts(mask_BxT, turn_ids_BxT):
  """`[B, T]` bool: the first valid token of each turn (`turn_ends` read backwards)."""
  return turn_ends(mask_BxT[:, ::-1], turn_ids_BxT[:, ::-1])[:, ::-1]


def _turn_start_values(values_BxT, mask_BxT, turn_ids_BxT):
  """`[B, T]`: at each valid token, the value at its turn's first valid token (else 0)."""
  starts_TxB = turn_starts(mask_BxT, turn_ids_BxT).T

  def step(carry_B, xs):
    v_B, start_B, m_B = xs
    carry_B = jnp.where(start_B, v_B, carry_B)
    return carry_B, jnp.where(m_B, carry_B, 0.0)

  zeros_B = jnp.zeros(starts_TxB.shape[1], jnp.float32)
  xs = (values_BxT.T.astype(jnp.float32), starts_TxB, mask_BxT.T)
  return jax.lax.scan(step, zeros_B, xs)[1].T


TURN_VALUES = ("end", "start")  # where turn_gae reads a turn's value


def turn_gae(rewards_BxT, values_BxT, mask_BxT, turn_ids_BxT, *, gamma, lam, value_at="end"):
  """GAE with a turn as the step: credit assignment across the turns of an episode.

  Each turn's rewards (its valid tokens' rewards summed: a turn reward on its last token,
  per-token KL penalties) are its step reward; its value V_k is the critic's at its last
  valid token (`value_at="end"`, `turn_ends`) or at its first (`"start"`, `turn_starts`);
  `gae` runs over the turns, so that `delta_k = R_k + gamma * V_{k+1} - V_k`,
  `A_k = delta_k + gamma * lam * A_{k+1}` (after the last turn V = A = 0). Every valid
  token of turn k carries A_k and the value target `A_k + V_k`; masked positions are 0
  and never read.

  With the critic's alignment (a token's value is read where that token is predicted),
  the value at a turn's first token sees the observation only: V(s_k), the state in which
  the turn's action is chosen. The value at its last token has also read the action's
  other tokens (e.g. the move before an end-of-turn token): closer to Q(s_k, a_k), whose
  advantage `R_k + V_{k+1} - Q(s_k, a_k)` is 0 in expectation for every action, so a
  critic that predicts well leaves the actor little to learn from.

  Args:
    rewards_BxT, values_BxT: `[batch, seq]` per-token rewards and critic values.
    mask_BxT: `[batch, seq]` bool or 0/1 (the loss mask: sampled tokens).
    turn_ids_BxT: `[batch, seq]` int, the turn of each slot.
    gamma, lam: discount and GAE lambda per turn.
    value_at: one of TURN_VALUES, the token whose value is the turn's.

  Returns:
    `(advantages_BxT, returns_BxT)`, float32.
  """
  chex.assert_equal_shape([rewards_BxT, values_BxT, mask_BxT, turn_ids_BxT])
  if value_at not in TURN_VALUES:
    raise ValueError(f"turn_gae value_at={value_at!r}: use one of {TURN_VALUES}")
  mask_BxT = mask_BxT.astype(bool)
  ends_BxT = turn_ends(mask_BxT, turn_ids_BxT)
  if value_at == "start":  # each turn's first value moved onto its tokens (read at its end)
    values_BxT = _turn_start_values(values_BxT, mask_BxT, turn_ids_BxT)
  rewards_TxB = jnp.where(mask_BxT, rewards_BxT, 0.0).astype(jnp.float32).T

  def add(sum_B, xs):  # a turn's rewards summed onto its last token
    r_B, end_B = xs
    total_B = sum_B + r_B
    return jnp.where(end_B, 0.0, total_B), jnp.where(end_B, total_B, 0.0)

  zeros_B = jnp.zeros(rewards_TxB.shape[1], jnp.float32)
  _, turn_rewards_TxB = jax.lax.scan(add, zeros_B, (rewards_TxB, ends_BxT.T))
  adv_BxT, returns_BxT = gae(turn_rewards_TxB.T, values_BxT, ends_BxT, gamma=gamma, lam=lam)

  def spread(carry, xs):  # reverse: a turn's end comes first and sets its tokens' values
    a_B, g_B, end_B, m_B = xs
    carry = (jnp.where(end_B, a_B, carry[0]), jnp.where(end_B, g_B, carry[1]))
    return carry, (jnp.where(m_B, carry[0], 0.0), jnp.where(m_B, carry[1], 0.0))

  xs = (adv_BxT.T, returns_BxT.T, ends_BxT.T, mask_BxT.T)
  adv_TxB, returns_TxB = _reverse_masked_scan(spread, (zeros_B, zeros_B), xs)
  return adv_TxB.T, returns_TxB.T


def turn_grpo(rewards_BxT, mask_BxT, turn_ids_BxT, group_size, *, epsilon=1e-6):
  """GRPO with a turn as the unit of credit: `[N, T]` float32 advantages.

  Turn k of row i is credited with its reward-to-go R_ik (the row's rewards from the
  turn's first valid token on: that turn's and the later turns'), less the mean of R_jk
  over the rows j of its group that have a turn k, over the group's pooled std of those
  deviations (their squares summed over rows and turns, over the sum of each turn's
  rows - 1) plus `epsilon`; every valid token of the turn carries it. A group whose
  rewards-to-go tie at every turn gets 0, as `grpo` a tied group. With one turn per row
  this is `grpo` of the returns on every valid token; rewards earned before a turn do
  not reach its credit. (The std of the episode returns alone would not do: returns that
  tie, exactly or but for float rounding, over turns that differ would divide by ~0.)

  Args:
    rewards_BxT: `[N, T]` per-token rewards (a turn's on its last valid token,
      `envs.multiturn.place_turn_rewards`); masked positions are ignored.
    mask_BxT: `[N, T]` bool or 0/1, the sampled tokens.
    turn_ids_BxT: `[N, T]` int, the turn of each slot (0, 1, ...; -1 empty).
    group_size: G, rows per group (prompt-major, as `grpo`), >= 2.
  """
  if group_size < 2:
    raise ValueError(f"turn_grpo needs group_size >= 2 (std of one sample), got {group_size}")
  chex.assert_equal_shape([rewards_BxT, mask_BxT, turn_ids_BxT])
  mask_BxT = mask_BxT.astype(bool)
  N, T = mask_BxT.shape
  K = T + 1
  turn_to_go_BxK, has_BxK = turn_rewards_to_go(rewards_BxT, mask_BxT, turn_ids_BxT)
  to_go_PxGxK = turn_to_go_BxK.reshape(N // group_size, group_size, K)
  has_PxGxK = has_BxK.reshape(to_go_PxGxK.shape)
  count_Px1xK = jnp.sum(has_PxGxK, axis=1, keepdims=True)
  mean_Px1xK = jnp.sum(jnp.where(has_PxGxK, to_go_PxGxK, 0.0), axis=1, keepdims=True) / (
    jnp.maximum(count_Px1xK, 1)
  )
  dev_PxGxK = jnp.where(has_PxGxK, to_go_PxGxK - mean_Px1xK, 0.0)
  dof_Px1x1 = jnp.sum(jnp.maximum(count_Px1xK - 1, 0), axis=2, keepdims=True)
  var_Px1x1 = jnp.sum(dev_PxGxK * dev_PxGxK, axis=(1, 2), keepdims=True) / jnp.maximum(dof_Px1x1, 1)
  adv_PxGxK = dev_PxGxK / (jnp.sqrt(var_Px1x1) + epsilon)
  low, high = (
    jnp.where(has_PxGxK, to_go_PxGxK, jnp.inf),
    jnp.where(has_PxGxK, to_go_PxGxK, -jnp.inf),
  )
  tied_Px1x1 = jnp.all(
    (jnp.min(low, axis=1) >= jnp.max(high, axis=1)) | (count_Px1xK[:, 0] == 0), axis=1
  )[:, None, None]
  adv_PxGxK = jnp.where(tied_Px1x1, 0.0, adv_PxGxK)
  return per_turn_to_slots(adv_PxGxK.reshape(N, K), mask_BxT, turn_ids_BxT)


def turn_rewards_to_go(rewards_BxT, mask_BxT, turn_ids_BxT):
  """Each turn's reward-to-go: (`[N, K]` float32, `[N, K]` bool), K = T + 1 (turn ids
  0..T).

  Entry k of a row is the row's rewards summed from turn k's first valid token on, and
  True where the row has a valid token of turn k (else 0 and False).
  """
  mask_BxT = mask_BxT.astype(bool)
  N, T = mask_BxT.shape
  K = T + 1
  rewards_BxT = jnp.where(mask_BxT, rewards_BxT, 0.0).astype(jnp.float32)
  to_go_BxT = jnp.flip(jnp.cumsum(jnp.flip(rewards_BxT, 1), axis=1), 1)
  slot_BxT = jnp.where(turn_starts(mask_BxT, turn_ids_BxT), turn_ids_BxT, K)
  rows_Bx1 = jnp.arange(N)[:, None]
  to_go_BxK = jnp.zeros((N, K), jnp.float32).at[rows_Bx1, slot_BxT].set(to_go_BxT, mode="drop")
  has_BxK = jnp.zeros((N, K), bool).at[rows_Bx1, slot_BxT].set(True, mode="drop")
  return to_go_BxK, has_BxK


def per_turn_to_slots(per_turn_BxK, mask_BxT, turn_ids_BxT):
  """`[N, T]`: each valid slot gets its turn's entry of `per_turn_BxK` (K = T + 1); 0
  elsewhere."""
  T = mask_BxT.shape[1]
  turn_BxT = jnp.clip(turn_ids_BxT, 0, T).astype(jnp.int32)
  per_slot_BxT = jnp.take_along_axis(per_turn_BxK, turn_BxT, axis=1)
  return jnp.where(mask_BxT.astype(bool), per_slot_BxT, 0.0)


def zero_signal_groups(rewards_N, group_size):
  """DAPO dynamic sampling: `[N // G]` bool, True where a group's rewards tie.

  Such groups have zero advantage under GRPO/Dr.GRPO/RLOO and can be dropped
  (or resampled) before the update.
  """
  return _all_equal(_groups(rewards_N, group_size))[:, 0]


def overlong_penalty(lengths_N, *, max_len, buffer_len, penalty_factor=1.0):
  """DAPO soft overlong punishment by completion length in TOKENS: `[N]` f32.

  0 up to `max_len - buffer_len` tokens, then linear down to `-penalty_factor`
  at `max_len`, and `-penalty_factor` beyond. Add it to the task reward.
  """
  if not 0 < buffer_len <= max_len:
    raise ValueError(
      f"overlong_penalty needs 0 < buffer_len <= max_len, got "
      f"buffer_len={buffer_len}, max_len={max_len}"
    )
  excess_N = lengths_N.astype(jnp.float32) - (max_len - buffer_len)
  return -penalty_factor * jnp.clip(excess_N / buffer_len, 0.0, 1.0)


def batch_whitened(rewards_N, group_size):
  """REINFORCE++ at sequence level: rewards whitened over the batch, `[N]` f32.

  `group_size` is unused (no group baseline); it keeps the table's signature.
  """
  del group_size
  return reinforce_pp(rewards_N)
