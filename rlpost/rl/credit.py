"""Credit assignment: one table, RULES, from a rule's name to the function that turns a
batch's rewards into advantages, for every learner (pure jnp, jit-friendly).

  GRPO rule  fn(inputs: CreditInputs, config: GRPOConfig) -> advantages [N] or [N, T]
  PPO rule   fn(inputs: CreditInputs, config: PPOConfig) -> (advantages, value targets),
             each [N, T] (before whitening)

  name          learner  credit   rewards  what
  grpo          grpo     episode  [N]      (r - group mean) / group std (DeepSeekMath)
  drgrpo        grpo     episode  [N]      r - group mean (Dr. GRPO)
  rloo          grpo     episode  [N]      r - mean of the group's others (RLOO)
  reinforce_pp  grpo     episode  [N]      r whitened over the batch (REINFORCE++)
  turn_grpo     grpo     turn     [N, T]   each turn's reward-to-go against its group's
  state_grpo    grpo     state    [N, T]   episode grpo + reward-to-go per observed state
  gae           ppo      token    either   GAE over sampled tokens
  turn_gae      ppo      turn     either   GAE over an episode's turns

A config names its rule (`GRPOConfig.rule`, `PPOConfig.rule`): GRPO's is its
`advantage_estimator` at episode credit, else `{credit}_{advantage_estimator}`; PPO's is
`gae` at token credit, else `{credit}_gae`. The configs check their `credit` and
`advantage_estimator` against this table (`credits`, `episode_estimators`).

Adding an estimator: its function (e.g. `fn(rewards_N, group_size) -> [N]` in
`advantages.py`) and one RULES line (`Rule(episode(fn), "grpo", "episode", ...)`); then
`--config.algo.advantage_estimator=NAME`. A turn-level GRPO estimator named `turn_NAME` is
chosen by credit='turn' with advantage_estimator=NAME.
"""

import functools
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp

from rlpost.rl import advantages as adv_lib
from rlpost.rl import state_credit


class CreditInputs(NamedTuple):
  """What a rule reads of a batch.

  rewards: GRPO: the rows' scores [N] (episode credit) or per-turn rewards [N, T] (a
    turn's on its last sampled token); PPO: token rewards [N, T] (score placed, KL added).
  mask: [N, T] loss mask (the sampled tokens).
  turn_ids: [N, T] int, the turn of each slot, or None (one turn per row).
  tokens: [N, S] int32, the rows' tokens (the completion's are the last T), or None.
  values: [N, T] critic values (PPO), or None.
  """

  rewards: Any
  mask: Any
  turn_ids: Any = None
  tokens: Any = None
  values: Any = None


class Rule(NamedTuple):
  """One RULES entry: `fn` (module doc), the `learner` whose config selects it, the
  `credit` value of that config, the `rewards` it reads ("episode": [N]; "turn": [N, T]
  per-turn; "either"), and whether it compares the G samples of a task (`groups`: it
  needs algo.num_generations >= 2; greedy samples would carry no signal)."""

  fn: Callable
  learner: str
  credit: str
  rewards: str
  groups: bool


def episode(estimator: Callable) -> Callable:
  """A GRPO rule from an episode estimator `estimator(rewards_N, group_size) -> [N]`."""
  return functools.wraps(estimator)(
    lambda inputs, config: estimator(inputs.rewards, config.num_generations)
  )


def turn_grpo(inputs: CreditInputs, config):
  """`advantages.turn_grpo` of the per-turn rewards: [N, T]."""
  return adv_lib.turn_grpo(inputs.rewards, inputs.mask, inputs.turn_ids, config.num_generations)


def state_grpo(inputs: CreditInputs, config):
  """`state_credit.state_grpo`, each turn's state read from the completion slots (the last
  T of the `[N, S]` tokens): [N, T]."""
  T = inputs.mask.shape[1]
  keys = state_credit.observation_keys(inputs.tokens[:, -T:], inputs.mask, inputs.turn_ids)
  return state_credit.state_grpo(
    inputs.rewards, inputs.mask, inputs.turn_ids, keys, config.num_generations
  )


def _both_lambdas(gae_at: Callable, config):
  """(advantages with gae_lambda, value targets with critic_lambda) of `gae_at(lam=...)`."""
  advantages, returns = gae_at(lam=config.gae_lambda)
  if config.critic_lambda != config.gae_lambda:
    _, returns = gae_at(lam=config.critic_lambda)
  return advantages, returns


def token_gae(inputs: CreditInputs, config):
  """`advantages.gae` over the sampled tokens, each token a step."""
  gae_at = functools.partial(
    adv_lib.gae, inputs.rewards, inputs.values, inputs.mask, gamma=config.gamma
  )
  return _both_lambdas(gae_at, config)


def turn_gae(inputs: CreditInputs, config):
  """`advantages.turn_gae` over an episode's turns (no `turn_ids`: one turn per row)."""
  turns = inputs.turn_ids
  if turns is None:
    turns = jnp.zeros(inputs.mask.shape, jnp.int32)
  gae_at = functools.partial(
    adv_lib.turn_gae,
    inputs.rewards,
    inputs.values,
    inputs.mask,
    turns,
    gamma=config.gamma,
    value_at=config.turn_value,
  )
  return _both_lambdas(gae_at, config)


RULES: dict[str, Rule] = {
  "grpo": Rule(episode(adv_lib.grpo), "grpo", "episode", "episode", groups=True),
  "drgrpo": Rule(episode(adv_lib.drgrpo), "grpo", "episode", "episode", groups=True),
  "rloo": Rule(episode(adv_lib.rloo), "grpo", "episode", "episode", groups=True),
  "reinforce_pp": Rule(episode(adv_lib.batch_whitened), "grpo", "episode", "episode", False),
  "turn_grpo": Rule(turn_grpo, "grpo", "turn", "turn", groups=True),
  "state_grpo": Rule(state_grpo, "grpo", "state", "turn", groups=True),
  "gae": Rule(token_gae, "ppo", "token", "either", groups=False),
  "turn_gae": Rule(turn_gae, "ppo", "turn", "either", groups=False),
}


def credits(learner: str) -> tuple[str, ...]:
  """The `algo.credit` values of `learner`'s rules, in table order."""
  return tuple(dict.fromkeys(r.credit for r in RULES.values() if r.learner == learner))


def episode_estimators() -> tuple[str, ...]:
  """GRPO's `algo.advantage_estimator` names: its episode-credit rules."""
  return tuple(n for n, r in RULES.items() if r.learner == "grpo" and r.credit == "episode")


def compares_groups(name: str) -> bool:
  """Whether rule `name` compares a task's samples (False for a name not in RULES)."""
  return name in RULES and RULES[name].groups


def of(config) -> Rule:
  """The rule a learner's config (GRPOConfig / PPOConfig) selects."""
  return RULES[config.rule]


def advantages(inputs: CreditInputs, config):
  """`of(config).fn(inputs, config)`: the advantages (PPO: and value targets)."""
  return of(config).fn(inputs, config)
