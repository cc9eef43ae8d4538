"""GRPO with a state as the unit of comparison (`GRPOConfig.credit="state"`).

A group's episodes often pass through the same state: the same observation, shown at
the same or another turn. Comparing the moves taken from one state against each other
gives a baseline per state from the group's own samples, with no critic (the idea of
GiGPO, Feng et al. 2025, arXiv:2505.10978: step-level groups over repeated states). Here
the reward-to-go is undiscounted and the scale is the group's pooled std over its states.

Here a turn's state is the observation it answered. In a multi-turn batch
(`envs.multiturn`) turn k's slots are its sampled tokens, then the environment's answer
(the observation and the scaffold around it, not sampled), so turn k answered turn
k - 1's unsampled tokens; the first turn answered the prompt, which its group shares.
Equal tokens at equal offsets are one state; the test is a 64-bit hash of them
(`observation_keys`), so two different observations share a state with probability
~2^-64 per pair.

Row order is prompt-major (rows `b*G .. b*G + G-1` share a prompt), as in `advantages`.
"""

import chex
import jax
import jax.numpy as jnp

from rlpost.rl import advantages as adv_lib

_SEEDS = (0x2545F491, 0x9E3779B9)  # one per 32-bit half of a key
_TOKEN_MULT, _OFFSET_MULT = 0x85EBCA6B, 0xC2B2AE35


def _mix32(x):
  """A bijective avalanche of uint32 words (MurmurHash3's finaliser)."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def observation_keys(tokens_BxT, mask_BxT, turn_ids_BxT):
  """What each turn answered, as `[N, K, 2]` uint32 keys (K = T + 1: turn ids 0..T).

  Key k >= 1 of a row hashes turn k - 1's slots that are not sampled (mask 0, turn id
  k - 1: the environment's answer to that turn): each token with its offset from the
  first of them, summed over them, plus a constant (so that an empty answer is not the
  prompt's state). Key 0 (the first turn, answering the prompt its group shares) is
  (0, 0). Equal answers give equal keys, whatever the replies before them.

  Args:
    tokens_BxT: `[N, T]` int, the completion slots' tokens.
    mask_BxT: `[N, T]` bool or 0/1, the sampled tokens.
    turn_ids_BxT: `[N, T]` int, the turn of each slot (a turn's sampled tokens and the
      answer after them; -1 empty).
  """
  chex.assert_equal_shape([tokens_BxT, mask_BxT, turn_ids_BxT])
  N, T = tokens_BxT.shape
  K = T + 1
  turn_BxT = turn_ids_BxT.astype(jnp.int32)
  answer_BxT = (turn_BxT >= 0) & ~mask_BxT.astype(bool)
  slot_BxT = jnp.where(answer_BxT, turn_BxT, K)  # K: dropped
  rows_Bx1 = jnp.arange(N)[:, None]
  t_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (N, T))
  first_BxK = jnp.full((N, K), T, jnp.int32).at[rows_Bx1, slot_BxT].min(t_BxT, mode="drop")
  offset_BxT = t_BxT - jnp.take_along_axis(first_BxK, jnp.clip(slot_BxT, 0, T), axis=1)
  token_BxT = tokens_BxT.astype(jnp.uint32) * jnp.uint32(_TOKEN_MULT)
  offset_BxT = (offset_BxT.astype(jnp.uint32) + jnp.uint32(1)) * jnp.uint32(_OFFSET_MULT)
  keys = []
  for seed in _SEEDS:
    h_BxT = _mix32(_mix32(token_BxT ^ jnp.uint32(seed)) + offset_BxT)
    h_BxT = jnp.where(answer_BxT, h_BxT, jnp.uint32(0))
    answer_BxK = jnp.zeros((N, K), jnp.uint32).at[rows_Bx1, slot_BxT].add(h_BxT, mode="drop")
    later_BxK = answer_BxK[:, :-1] + _mix32(jnp.uint32(seed))  # turn k: turn k - 1's answer
    keys.append(jnp.concatenate([jnp.zeros((N, 1), jnp.uint32), later_BxK], axis=1))
  return jnp.stack(keys, axis=-1)


def state_grpo(rewards_BxT, mask_BxT, turn_ids_BxT, keys_BxKx2, group_size, *, epsilon=1e-6):
  """Episode plus state credit: `[N, T]` float32 advantages on the sampled tokens.

  Every sampled token of row i carries `grpo` of the rows' returns (the episode term),
  plus, on turn k, the state term: R_ik, the turn's reward-to-go (the row's rewards from
  the turn's first sampled token on), less the mean of R over the group's turns (any
  row, any turn) whose key equals its key, over the group's pooled std of those
  deviations (their squares summed, over the sum of each state's turns - 1) plus
  `epsilon`. A state that one turn of the group reached gets 0, as does a group whose
  rewards-to-go tie within every state. With every later turn's observation unique in
  its group, the first turn (the shared prompt) carries twice the episode term and
  every later turn once.

  Args:
    rewards_BxT: `[N, T]` per-token rewards (a turn's on its last sampled token); masked
      positions are ignored.
    mask_BxT: `[N, T]` bool or 0/1, the sampled tokens.
    turn_ids_BxT: `[N, T]` int, the turn of each slot (-1 empty).
    keys_BxKx2: `[N, T + 1, 2]` uint32, each turn's state (`observation_keys`).
    group_size: G, rows per group (prompt-major), >= 2.
  """
  if group_size < 2:
    raise ValueError(f"state_grpo needs group_size >= 2 (std of one sample), got {group_size}")
  mask_BxT = mask_BxT.astype(bool)
  N, T = mask_BxT.shape
  K = T + 1
  chex.assert_shape(keys_BxKx2, (N, K, 2))
  to_go_BxK, has_BxK = adv_lib.turn_rewards_to_go(rewards_BxT, mask_BxT, turn_ids_BxT)
  returns_N = jnp.sum(jnp.where(mask_BxT, rewards_BxT, 0.0).astype(jnp.float32), axis=1)
  episode_N = adv_lib.grpo(returns_N, group_size, epsilon=epsilon)
  state_BxK = _state_term(to_go_BxK, has_BxK, keys_BxKx2, group_size, epsilon)
  per_turn_BxK = episode_N[:, None] + state_BxK
  return adv_lib.per_turn_to_slots(per_turn_BxK, mask_BxT, turn_ids_BxT)


def _state_term(to_go_BxK, has_BxK, keys_BxKx2, group_size, epsilon):
  """`[N, K]`: each present turn's reward-to-go against its state's mean in its group,
  over the group's pooled std (0 for lone states and tied groups)."""
  N, K = to_go_BxK.shape
  M = N * K
  group_M = (jnp.arange(N) // group_size).repeat(K)
  has_M = has_BxK.reshape(M)
  r_M = to_go_BxK.reshape(M)
  k0_M, k1_M = keys_BxKx2[..., 0].reshape(M), keys_BxKx2[..., 1].reshape(M)
  # Sort by (group, present, key): each state of a group is one run of equal entries.
  order_M = jnp.lexsort((k1_M, k0_M, ~has_M, group_M))
  sort = lambda x: x[order_M]
  g_s, h_s, a_s, b_s = sort(group_M), sort(has_M), sort(k0_M), sort(k1_M)
  new_run = jnp.concatenate(
    [
      jnp.ones(1, bool),
      (g_s[1:] != g_s[:-1]) | (h_s[1:] != h_s[:-1]) | (a_s[1:] != a_s[:-1]) | (b_s[1:] != b_s[:-1]),
    ]
  )
  run_s = jnp.cumsum(new_run) - 1
  run_M = jnp.zeros(M, jnp.int32).at[order_M].set(run_s)
  r_in_M = jnp.where(has_M, r_M, 0.0)
  count_R = jax.ops.segment_sum(has_M.astype(jnp.float32), run_M, num_segments=M)
  mean_R = jax.ops.segment_sum(r_in_M, run_M, num_segments=M) / jnp.maximum(count_R, 1.0)
  dev_M = jnp.where(has_M, r_M - mean_R[run_M], 0.0)
  low_R = jax.ops.segment_min(jnp.where(has_M, r_M, jnp.inf), run_M, num_segments=M)
  high_R = jax.ops.segment_max(jnp.where(has_M, r_M, -jnp.inf), run_M, num_segments=M)
  varied_M = has_M & (low_R[run_M] < high_R[run_M])
  P = N // group_size
  # A state of n turns adds n - 1 degrees of freedom: 1 - 1/n per turn.
  dof_M = jnp.where(has_M, 1.0 - 1.0 / jnp.maximum(count_R[run_M], 1.0), 0.0)
  dof_P = jax.ops.segment_sum(dof_M, group_M, num_segments=P)
  var_P = jax.ops.segment_sum(dev_M * dev_M, group_M, num_segments=P) / jnp.maximum(dof_P, 1.0)
  varied_P = jax.ops.segment_max(varied_M.astype(jnp.int32), group_M, num_segments=P) > 0
  adv_M = jnp.where(varied_P[group_M], dev_M / (jnp.sqrt(var_P[group_M]) + epsilon), 0.0)
  return adv_M.reshape(N, K)
