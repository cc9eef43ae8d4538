"""GRPO with a state as the unit of comparison: `rlpost.rl.state_credit`."""

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from hypothesis import given
from test_advantages import SETTINGS, _turns

from rlpost.rl import advantages as adv
from rlpost.rl import state_credit

_keys = jax.jit(state_credit.observation_keys)
_state_grpo = jax.jit(state_credit.state_grpo, static_argnums=4)


def _np_keys(tokens, mask, ids):
  """The obvious states: row -> {turn id: (later turn?, the previous turn's unsampled
  slots as (offset from the first of them, token) pairs)}."""
  out = []
  for b in range(tokens.shape[0]):
    row = {}
    for k in sorted({int(i) for i in ids[b] if i >= 0}):
      answer = [t for t in np.flatnonzero(ids[b] == k - 1) if not mask[b, t]] if k else []
      row[k] = (k > 0, tuple((int(t - answer[0]), int(tokens[b, t])) for t in answer))
    out.append(row)
  return out


def _np_state_grpo(rewards, mask, ids, tokens, G):
  """The obvious reference (float64): each turn (a run of sampled tokens with one id)
  gets the episode's grpo advantage plus its reward-to-go against the mean over the
  group's turns with its state, over the group's pooled std of those deviations (sum of
  squares over the sum of each state's turns - 1); 0 for a group tied within every
  state."""
  N = rewards.shape[0]
  r = np.where(mask, rewards, 0.0).astype(np.float64)
  states = _np_keys(tokens, mask, ids)
  returns = r.sum(axis=1)
  out = np.zeros(rewards.shape)
  for first in range(0, N, G):
    group = range(first, first + G)
    g = returns[first : first + G]
    episode = np.zeros(G) if g.max() == g.min() else (g - g.mean()) / (g.std(ddof=1) + 1e-6)
    turns = []  # (row, run of slots, reward-to-go, state)
    for b in group:
      idx = np.flatnonzero(mask[b])
      runs = np.split(idx, np.flatnonzero(np.diff(ids[b, idx])) + 1) if idx.size else []
      turns += [(b, run, r[b, run[0] :].sum(), states[b][int(ids[b, run[0]])]) for run in runs]
    at = {}
    for _, _, value, s in turns:
      at.setdefault(s, []).append(value)
    tied = all(max(v) == min(v) for v in at.values())
    squares = sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in at.values())
    std = np.sqrt(squares / max(sum(len(v) - 1 for v in at.values()), 1))
    for b, run, value, s in turns:
      state = 0.0 if tied else (value - np.mean(at[s])) / (std + 1e-6)
      out[b, run] = episode[b - first] + state
  return out


@pytest.mark.slow
@SETTINGS
@given(
  groups=st.sampled_from([1, 2]),
  G=st.sampled_from([2, 3]),
  seq=st.sampled_from([1, 6, 11]),
  seed=st.integers(0, 2**16),
)
def test_state_grpo_matches_the_per_state_reference(groups, G, seq, seed):
  """Against the obvious loop, with observations drawn from two tokens (so turns of
  several rows and turn indices share states), holes, padding, empty rows; masked reward
  slots hold junk never read.

  Mutations caught: each turn's state its turn index (`state_grpo_states_are_turn_indices`);
  the episode term dropped (`state_grpo_no_episode_term`); a lone state counted as a degree
  of freedom (`state_grpo_dof_per_turn`); the reward so far instead of to go (through
  `turn_rewards_to_go`: `turn_grpo_rewards_so_far`)."""
  rng = np.random.default_rng(seed)
  shape = (groups * G, seq)
  mask, ids = _turns(rng, *shape)
  tokens = rng.integers(1, 3, size=shape).astype(np.int32)
  rewards = (np.round(4 * rng.normal(size=shape)) / 4).astype(np.float32)  # exact sums
  junk = np.where(mask, rewards, np.nan)
  got = _state_grpo(junk, mask, ids, _keys(tokens, mask, ids), G)
  want = _np_state_grpo(rewards, mask, ids, tokens, G)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@SETTINGS
@given(seq=st.sampled_from([4, 9]), seed=st.integers(0, 2**16))
def test_observation_keys_are_equal_exactly_where_the_observations_are(seq, seed):
  """Two turns' keys are equal iff they are both first turns or both later ones whose
  previous turns' unsampled tokens (the answers they read) are the same tokens at the
  same offsets; a row's sampled tokens do not enter them.

  Mutations caught: offsets left out of the hash (`observation_keys_without_offsets`: a
  reordered observation is the same state); sampled tokens hashed too
  (`observation_keys_hash_sampled_tokens`)."""
  rng = np.random.default_rng(seed)
  mask, ids = _turns(rng, 6, seq)
  tokens = rng.integers(1, 3, size=(6, seq)).astype(np.int32)
  keys = np.asarray(_keys(tokens, mask, ids))
  states = _np_keys(tokens, mask, ids)
  present = [(b, k) for b in range(6) for k in states[b]]
  for b, k in present:
    for c, u in present:
      same = states[b][k] == states[c][u]
      assert np.array_equal(keys[b, k], keys[c, u]) == same, (b, k, c, u, states[b][k])
  resampled = np.where(mask, rng.integers(3, 9, size=tokens.shape), tokens).astype(np.int32)
  np.testing.assert_array_equal(_keys(resampled, mask, ids), keys)


def _walks(moves, G, width=None):
  """A batch of G rows, each a list of turns (what the turn answered, its reward), laid
  out as `envs.multiturn` does: each turn one sampled token (its reward there), then the
  environment's answer that the next turn reads (no sampled token; the first turn's
  answer, the prompt, is not in the slots); `width` slots (None: the longest row's)."""
  T = width or max(sum(len(obs) + 1 for obs, _ in row) for row in moves)
  tokens, ids = np.zeros((G, T), np.int32), np.full((G, T), -1, np.int32)
  mask, rewards = np.zeros((G, T), bool), np.zeros((G, T), np.float32)
  for b, row in enumerate(moves):
    t = 0
    for k, (_, reward) in enumerate(row):
      tokens[b, t], mask[b, t], rewards[b, t], ids[b, t] = 9, True, reward, k
      answer = row[k + 1][0] if k + 1 < len(row) else ()
      tokens[b, t + 1 : t + 1 + len(answer)], ids[b, t + 1 : t + 1 + len(answer)] = answer, k
      t += 1 + len(answer)
  return tokens, mask, ids, rewards


def test_state_grpo_hand_worked_three_walks():
  """Three walks of one map, two turns each. A: 0, then 1 from state (5, 6); B: 0, then -1
  from (5, 6); C: 0, then 0.5 from (5, 7), a state no other walk reached. By hand: the
  returns 1, -1, 0.5 (mean 1/6, ddof-1 std 1.04083) give the episode term 0.80064,
  -1.12089, 0.32026. States: the prompt (1, -1, 0.5 about 1/6), (5, 6) (1, -1 about 0)
  and (5, 7) alone: squares 78/36 + 2 over 2 + 1 + 0 degrees of freedom, std 1.178511;
  state terms 0.70711, -0.98995, 0.28284 on the first turns, 0.84853, -0.84853, 0 on the
  second. Turn credit would have compared C's second turn with A's and B's (0.5 against
  their mean 1/6).

  Mutation caught: each turn's state its turn index (`state_grpo_states_are_turn_indices`:
  turn credit plus the episode term)."""
  walks = [[((), 0.0), ((5, 6), 1.0)], [((), 0.0), ((5, 6), -1.0)], [((), 0.0), ((5, 7), 0.5)]]
  tokens, mask, ids, rewards = _walks(walks, 3)
  got = np.asarray(_state_grpo(rewards, mask, ids, _keys(tokens, mask, ids), 3))
  first, second = got[:, 0], got[mask].reshape(3, 2)[:, 1]
  np.testing.assert_allclose(first, [1.50775, -2.11084, 0.60310], atol=1e-4)
  np.testing.assert_allclose(second, [1.64917, -1.96942, 0.32026], atol=1e-4)
  assert np.all(got[~mask] == 0.0)


@SETTINGS
@given(G=st.sampled_from([2, 4]), turns=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_state_grpo_with_every_later_state_unique_is_the_episode_term(G, turns, seed):
  """Walks whose later observations all differ: the first turn (the shared prompt)
  carries the episode's grpo advantage twice, every later turn once (the prompt is the
  only state with a spread: its deviations are the returns' and their pooled std is
  grpo's ddof-1 std); groups whose returns tie get 0."""
  rng = np.random.default_rng(seed)
  walks = [
    [((), 0.0)] + [((100 * b + k, 1), 0.0) for k in range(1, rng.integers(1, turns + 1))]
    for b in range(2 * G)
  ]
  walks = [[(obs, float(rng.integers(-2, 3))) for obs, _ in walk] for walk in walks]
  tokens, mask, ids, rewards = _walks(walks, 2 * G, width=12)  # one program per G
  got = np.asarray(_state_grpo(rewards, mask, ids, _keys(tokens, mask, ids), G))
  episode = np.asarray(adv.grpo(rewards.sum(axis=1), G))
  first = np.argmax(mask, axis=1)
  want = np.where(mask, episode[:, None], 0.0)
  want[np.arange(2 * G), first] *= 2
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_state_grpo_needs_a_group():
  with pytest.raises(ValueError, match="group_size >= 2"):
    state_credit.state_grpo(np.zeros((2, 3)), np.ones((2, 3)), np.zeros((2, 3), int), None, 1)
