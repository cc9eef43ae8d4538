"""The learner table: `config.learner` -> how scored rows update the policy (a helper
module of the RL recipe, `rlpost.recipes.rl`).

Every learner has one signature:

  update(learner, state, batch, index) -> (state, metrics)

`batch` is the global device `RLBatch` of one iteration's rows (every process's,
`step.global_batch`) with `scores` set: each row's reward `[N]`, or per-token rewards
`[N, T]` (PPO's per-turn rewards). Advantages, whitening and group statistics are
computed here, on that global batch, so no learner knows which process sampled
which rows. `state` is the run's `TrainState`; `learner` is the static rest (settings,
frozen weights, reference weights, the jitted train step), made by the learner's
`build`. Adding a learner: a `settings` (ConfigDict -> frozen settings, errors naming
the field), a `build` and an `update`, and one LEARNERS entry.

  grpo: the GRPO family (the `algo` block: `objectives.GRPOConfig`; Dr.GRPO, DAPO,
    GSPO, RLOO, REINFORCE++ are its estimators and losses). G samples per task;
    group-relative advantages on the whole batch's scores -> reference / old logprobs ->
    passes (num_iterations) x mini-batches of the train step.
  ppo: PPO with a learned critic (the `algo` block: `objectives.PPOConfig`, the
    `critic` block). One sample per task; critic values and GAE (or GAE inside the
    single train step) -> epochs x mini-batches of the actor + critic train step.
"""

import dataclasses
import functools
import math
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlpost.models import critic as critic_lib
from rlpost.models import policy
from rlpost.recipes import common
from rlpost.rl import advantages as adv_lib
from rlpost.rl import batch as batch_lib
from rlpost.rl import objectives
from rlpost.rl import state_credit
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


class Learner(NamedTuple):
  """A built learner: `name` (its LEARNERS key), `settings` (its frozen settings),
  `frozen` (base params under LoRA or a LoRA critic's trunk, else None), `ref_params`
  (the reference policy, None when unused) and the jitted `train_step`."""

  name: str
  settings: Any
  frozen: Any
  ref_params: Any
  train_step: Any


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
  """algo: the `algo` block; forward: the trainer's forward; rows: one batch's rows;
  mini_batch_size: rows per optimizer step (algo.mini_batch_size or rows); seed: the
  mini-batch orders' (cfg.seed)."""

  algo: objectives.GRPOConfig
  forward: policy.ForwardConfig
  rows: int
  mini_batch_size: int
  seed: int = 0


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


@dataclasses.dataclass(frozen=True)
class PPOSettings:
  """A PPO learner's settings (`ppo_settings`).

  rows: one batch's rows (algo.num_generations per task); mini_batch_size: rows per optimizer
  step; gae_in_step: set by `build_ppo` (it depends on the mesh): the batch feeds a
  single optimizer step, so GAE runs in the loss on the step's own values.
  """

  algo: objectives.PPOConfig
  critic: critic_lib.CriticLayout
  critic_learning_rate: float
  forward: policy.ForwardConfig
  rows: int
  mini_batch_size: int
  micro_batch_size: int
  seed: int
  gae_in_step: bool = False
  head_learning_rate: float | None = None  # the value head's own rate (None: the critic's)
  value_norm_decay: float | None = None  # running return statistics' weight (None: off)


def updates_per_iteration(settings: GRPOSettings | PPOSettings) -> int:
  """Optimizer steps per batch: passes x mini-batches."""
  return settings.algo.num_iterations * (settings.rows // settings.mini_batch_size)


def _mini_batch_rows(cfg, algo, rows: int, tasks_field: str) -> int:
  """algo.mini_batch_size (None: `rows`), checked to divide the batch and the devices."""
  mini = algo.mini_batch_size or rows
  if rows % mini:
    common.fail(
      "algo.mini_batch_size",
      mini,
      f"{tasks_field} * algo.num_generations = {rows} rows are not divisible "
      f"by it; choose a divisor of {rows}, or None for the whole batch",
    )
  common.check_rows_per_device(cfg, mini, f"a mini-batch (algo.mini_batch_size or {tasks_field})")
  return mini


class LearnerSpec(NamedTuple):
  """One LEARNERS entry.

  settings(cfg, tasks_field) -> frozen settings, checked before anything loads
    (`tasks_field`: the `train` field counting one batch's tasks).
  build(cfg, params, settings) -> (Learner, fresh TrainState).
  update(learner, state, batch, index) -> (state, metrics) (module doc).
  samples_per_task(settings) -> rows sampled per task (G: algo.num_generations).
  policy_part: the key of `state.trainable` the sampler reads (None: all of it).
  groups: the learner compares the G samples of a task (so groups whose rewards tie
    carry no signal: what `rollout.dynamic_sampling` drops).
  """

  settings: Callable[[Any, str], Any]
  build: Callable[[Any, Any, Any], tuple[Learner, step_lib.TrainState]]
  update: Callable[[Learner, step_lib.TrainState, batch_lib.RLBatch, int], tuple]
  samples_per_task: Callable[[Any], int]
  policy_part: str | None
  groups: bool


def grpo_settings(cfg, tasks_field: str) -> GRPOSettings:
  """The `algo` block as GRPOConfig (old names refused with their new place), the forward
  settings, and the batch's rows split evenly over the trainer's devices."""
  algo = common.from_block(objectives.GRPOConfig, cfg.algo, "algo", RENAMED)
  tasks = cfg.train[tasks_field.split(".")[1]]
  if tasks < 1:
    common.fail(tasks_field, tasks, "must be >= 1")
  rows = tasks * algo.num_generations
  common.check_rows_per_device(cfg, rows, f"{tasks_field} * algo.num_generations")
  mini = _mini_batch_rows(cfg, algo, rows, tasks_field)
  forward = common.forward_config(cfg, cfg.sampling.temperature)
  return GRPOSettings(algo, forward, rows, mini, cfg.seed)


def grpo_optimizer(cfg, settings: GRPOSettings) -> optax.GradientTransformation:
  """The `train` block's optimizer, scheduled over the run's optimizer steps (train.steps
  x passes x mini-batches)."""
  return common.make_optimizer(cfg, cfg.train.steps * updates_per_iteration(settings))


def build_grpo(cfg, params, settings: GRPOSettings):
  """The GRPO learner over `params` and its fresh TrainState (adapters under LoRA, else a
  copy of the params when a reference is needed: updates are donated)."""
  algo, forward = settings.algo, settings.forward
  key = jax.random.key(cfg.seed)
  trainable, frozen = common.trainable_and_frozen(params, forward, key)
  if forward.lora:
    ref_params = params
  elif algo.beta > 0:  # updates are donated: train a copy, keep `params` as reference
    trainable, ref_params = jax.tree.map(jnp.copy, params), params
  else:
    ref_params = None
  optimizer = grpo_optimizer(cfg, settings)
  mesh = common.make_mesh(cfg)
  # Placed with the sharding train_step returns, so step 2 reuses step 1's compilation.
  state = step_lib.place(
    step_lib.init_train_state(trainable, optimizer, jax.random.fold_in(key, 1)), mesh
  )
  frozen = step_lib.place(frozen, mesh)
  ref_params = frozen if forward.lora else step_lib.place(ref_params, mesh)
  train_step = step_lib.make_train_step(
    objectives.make_grpo_loss_fn(algo, sharding.train_forward(forward, mesh)),
    optimizer,
    mesh,
    cfg.train.micro_batch_size,
  )
  host_memory.release_freed_memory()  # weight loading / initialization temporaries
  return Learner("grpo", settings, frozen, ref_params, train_step), state


_grpo_advantages = jax.jit(objectives.grpo_advantages, static_argnames="config")
_turn_grpo = jax.jit(adv_lib.turn_grpo, static_argnums=3)


@functools.partial(jax.jit, static_argnums=4)
def _state_grpo(scores_BxT, mask_BxT, turn_ids_BxT, tokens_BxS, G):
  """`state_credit.state_grpo` with each turn's state read from the completion slots
  (the last T of the `[N, S]` tokens)."""
  T = mask_BxT.shape[1]
  keys = state_credit.observation_keys(tokens_BxS[:, -T:], mask_BxT, turn_ids_BxT)
  return state_credit.state_grpo(scores_BxT, mask_BxT, turn_ids_BxT, keys, G)


_tied_groups = jax.jit(
  lambda scores_N, G: jnp.sum(adv_lib.zero_signal_groups(scores_N, G)), static_argnums=1
)


def grpo_update(learner: Learner, state, batch: batch_lib.RLBatch, index: int):
  """Group-relative advantages of `batch.scores` over the whole batch (the rows' returns
  [N], or with turn or state credit per-turn rewards [N, T]), reference and old logprobs
  as needed, then num_iterations passes of mini-batch train steps (`_train_passes`).
  Returns (state, metrics averaged over the steps, plus the first step's ratio and KL and
  `zero_signal_groups`, the share of groups whose G rewards tie, when G > 1)."""
  algo, forward = learner.settings.algo, learner.settings.forward
  G = algo.num_generations
  if algo.credit == "episode":
    advantages, returns = _grpo_advantages(batch.scores, algo), batch.scores
  else:  # scores: per-turn rewards [N, T]
    if algo.credit == "turn":
      advantages = _turn_grpo(batch.scores, batch.loss_mask, batch.turn_ids, G)
    else:
      advantages = _state_grpo(batch.scores, batch.loss_mask, batch.turn_ids, batch.tokens, G)
    returns = jnp.sum(jnp.where(batch.loss_mask > 0, batch.scores, 0.0), axis=1)
  tied = _tied_groups(returns, G) if G > 1 else None
  batch = dataclasses.replace(batch, advantages=advantages, scores=None)
  params, adapters = policy.policy_params(state.trainable, learner.frozen, forward)
  logprobs = lambda w, a: objectives.completion_logprobs_jit(w, a, batch, forward)
  if algo.beta > 0:
    batch = dataclasses.replace(batch, ref_logp=logprobs(learner.ref_params, None))
  if updates_per_iteration(learner.settings) > 1:
    batch = dataclasses.replace(batch, old_logp=logprobs(params, adapters))
  state, passes = _train_passes(learner, state, batch, index)
  metrics = {k: np.mean([m[k] for m in passes]) for k in passes[0]}
  for name in ("ratio_mean", "kl", "sampler_logp_gap", "sampler_logp_gap_mean"):
    if name in passes[0]:
      metrics[f"{name}/first_pass"] = passes[0][name]
  if tied is not None:  # the share of groups, as NumPy's mean of bools gives it
    metrics["zero_signal_groups"] = int(tied) / (batch.tokens.shape[0] // G)
  return state, metrics


def ppo_settings(cfg, tasks_field: str) -> PPOSettings:
  """The `algo`, `critic`, `train` and forward settings of a PPO learner whose batch has
  `cfg.train[tasks_field] * algo.num_generations` rows."""
  algo = common.from_block(objectives.PPOConfig, cfg.algo, "algo")
  critic_cfg = common.from_block(CriticConfig, cfg.critic, "critic")
  t = cfg.train
  tasks = t[tasks_field.split(".")[1]]
  if tasks < 1:
    common.fail(tasks_field, tasks, "must be >= 1")
  rows = tasks * algo.num_generations
  mini = _mini_batch_rows(cfg, algo, rows, tasks_field)
  if algo.critic_warmup_steps >= t.steps:
    common.fail(
      "algo.critic_warmup_steps",
      algo.critic_warmup_steps,
      f"must be < train.steps={t.steps} (the actor trains only after the warm-up)",
    )
  mode = critic_cfg.mode or ("lora" if cfg.lora.enabled else "full")
  critic_lr = critic_cfg.learning_rate
  if critic_lr is None:  # train.learning_rate is checked finite and > 0 with the optimizer
    critic_lr = 10 * t.learning_rate
  layout = critic_lib.CriticLayout(
    mode,
    common.lora_config(cfg, always=True) if mode == "lora" else None,
    normalize=critic_cfg.value_norm_decay is not None,
  )
  return PPOSettings(
    algo=algo,
    critic=layout,
    critic_learning_rate=critic_lr,
    forward=common.forward_config(cfg, cfg.sampling.temperature),
    rows=rows,
    mini_batch_size=mini,
    micro_batch_size=t.micro_batch_size,
    seed=cfg.seed,
    head_learning_rate=critic_cfg.head_learning_rate,
    value_norm_decay=critic_cfg.value_norm_decay,
  )


def ppo_optimizer(cfg, settings: PPOSettings) -> optax.GradientTransformation:
  """One optax tree: the actor's AdamW gated on `actor_on`, the critic's at its own rate.

  Each part is clipped to train.max_grad_norm on its own and scheduled over its
  own optimizer steps (the actor's start after the critic warm-up). With
  `head_learning_rate` the value head is a third part, at that rate.
  """
  per_iter = updates_per_iteration(settings)
  total = cfg.train.steps * per_iter
  actor = common.make_optimizer(cfg, total - settings.algo.critic_warmup_steps * per_iter)
  critic = common.make_optimizer(cfg, total, learning_rate=settings.critic_learning_rate)
  parts = {"actor": step_lib.gated(actor, "actor_on"), "critic": critic}
  if settings.head_learning_rate is not None:
    parts["head"] = common.make_optimizer(cfg, total, learning_rate=settings.head_learning_rate)
  if settings.critic.normalize:
    parts["stats"] = optax.set_to_zero()  # moved by `with_return_stats` only
  if len(parts) == 2:
    return optax.multi_transform(parts, {"actor": "actor", "critic": "critic"})

  def labels(trainable):  # the critic's head and statistics apart from its trunk
    return {
      "actor": "actor",
      "critic": {k: k if k in parts else "critic" for k in trainable["critic"]},
    }

  return optax.multi_transform(parts, labels)


def build_ppo(cfg, params, settings: PPOSettings):
  """The PPO learner over `params` (settings with `gae_in_step`) and its fresh TrainState
  (trainable = {"actor": ..., "critic": ...}; one optax tree updates both, the actor's
  part gated on `actor_on`, False during the critic warm-up: a traced bool, no
  recompilation)."""
  fwd, algo = settings.forward, settings.algo
  key = jax.random.key(cfg.seed)
  actor, frozen = common.trainable_and_frozen(params, fwd, key)
  if not fwd.lora and (algo.beta > 0 or settings.critic.mode == "lora"):
    actor, frozen = jax.tree.map(jnp.copy, params), params  # updates are donated: train a copy
  critic = critic_lib.init_critic(jax.random.fold_in(key, 2), params, settings.critic)
  optimizer = ppo_optimizer(cfg, settings)
  mesh = common.make_mesh(cfg)
  one_call = mesh.size == 1 and settings.micro_batch_size >= settings.rows
  settings = dataclasses.replace(
    settings,
    gae_in_step=algo.num_iterations == 1
    and settings.mini_batch_size == settings.rows
    and (one_call or not algo.whiten_advantages),
  )
  trainable = {"actor": actor, "critic": critic}
  state = step_lib.place(
    step_lib.init_train_state(trainable, optimizer, jax.random.fold_in(key, 1)), mesh
  )
  loss_fn = objectives.make_ppo_loss_fn(algo, sharding.train_forward(fwd, mesh), settings.critic)
  train_step = step_lib.make_train_step(
    loss_fn, optimizer, mesh, settings.micro_batch_size, grad_norm_parts=("actor", "critic")
  )
  host_memory.release_freed_memory()
  frozen = step_lib.place(frozen, mesh)
  return Learner("ppo", settings, frozen, None, train_step), state


def ppo_update(learner: Learner, state, batch: batch_lib.RLBatch, index: int):
  """The critic pass and GAE (or GAE in the step), then epochs of mini-batch train steps.

  `batch.scores`: the rows' rewards [N], placed on each row's last loss token, or
  per-token rewards [N, T] (e.g. per-turn). Returns (state, metrics with value
  statistics, pass means, first-pass ratio / KL, actor_on, time/forward_s).
  """
  settings = learner.settings
  algo = settings.algo
  start = time.perf_counter()
  batch, moments = score_tokens(learner, state, batch)
  jax.block_until_ready(batch)  # honest phase times (the train step would wait anyway)
  forward_s = time.perf_counter() - start
  actor_on = index >= algo.critic_warmup_steps
  opt_args = {"actor_on": jnp.asarray(actor_on)}
  state, passes = _train_passes(learner, state, batch, index, opt_args)
  if moments is None:  # GAE ran in the (single) train step
    moments = {k: passes[0].pop(k) for k in list(passes[0]) if k.startswith("moments/")}
  metrics = objectives.value_stats(moments)
  metrics.update({k: np.mean([m[k] for m in passes]) for k in passes[0]})
  for name in ("ratio_mean", "approx_kl", "kl", "sampler_logp_gap", "sampler_logp_gap_mean"):
    if name in passes[0]:
      metrics[f"{name}/first_pass"] = passes[0][name]
  metrics["actor_on"] = float(actor_on)
  metrics["time/forward_s"] = forward_s
  if settings.value_norm_decay is not None:  # after the batch's updates, as PopArt
    critic = critic_lib.with_return_stats(
      state.trainable["critic"],
      np.float32(metrics["returns/mean"]),
      np.float32(metrics["returns/std"]),
      np.float32(settings.value_norm_decay),
    )
    state = state._replace(trainable={**state.trainable, "critic": critic})
    mean, std = jax.device_get(critic_lib.return_stats(critic))
    metrics.update({"value_norm/mean": float(mean), "value_norm/std": float(std)})
  return state, metrics


def _train_passes(learner: Learner, state, batch: batch_lib.RLBatch, index: int, *step_args):
  """algo.num_iterations passes over `batch`, each in mini-batches of
  `settings.mini_batch_size` rows taken in a fresh order per (seed, index, pass) (the
  batch as it is when it is one mini-batch). Returns (state, each step's metrics on host)."""
  settings = learner.settings
  rows, mini = settings.rows, settings.mini_batch_size
  passes = []
  for epoch in range(settings.algo.num_iterations):
    order = np.arange(rows)
    if mini < rows:  # a fresh, reproducible order per (iteration, epoch)
      order = np.random.default_rng([settings.seed, index, epoch]).permutation(rows)
    for first in range(0, rows, mini):
      step_batch = batch if mini == rows else _select_rows(batch, order[first : first + mini])
      state, m = learner.train_step(state, learner.frozen, step_batch, *step_args)
      if passes:  # at most two steps in flight (see `_select_rows`)
        jax.block_until_ready(passes[-1])
      passes.append(m)
  return state, jax.device_get(passes)


# A mini-batch's rows in one program, not one eager gather per field and primitive. With
# several CPU devices per process (and across processes) dozens of small programs queued at
# once could exhaust a device's in-flight slots, which later programs, launched out of
# order, hold while waiting on an earlier one: a deadlock (seen on 2 processes x 2 devices).
_select_rows = jax.jit(batch_lib.select_rows)
_ppo_advantages = jax.jit(objectives.ppo_advantages, static_argnames="config")
_moments = jax.jit(objectives.value_moments)


def score_tokens(learner: Learner, state, batch: batch_lib.RLBatch):
  """Fills the batch for PPO's train steps. Returns (batch, value moments or None).

  Always `ref_logp` (beta > 0). Unless `gae_in_step`: also the rollout `values` (and
  `old_logp` when the batch is used more than once), `token_rewards`, `advantages`,
  `returns`, and the batch's `objectives.value_moments`; with `gae_in_step` the train
  step computes those from `scores`.
  """
  settings = learner.settings
  algo = settings.algo
  if algo.beta > 0:
    ref_logp = objectives.completion_logprobs_jit(learner.frozen, None, batch, settings.forward)
    batch = dataclasses.replace(batch, ref_logp=ref_logp)
  if settings.gae_in_step:
    return batch, None
  with_old = updates_per_iteration(settings) > 1
  old_logp, values = objectives.ppo_rollout_forward(
    state.trainable, learner.frozen, batch, settings.forward, settings.critic, with_old
  )
  # The KL reward uses the logprobs of the policy that sampled (the sampler's own when
  # no separate old-policy pass runs: they agree to float32 rounding).
  logp = batch.sampler_logp if old_logp is None else old_logp
  advantages, returns, token_rewards = _ppo_advantages(
    batch.scores, values, logp, batch.ref_logp, batch.loss_mask, algo, batch.turn_ids
  )
  batch = dataclasses.replace(
    batch,
    old_logp=old_logp,
    values=values,
    returns=returns,
    advantages=advantages,
    token_rewards=token_rewards,
  )
  return batch, jax.device_get(_moments(values, returns, advantages, batch.loss_mask))


LEARNERS: dict[str, LearnerSpec] = {
  "grpo": LearnerSpec(
    grpo_settings,
    build_grpo,
    grpo_update,
    lambda s: s.algo.num_generations,
    policy_part=None,
    groups=True,
  ),
  "ppo": LearnerSpec(
    ppo_settings,
    build_ppo,
    ppo_update,
    lambda s: s.algo.num_generations,
    policy_part="actor",
    groups=False,
  ),
}


def policy_of(part: str | None, trainable):
  """The policy's weights in a learner's trainable tree (`LearnerSpec.policy_part`): the
  whole tree (None) or its `part` entry (PPO: "actor"; the critic beside it)."""
  return trainable if part is None else trainable[part]


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
