"""The credit table: every rule reachable by its config, each the function it names, and
the configs' validation reading the table (a new estimator is one function + one line)."""

import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.rl import advantages as adv_lib
from rlpost.rl import credit
from rlpost.rl import objectives
from rlpost.rl import state_credit

GRPO, PPO = objectives.GRPOConfig, objectives.PPOConfig


def _turn_batch(seed=0, N=4, T=6):
  """Per-turn rewards [N, T], a mask, turn ids (two turns per row, an observation slot
  between them) and [N, 2 + T] tokens (a 2-token prompt, then the completion slots)."""
  rng = np.random.default_rng(seed)
  mask = np.ones((N, T), bool)
  mask[:, 2] = False  # an observation slot between the two turns
  ids = np.where(np.arange(T) < 3, 0, 1)[None].repeat(N, 0).astype(np.int32)
  rewards = np.where(mask, rng.normal(size=(N, T)), 0.0).astype(np.float32)
  tokens = np.arange(N * (2 + T), dtype=np.int32).reshape(N, 2 + T)  # every slot its own
  tokens[:, 2 + 2] = 7  # ... but the observation every turn 1 answered: one state
  return credit.CreditInputs(jnp.asarray(rewards), jnp.asarray(mask), jnp.asarray(ids), tokens)


def test_every_grpo_config_reaches_the_function_its_rule_names():
  """Mutations caught: a table line pointing at another estimator ("drgrpo":
  episode(adv_lib.grpo)); `GRPOConfig.rule` dropping the credit prefix; `state_grpo`
  reading the first T tokens instead of the last T."""
  rewards = jnp.asarray([1.0, 0.0, 0.5, 0.5, 2.0, 1.0, 0.0, 3.0])
  direct = {
    "grpo": lambda r: adv_lib.grpo(r, 4),
    "drgrpo": lambda r: adv_lib.drgrpo(r, 4),
    "rloo": lambda r: adv_lib.rloo(r, 4),
    "reinforce_pp": adv_lib.reinforce_pp,
  }
  assert set(credit.episode_estimators()) == set(direct)
  for name, fn in direct.items():
    got = credit.advantages(credit.CreditInputs(rewards, None), GRPO(advantage_estimator=name))
    np.testing.assert_array_equal(got, fn(rewards), err_msg=name)
  b = _turn_batch()
  want = adv_lib.turn_grpo(b.rewards, b.mask, b.turn_ids, 2)
  np.testing.assert_array_equal(credit.advantages(b, GRPO(num_generations=2, credit="turn")), want)
  keys = state_credit.observation_keys(jnp.asarray(b.tokens[:, 2:]), b.mask, b.turn_ids)
  want = state_credit.state_grpo(b.rewards, b.mask, b.turn_ids, keys, 2)
  got = credit.advantages(b, GRPO(num_generations=2, credit="state"))
  np.testing.assert_array_equal(got, want)


def test_ppo_rules_are_gae_per_token_or_per_turn_with_both_lambdas():
  """Mutations caught: `_both_lambdas` returning the gae_lambda returns; the "turn_gae"
  line pointing at token_gae."""
  b = _turn_batch(seed=1)
  values = jnp.asarray(np.random.default_rng(2).normal(size=b.mask.shape), jnp.float32)
  b = b._replace(values=values)
  config = PPO(gamma=0.9, gae_lambda=0.5, critic_lambda=1.0)
  adv, returns = credit.advantages(b, config)
  want_adv, _ = adv_lib.gae(b.rewards, values, b.mask, gamma=0.9, lam=0.5)
  _, want_returns = adv_lib.gae(b.rewards, values, b.mask, gamma=0.9, lam=1.0)
  np.testing.assert_array_equal(adv, want_adv)
  np.testing.assert_array_equal(returns, want_returns)
  turn = PPO(gamma=0.9, gae_lambda=0.5, critic_lambda=0.5, credit="turn")
  want = adv_lib.turn_gae(b.rewards, values, b.mask, b.turn_ids, gamma=0.9, lam=0.5)
  for got, w in zip(credit.advantages(b, turn), want):
    np.testing.assert_array_equal(got, w)


def test_a_new_estimator_is_one_function_and_one_table_line(monkeypatch):
  """An episode estimator and a turn-level one added to RULES alone are valid config names
  and what the config computes; before they are added the configs refuse them, naming the
  table's choices. Mutation caught: GRPOConfig checking `advantage_estimator` against a
  fixed tuple instead of the table."""
  with pytest.raises(ValueError, match="advantage_estimator='best': use one of grpo, drgrpo"):
    GRPO(advantage_estimator="best")
  with pytest.raises(ValueError, match="turn credit is the grpo estimator's .*not 'rloo'"):
    GRPO(credit="turn", advantage_estimator="rloo")
  best = lambda rewards_N, group_size: rewards_N - jnp.max(rewards_N)
  rules = dict(credit.RULES)
  rules["best"] = credit.Rule(credit.episode(best), "grpo", "episode", "episode", groups=True)
  rules["turn_rloo"] = credit.Rule(lambda inputs, c: inputs.rewards, "grpo", "turn", "turn", True)
  monkeypatch.setattr(credit, "RULES", rules)
  rewards = jnp.asarray([1.0, 3.0])
  got = credit.advantages(credit.CreditInputs(rewards, None), GRPO(advantage_estimator="best"))
  np.testing.assert_array_equal(got, [-2.0, 0.0])
  assert credit.of(GRPO(credit="turn", advantage_estimator="rloo")).credit == "turn"
  with pytest.raises(ValueError, match="best compares samples of a group: use >= 2"):
    GRPO(advantage_estimator="best", num_generations=1)


def test_credit_values_and_what_each_rule_reads():
  """The configs' `credit` choices come from the table, in its order (the messages of
  tests/test_bad_input.py name them); turn and state credit read per-turn rewards, the
  episode estimators one reward per row, PPO either. Mutation caught: `credits` without
  the learner filter (GRPOConfig then accepting credit='token')."""
  assert credit.credits("grpo") == ("episode", "turn", "state")
  assert credit.credits("ppo") == ("token", "turn")
  with pytest.raises(ValueError, match="credit='token': use one of episode, turn, state"):
    GRPO(credit="token")
  reads = {c: credit.of(GRPO(credit=c)).rewards for c in credit.credits("grpo")}
  assert reads == {"episode": "episode", "turn": "turn", "state": "turn"}
  assert {credit.of(PPO(credit=c)).rewards for c in credit.credits("ppo")} == {"either"}
  assert credit.compares_groups("rloo") and not credit.compares_groups("reinforce_pp")
  assert not credit.compares_groups("nosuch")
