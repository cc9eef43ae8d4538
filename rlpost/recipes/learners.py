"""The learner table: `config.learner` -> how a learner's settings are read, its arrays
placed and its optimizer built (a helper module of the RL recipe, `rlpost.recipes.rl`).
The updates themselves are pure functions in `rlpost.rl` (`rl/learner.py` says what they
share): `grpo_update.grpo_update`, `ppo_update.ppo_update`.

Adding a learner: its settings dataclass and `update(learner, state, batch, index) ->
(state, metrics)` in a module of `rlpost/rl/`; here a `settings` (an `rl_config.RLConfig`
-> frozen settings; the config's checks are `rl_config`'s), a `build` (arrays placed, optimizer, jitted train
step) and one LEARNERS entry. Every learner's `state.trainable` is a dict with the
policy's weights (adapters or params) under "policy" (PPO: its critic under "critic"):
what the sampler, the evaluation and `model.init_from` read.

  grpo: the GRPO family (the `algo` block: `objectives.GRPOConfig`).
  ppo: PPO with a learned critic (the `algo` block: `objectives.PPOConfig`, the
    `critic` block: `CriticConfig`).
"""

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from rlpost.models import critic as critic_lib
from rlpost.recipes import common
from rlpost.rl import batch as batch_lib
from rlpost.rl import objectives
from rlpost.rl import grpo_update as grpo_lib
from rlpost.rl import learner as learner_lib
from rlpost.rl import ppo_update as ppo_lib
from rlpost.train import host_memory
from rlpost.train import sharding
from rlpost.train import step as step_lib

# Old config fields -> where they live now (an old name fails with this pointer).
RENAMED = {
  "algo.name": "name",
  "algo.advantage": "algo.advantage_estimator",
  "algo.kl": "algo.kl_method",
  "algo.aggregation": "algo.loss_agg_mode",
  "algo.importance": "algo.policy_loss ('gspo' for sequence-level importance)",
  "algo.dynamic_sampling": "rollout.dynamic_sampling",
  "algo.max_resample_rounds": "rollout.max_resample_rounds",
  "algo.overlong_buffer": "rollout.overlong_buffer",
  "algo.overlong_penalty": "rollout.overlong_penalty",
}


@dataclasses.dataclass(frozen=True)
class CriticConfig:
  """The `critic` block.

  mode: one of critic.MODES; None: 'lora' with a LoRA actor, else 'full'.
  learning_rate: the critic's peak learning rate; None: 10x train.learning_rate.
  head_learning_rate: the value head's own peak learning rate (its own AdamW, clipped
    on its own); None: the head trains with the rest of the critic at learning_rate.
  value_norm_decay: None: values in return units. d in (0, 1]: values normalised with
    running return statistics (`critic.with_return_stats`, PopArt-style), each batch's
    entering them with weight d (the first batch's alone).
  """

  mode: str | None = None
  learning_rate: float | None = None
  head_learning_rate: float | None = None
  value_norm_decay: float | None = None

  def __post_init__(self):
    if self.mode is not None and self.mode not in critic_lib.MODES:
      raise ValueError(f"CriticConfig.mode={self.mode!r}: use one of {', '.join(critic_lib.MODES)}")
    for name, none in (
      ("learning_rate", "10x train.learning_rate"),
      ("head_learning_rate", "the critic's learning_rate"),
    ):
      rate = getattr(self, name)
      if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(
          f"CriticConfig.{name}={rate!r}: must be a finite number > 0 (None: {none})"
        )
    decay = self.value_norm_decay
    if decay is not None and not 0 < decay <= 1:
      raise ValueError(
        f"CriticConfig.value_norm_decay={decay!r}: must be in (0, 1] (the weight of each "
        "batch's return statistics; None: values not normalised)"
      )


class LearnerSpec(NamedTuple):
  """One LEARNERS entry.

  algo_config: the `algo` block's dataclass (`rl.objectives`).
  settings(config) -> frozen settings of an `rl_config.RLConfig` (its blocks already
    checked, with the rules between them).
  build(config, params, settings) -> (`rl.learner.Learner`, fresh TrainState).
  update(learner, state, batch, index) -> (state, metrics) (`rlpost.rl.learner`).
  samples_per_task(settings) -> rows sampled per task (G: algo.num_generations).
  groups: the learner compares the G samples of a task (so groups whose rewards tie
    carry no signal: what `rollout.dynamic_sampling` drops).
  """

  algo_config: type
  settings: Callable[[Any], Any]
  build: Callable[[Any, Any, Any], tuple[learner_lib.Learner, step_lib.TrainState]]
  update: Callable[[learner_lib.Learner, step_lib.TrainState, batch_lib.RLBatch, int], tuple]
  samples_per_task: Callable[[Any], int]
  groups: bool


def grpo_settings(c) -> grpo_lib.GRPOSettings:
  """A GRPO learner's settings: the `algo` block, the forward settings, the batch's rows
  and mini-batch rows (`c`: an RLConfig, its rules checked)."""
  rows = c.train.batch_tasks * c.algo.num_generations
  forward = common.forward_config(c, c.sampling.temperature)
  return grpo_lib.GRPOSettings(c.algo, forward, rows, c.algo.mini_batch_size or rows, c.seed)


def grpo_optimizer(c, settings: grpo_lib.GRPOSettings) -> optax.GradientTransformation:
  """The `train` block's optimizer, scheduled over the run's optimizer steps (train.steps
  x passes x mini-batches)."""
  return common.make_optimizer(c, c.train.steps * learner_lib.updates_per_iteration(settings))


def build_grpo(c, params, settings: grpo_lib.GRPOSettings):
  """The GRPO learner over `params` and its fresh TrainState (trainable = {"policy": ...}:
  adapters under LoRA, else the params, a copy when a reference is needed: updates are
  donated)."""
  algo, forward = settings.algo, settings.forward
  key = jax.random.key(c.seed)
  trainable, frozen = common.trainable_and_frozen(params, forward, key)
  if forward.lora:
    ref_params = params
  elif algo.beta > 0:  # updates are donated: train a copy, keep `params` as reference
    trainable, ref_params = jax.tree.map(jnp.copy, params), params
  else:
    ref_params = None
  optimizer = grpo_optimizer(c, settings)
  mesh = common.make_mesh(c)
  # Placed with the sharding train_step returns, so step 2 reuses step 1's compilation.
  state = step_lib.place(
    step_lib.init_train_state({"policy": trainable}, optimizer, jax.random.fold_in(key, 1)), mesh
  )
  frozen = step_lib.place(frozen, mesh)
  ref_params = frozen if forward.lora else step_lib.place(ref_params, mesh)
  train_step = step_lib.make_train_step(
    objectives.make_grpo_loss_fn(algo, sharding.train_forward(forward, mesh)),
    optimizer,
    mesh,
    c.train.micro_batch_size,
  )
  host_memory.release_freed_memory()  # weight loading / initialization temporaries
  return learner_lib.Learner("grpo", settings, frozen, ref_params, train_step), state


def ppo_settings(c) -> ppo_lib.PPOSettings:
  """A PPO learner's settings: the `algo` and `critic` blocks (the critic's layout and
  rate), the forward settings, rows and mini-batch rows (`c`: an RLConfig)."""
  algo, critic_cfg, t = c.algo, c.critic, c.train
  rows = t.batch_tasks * algo.num_generations
  mode = critic_cfg.mode or ("lora" if c.lora.enabled else "full")
  critic_lr = critic_cfg.learning_rate
  if critic_lr is None:  # train.learning_rate is checked finite and > 0 with the optimizer
    critic_lr = 10 * t.learning_rate
  layout = critic_lib.CriticLayout(
    mode,
    common.lora_config(c, always=True) if mode == "lora" else None,
    normalize=critic_cfg.value_norm_decay is not None,
  )
  return ppo_lib.PPOSettings(
    algo=algo,
    critic=layout,
    critic_learning_rate=critic_lr,
    forward=common.forward_config(c, c.sampling.temperature),
    rows=rows,
    mini_batch_size=algo.mini_batch_size or rows,
    micro_batch_size=t.micro_batch_size,
    seed=c.seed,
    head_learning_rate=critic_cfg.head_learning_rate,
    value_norm_decay=critic_cfg.value_norm_decay,
  )


def ppo_optimizer(c, settings: ppo_lib.PPOSettings) -> optax.GradientTransformation:
  """One optax tree over {"policy", "critic"}: the policy's AdamW gated on `actor_on`, the
  critic's at its own rate.

  Each part is clipped to train.max_grad_norm on its own and scheduled over its
  own optimizer steps (the actor's start after the critic warm-up). With
  `head_learning_rate` the value head is a third part, at that rate.
  """
  per_iter = learner_lib.updates_per_iteration(settings)
  total = c.train.steps * per_iter
  actor = common.make_optimizer(c, total - settings.algo.critic_warmup_steps * per_iter)
  critic = common.make_optimizer(c, total, learning_rate=settings.critic_learning_rate)
  parts = {"policy": step_lib.gated(actor, "actor_on"), "critic": critic}
  if settings.head_learning_rate is not None:
    parts["head"] = common.make_optimizer(c, total, learning_rate=settings.head_learning_rate)
  if settings.critic.normalize:
    parts["stats"] = optax.set_to_zero()  # moved by `with_return_stats` only
  if len(parts) == 2:
    return optax.multi_transform(parts, {"policy": "policy", "critic": "critic"})

  def labels(trainable):  # the critic's head and statistics apart from its trunk
    return {
      "policy": "policy",
      "critic": {k: k if k in parts else "critic" for k in trainable["critic"]},
    }

  return optax.multi_transform(parts, labels)


# PPO's gradient-norm metrics: (name in `grad_norm/NAME`, trainable key); the global norm
# sums the policy's part first, as it did when the key was "actor" (the same bits).
GRAD_NORM_PARTS = (("actor", "policy"), ("critic", "critic"))


def build_ppo(c, params, settings: ppo_lib.PPOSettings):
  """The PPO learner over `params` (settings with `gae_in_step`) and its fresh TrainState
  (trainable = {"policy": ..., "critic": ...}; one optax tree updates both, the policy's
  part gated on `actor_on`, False during the critic warm-up: a traced bool, no
  recompilation)."""
  fwd, algo = settings.forward, settings.algo
  key = jax.random.key(c.seed)
  actor, frozen = common.trainable_and_frozen(params, fwd, key)
  if not fwd.lora and (algo.beta > 0 or settings.critic.mode == "lora"):
    actor, frozen = jax.tree.map(jnp.copy, params), params  # updates are donated: train a copy
  critic = critic_lib.init_critic(jax.random.fold_in(key, 2), params, settings.critic)
  optimizer = ppo_optimizer(c, settings)
  mesh = common.make_mesh(c)
  one_call = mesh.size == 1 and settings.micro_batch_size >= settings.rows
  settings = dataclasses.replace(
    settings,
    gae_in_step=algo.num_iterations == 1
    and settings.mini_batch_size == settings.rows
    and (one_call or not algo.whiten_advantages),
  )
  trainable = {"policy": actor, "critic": critic}
  state = step_lib.place(
    step_lib.init_train_state(trainable, optimizer, jax.random.fold_in(key, 1)), mesh
  )
  loss_fn = objectives.make_ppo_loss_fn(algo, sharding.train_forward(fwd, mesh), settings.critic)
  train_step = step_lib.make_train_step(
    loss_fn, optimizer, mesh, settings.micro_batch_size, grad_norm_parts=GRAD_NORM_PARTS
  )
  host_memory.release_freed_memory()
  frozen = step_lib.place(frozen, mesh)
  return learner_lib.Learner("ppo", settings, frozen, None, train_step), state


LEARNERS: dict[str, LearnerSpec] = {
  "grpo": LearnerSpec(
    objectives.GRPOConfig,
    grpo_settings,
    build_grpo,
    grpo_lib.grpo_update,
    lambda s: s.algo.num_generations,
    groups=True,
  ),
  "ppo": LearnerSpec(
    objectives.PPOConfig,
    ppo_settings,
    build_ppo,
    ppo_lib.ppo_update,
    lambda s: s.algo.num_generations,
    groups=False,
  ),
}


def name_of(cfg, default: str | None = None) -> str:
  """The learner a ConfigDict selects: `config.learner`; else `default` (an entry point's);
  else "ppo" for a config with a `critic` block, "grpo" otherwise."""
  if "learner" in cfg:
    return cfg.learner
  return default or ("ppo" if "critic" in cfg else "grpo")


def spec(name: str) -> LearnerSpec:
  """The LEARNERS entry `name`; an unknown name is a ConfigError naming `config.learner`."""
  if name not in LEARNERS:
    common.fail("learner", name, f"use one of {tuple(LEARNERS)}")
  return LEARNERS[name]
