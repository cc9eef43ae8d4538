"""PPO with a learned critic, from a ConfigDict (configs/ppo_gsm8k.py).

Reads top to bottom: `check_config`, `build` (model, actor + critic state, one
optimizer tree, train step), `run` (the shared run loop), `iteration`. One
iteration:

  prompts -> one completion each -> rewards (host) -> RLBatch
  -> ref logprobs (beta > 0) -> one no-gradient pass: critic values [+ old logprobs]
  -> token rewards (score on the last loss token, -beta * KL per token when
     kl_in_reward) -> GAE: advantages (gae_lambda), value targets (critic_lambda)
  -> num_iterations epochs x mini-batches of train_step(state, frozen, mini_batch, actor_on)

When the batch feeds a single optimizer step (`Setup.gae_in_step`: one epoch,
one mini-batch, and whitening, if on, sees the whole batch in one loss call),
the no-gradient pass is skipped: the critic has not moved since the rollout, so
the train step's own values are the rollout values, and GAE runs in the loss.

`state.trainable = {"actor": ..., "critic": ...}` and one optax tree updates
both (`optax.multi_transform`, each part clipped and scheduled on its own); the
actor's part is `step.gated` on `actor_on`, False during the first
`critic_warmup_steps` iterations, so the switch is a traced bool: no recompilation.
"""

import dataclasses
import math
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlpost.data import tasks
from rlpost.data.cursor import Cursor, next_indices
from rlpost.models import critic as critic_lib
from rlpost.models import policy
from rlpost.recipes import common, rollout
from rlpost.rl import batch as batch_lib
from rlpost.rl import objectives
from rlpost.train import host_memory
from rlpost.train import loop as loop_lib
from rlpost.train import shares
from rlpost.train import sharding
from rlpost.train import step as step_lib


@dataclasses.dataclass(frozen=True)
class CriticConfig:
  """The `critic` block.

  mode: one of critic.MODES; None: 'lora' with a LoRA actor, else 'full'.
  learning_rate: the critic's peak learning rate; None: 10x train.learning_rate.
  """

  mode: str | None = None
  learning_rate: float | None = None


@dataclasses.dataclass(frozen=True)
class Setup:
  """Static pieces of a PPO run, resolved once from the ConfigDict."""

  algo: objectives.PPOConfig
  critic: critic_lib.CriticLayout
  critic_learning_rate: float
  rollout: rollout.RolloutConfig
  forward: policy.ForwardConfig
  sampling: Any  # sampling.SamplingConfig
  batch_prompts: int
  mini_batch_size: int
  micro_batch_size: int
  template: str
  shuffle: bool
  seed: int
  gae_in_step: bool = False  # set by `build` (it depends on the mesh); see the module doc

  @property
  def updates_per_iteration(self) -> int:
    return self.algo.num_iterations * (self.batch_prompts // self.mini_batch_size)


class Pieces(NamedTuple):
  """Everything a PPO run is built from (see `build`)."""

  setup: Setup
  tokenizer: Any
  task: tasks.Task
  state: step_lib.TrainState  # trainable = {"actor": ..., "critic": ...}
  frozen: Any  # base params: LoRA actor's base, lora critic's trunk, the reference; or None
  train_step: Any
  sampler: rollout.Sampler  # where rollouts run


def check_config(cfg) -> Setup:
  """Validates the ConfigDict before anything is loaded (Setup without `sampling`)."""
  rollout_cfg = common.from_block(rollout.RolloutConfig, cfg.rollout, "rollout")
  if rollout_cfg.dynamic_sampling:
    common.fail(
      "rollout.dynamic_sampling",
      True,
      "PPO samples one completion per prompt and its critic gives every sample a "
      "baseline: there are no tied groups to drop; use False",
    )
  setup = learner_setup(cfg, cfg.train.batch_prompts, "train.batch_prompts")
  rollout.check_off_policy(cfg, rollout_cfg.max_staleness, setup.algo.tis_cap)
  rollout.check_settings(
    cfg,
    rollout_cfg,
    setup.mini_batch_size,
    "algo.mini_batch_size (None: train.batch_prompts)",
    "the trainer's logprobs divide the logits by the temperature",
  )
  return dataclasses.replace(
    setup, rollout=rollout_cfg, template=cfg.data.template, shuffle=cfg.data.shuffle
  )


def learner_setup(cfg, rows: int, rows_text: str) -> Setup:
  """The `algo`, `critic`, `train` and forward settings of a PPO learner of `rows` rows
  per iteration (`rows_text` says which config fields give them)."""
  algo = common.from_block(objectives.PPOConfig, cfg.algo, "algo")
  critic_cfg = common.from_block(CriticConfig, cfg.critic, "critic")
  t = cfg.train
  if rows < 1:
    common.fail(rows_text.split(" ")[0], rows, "must be >= 1")
  mini = algo.mini_batch_size or rows
  if rows % mini:
    common.fail(
      "algo.mini_batch_size",
      mini,
      f"{rows_text} = {rows} rows (one completion per prompt) are not divisible "
      f"by it; choose a divisor of {rows}, or None for the whole batch",
    )
  common.check_rows_per_device(cfg, mini, f"a mini-batch (algo.mini_batch_size or {rows_text})")
  if algo.critic_warmup_steps >= t.steps:
    common.fail(
      "algo.critic_warmup_steps",
      algo.critic_warmup_steps,
      f"must be < train.steps={t.steps} (the actor trains only after the warm-up)",
    )
  mode = critic_cfg.mode
  if mode is None:
    mode = "lora" if cfg.lora.enabled else "full"
  if mode not in critic_lib.MODES:
    common.fail("critic.mode", mode, f"use one of {', '.join(critic_lib.MODES)}")
  critic_lr = critic_cfg.learning_rate
  if critic_lr is None:
    critic_lr = 10 * t.learning_rate
  if not (math.isfinite(critic_lr) and critic_lr > 0):
    common.fail(
      "critic.learning_rate",
      critic_lr,
      "must be a finite number > 0 (None: 10x train.learning_rate)",
    )
  layout = critic_lib.CriticLayout(
    mode, common.lora_config(cfg, always=True) if mode == "lora" else None
  )
  return Setup(
    algo=algo,
    critic=layout,
    critic_learning_rate=critic_lr,
    rollout=rollout.RolloutConfig(),
    forward=common.forward_config(cfg, cfg.sampling.temperature),
    sampling=None,
    batch_prompts=rows,
    mini_batch_size=mini,
    micro_batch_size=t.micro_batch_size,
    template="",
    shuffle=False,
    seed=cfg.seed,
  )


def make_optimizer(cfg, setup: Setup) -> optax.GradientTransformation:
  """One optax tree: the actor's AdamW gated on `actor_on`, the critic's at its own rate.

  Each part is clipped to train.max_grad_norm on its own and scheduled over its
  own optimizer steps (the actor's start after the critic warm-up).
  """
  per_iter = setup.updates_per_iteration
  total = cfg.train.steps * per_iter
  actor = common.make_optimizer(cfg, total - setup.algo.critic_warmup_steps * per_iter)
  critic = common.make_optimizer(cfg, total, learning_rate=setup.critic_learning_rate)
  return optax.multi_transform(
    {"actor": step_lib.gated(actor, "actor_on"), "critic": critic},
    {"actor": "actor", "critic": "critic"},
  )


def build(cfg, loaded=None) -> Pieces:
  """Loads the model (or takes `loaded` = (config, params, tokenizer)) and builds the run."""
  setup = check_config(cfg)
  _, params, tokenizer = loaded or common.load_model(cfg)
  setup = dataclasses.replace(setup, sampling=rollout.sampling_config(cfg, tokenizer))
  task = tasks.load_task(cfg.data, "train", cfg.seed)
  setup, state, frozen, train_step = build_learner(cfg, params, setup)
  sampler = rollout.make_sampler(cfg, frozen, setup.forward)
  return Pieces(setup, tokenizer, task, state, frozen, train_step, sampler)


def build_learner(cfg, params, setup: Setup):
  """(setup with `gae_in_step`, state {actor, critic}, frozen, train_step) over `params`."""
  fwd, algo = setup.forward, setup.algo
  key = jax.random.key(cfg.seed)
  actor, frozen = common.trainable_and_frozen(params, fwd, key)
  if not fwd.lora and (algo.beta > 0 or setup.critic.mode == "lora"):
    actor, frozen = jax.tree.map(jnp.copy, params), params  # updates are donated: train a copy
  critic = critic_lib.init_critic(jax.random.fold_in(key, 2), params, setup.critic)
  optimizer = make_optimizer(cfg, setup)
  mesh = common.make_mesh(cfg)
  one_call = mesh.size == 1 and setup.micro_batch_size >= setup.batch_prompts
  setup = dataclasses.replace(
    setup,
    gae_in_step=algo.num_iterations == 1
    and setup.mini_batch_size == setup.batch_prompts
    and (one_call or not algo.whiten_advantages),
  )
  trainable = {"actor": actor, "critic": critic}
  state = step_lib.place(
    step_lib.init_train_state(trainable, optimizer, jax.random.fold_in(key, 1)), mesh
  )
  loss_fn = objectives.make_ppo_loss_fn(algo, sharding.train_forward(fwd, mesh), setup.critic)
  train_step = step_lib.make_train_step(
    loss_fn, optimizer, mesh, setup.micro_batch_size, grad_norm_parts=("actor", "critic")
  )
  host_memory.release_freed_memory()
  return setup, state, step_lib.place(frozen, mesh), train_step


def run(cfg, workdir: str, stop_after: int | None = None, loaded=None):
  """Trains until cfg.train.steps iterations are done (or `stop_after` in this call).

  Resumes from the newest checkpoint in `workdir` (actor, critic and both
  optimizer states). Returns the final TrainState.
  """
  cfg = common.with_compute_dtype(cfg, workdir)
  cfg = common.with_int8_paths(cfg, workdir)
  p = build(cfg, loaded)
  loop = loop_lib.loop_config(
    cfg,
    f"ppo[{cfg.name}]",
    ("reward/mean", "answer_accuracy", "explained_variance", "vf_loss"),
    ("reward/mean", "explained_variance"),
  )
  s = p.setup.rollout.max_staleness
  step_fn, close, carry = rollout.loop_step(p, produce, train, "actor", s, cfg.train.steps)
  try:
    state, _ = loop_lib.run_loop(
      workdir, cfg, p.state, step_fn, loop, stop_after=stop_after, carry=carry
    )
  finally:
    close()
  return state


_advantages = jax.jit(objectives.ppo_advantages, static_argnames="config")


def iteration(p: Pieces, state, cursor: Cursor, index: int):
  """One synchronous PPO iteration (rollout, critic pass, GAE, epochs of mini-batch updates)."""
  step = rollout.loop_step(p, produce, train, "actor", None, index + 1)[0]
  return step(state, cursor, index)


def produce(p: Pieces, weights, cursor: Cursor, index: int):
  """Iteration `index`'s completions, one per prompt, sampled and scored with `weights`
  ((params, base key) on the sampler's devices). Returns ((groups, metrics, seconds), cursor)."""
  setup, start = p.setup, time.perf_counter()
  params_s, key = weights
  idx, cursor = next_indices(
    cursor, len(p.task.problems), setup.batch_prompts, shuffle=setup.shuffle
  )
  mine = shares.block(setup.batch_prompts, "train.batch_prompts")
  problems = [p.task.problems[i] for i in idx[mine]]
  key = jax.random.fold_in(key, index)
  groups, errors = rollout.sample_groups(p, params_s, problems, key, 1, mine.start)
  del params_s, weights
  host_memory.release_freed_memory()  # the sampler's weight copies, before the train step
  metrics = {f"reward/{name}/errors": shares.sum_over_processes(n) for name, n in errors.items()}
  return (groups, metrics, time.perf_counter() - start), cursor


def train(p: Pieces, state, sampled, index: int, version: int, publish=None):
  """The critic pass, GAE and updates on `produce`'s rows (sampled by policy `version`;
  TIS corrects an older one). Returns (state, publish(new state) or None, metrics)."""
  groups, metrics, rollout_s = sampled
  setup, start = p.setup, time.perf_counter()
  metrics = {**metrics, **rollout.metrics(groups, 1, p.task.accuracy_fns)}
  mesh = sharding.mesh_of(state)
  batch = batch_lib.concatenate([g["batch"] for g in groups], setup.sampling.pad_id)
  batch = dataclasses.replace(batch, scores=np.concatenate([g["rewards"] for g in groups]))
  batch = batch_lib.to_device(step_lib.global_batch(batch, mesh))
  state, update_metrics = update(p, state, batch, batch.scores, index)
  metrics.update(update_metrics)
  weights = publish(state) if publish else None
  elapsed = time.perf_counter() - start
  metrics["time/rollout_s"] = rollout_s
  metrics["time/train_s"] = elapsed - metrics["time/forward_s"]
  metrics["tokens_per_s"] = float(batch.loss_mask.sum()) / (rollout_s + elapsed)
  return state, weights, metrics


def update(p, state, batch, scores_N, index: int):
  """The critic pass and GAE (or GAE in the step), then epochs of mini-batch train steps.

  `p` has setup (algo, forward, critic, batch_prompts rows, mini_batch_size,
  seed, gae_in_step), frozen and train_step; `scores_N` are the rows' rewards
  [N], placed on each row's last loss token, or per-token rewards [N, T] (e.g.
  per-turn). Returns (state, metrics with value statistics, pass means,
  first-pass ratio / KL, actor_on, time/forward_s).
  """
  setup, algo = p.setup, p.setup.algo
  start = time.perf_counter()
  batch, moments = score_tokens(p, state, batch, scores_N)
  jax.block_until_ready(batch)  # honest phase times (the train step would wait anyway)
  forward_s = time.perf_counter() - start
  actor_on = index >= algo.critic_warmup_steps
  opt_args = {"actor_on": jnp.asarray(actor_on)}
  passes = []
  rows, mini = setup.batch_prompts, setup.mini_batch_size
  for epoch in range(algo.num_iterations):
    order = np.arange(rows)
    if mini < rows:  # a fresh, reproducible order per (iteration, epoch)
      order = np.random.default_rng([setup.seed, index, epoch]).permutation(rows)
    for first in range(0, rows, mini):
      mini_batch = batch_lib.select_rows(batch, order[first : first + mini])
      state, m = p.train_step(state, p.frozen, mini_batch, opt_args)
      passes.append(m)
  passes = jax.device_get(passes)
  if moments is None:  # GAE ran in the (single) train step
    moments = {k: passes[0].pop(k) for k in list(passes[0]) if k.startswith("moments/")}
  metrics = objectives.value_stats(moments)
  metrics.update({k: np.mean([m[k] for m in passes]) for k in passes[0]})
  for name in ("ratio_mean", "approx_kl", "kl", "sampler_logp_gap", "sampler_logp_gap_mean"):
    if name in passes[0]:
      metrics[f"{name}/first_pass"] = passes[0][name]
  metrics["actor_on"] = float(actor_on)
  metrics["time/forward_s"] = forward_s
  return state, metrics


def score_tokens(p: Pieces, state, batch, scores_N):
  """Fills the batch for the train steps. Returns (batch, value moments or None).

  Always `ref_logp` (beta > 0) and `scores`. Unless `gae_in_step`: also the
  rollout `values` (and `old_logp` when the batch is used more than once),
  `token_rewards`, `advantages`, `returns`, and the batch's
  `objectives.value_moments`; with `gae_in_step` the train step computes those.
  """
  setup, algo = p.setup, p.setup.algo
  batch = dataclasses.replace(batch, scores=scores_N)
  if algo.beta > 0:
    ref_logp = objectives.completion_logprobs_jit(p.frozen, None, batch, setup.forward)
    batch = dataclasses.replace(batch, ref_logp=ref_logp)
  if setup.gae_in_step:
    return batch, None
  with_old = algo.num_iterations > 1 or setup.mini_batch_size < setup.batch_prompts
  old_logp, values = objectives.ppo_rollout_forward(
    state.trainable, p.frozen, batch, setup.forward, setup.critic, with_old
  )
  # The KL reward uses the logprobs of the policy that sampled (the sampler's own when
  # no separate old-policy pass runs: they agree to float32 rounding).
  logp = batch.sampler_logp if old_logp is None else old_logp
  advantages, returns, token_rewards = _advantages(
    scores_N, values, logp, batch.ref_logp, batch.loss_mask, config=algo
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


_moments = jax.jit(objectives.value_moments)
