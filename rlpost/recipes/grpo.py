"""GRPO-family RL (GRPO, Dr.GRPO, DAPO, GSPO, ...) from a ConfigDict (configs/grpo_gsm8k.py).

Reads top to bottom: `build` (ConfigDict -> static settings, model, state,
train step), `run` (the run loop over iterations), `iteration` (one step), its two
phases `produce` and `train`, then their helpers. One iteration:

  produce: prompts -> G completions each (shared prefill) -> rewards (host)
    -> [dynamic sampling: drop zero-signal groups, sample more prompts]
  train: RLBatch + advantages -> ref logprobs (beta > 0) -> old logprobs
    (num_iterations > 1) -> num_iterations x train_step(state, frozen, batch)

With `rollout.max_staleness` set, `produce` runs ahead in a thread
(`rlpost.train.pipeline`) on the policy exactly that many updates old.
"""

import dataclasses
import time
from typing import Any, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from rlpost import sampling
from rlpost.data import tasks
from rlpost.data.cursor import Cursor, next_indices
from rlpost.models import policy
from rlpost.recipes import common
from rlpost.recipes import rollout
from rlpost.rl import advantages as adv_lib
from rlpost.rl import batch as batch_lib
from rlpost.rl import objectives
from rlpost.rl.batch import RLBatch
from rlpost.train import host_memory
from rlpost.train import loop as loop_lib
from rlpost.train import shares
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
class Setup:
  """Static pieces of a GRPO run, resolved once from the ConfigDict."""

  algo: objectives.GRPOConfig
  rollout: rollout.RolloutConfig
  forward: policy.ForwardConfig
  sampling: sampling.SamplingConfig
  batch_prompts: int
  micro_batch_size: int
  template: str
  shuffle: bool


class Pieces(NamedTuple):
  """Everything a GRPO run is built from (see `build`)."""

  setup: Setup
  tokenizer: Any
  task: tasks.Task
  state: step_lib.TrainState  # fresh: step 0, new adapters (or the params), optimizer state
  frozen: Any  # base params under LoRA, else None
  ref_params: Any  # reference policy params (None when beta == 0 and no LoRA)
  train_step: Any
  sampler: rollout.Sampler  # where rollouts run


def check_config(cfg) -> tuple[objectives.GRPOConfig, rollout.RolloutConfig, policy.ForwardConfig]:
  """Validates the ConfigDict before anything is loaded; returns its static settings."""
  algo = common.from_block(objectives.GRPOConfig, cfg.algo, "algo", RENAMED)
  rollout_cfg = common.from_block(rollout.RolloutConfig, cfg.rollout, "rollout", RENAMED)
  group = algo.advantage_estimator in adv_lib.GROUP_ESTIMATORS
  greedy_why = (
    f"greedy decoding gives the {algo.num_generations} samples of a prompt identical "
    f"completions, so {algo.advantage_estimator}'s group-relative advantages are all 0"
    if group
    else "the trainer's logprobs divide the logits by the temperature"
  )
  rows = cfg.train.batch_prompts * algo.num_generations
  rows_text = "train.batch_prompts * algo.num_generations"
  rollout.check_settings(cfg, rollout_cfg, rows, rows_text, greedy_why)
  rollout.check_off_policy(cfg, rollout_cfg.max_staleness, algo.tis_cap)
  if rollout_cfg.dynamic_sampling and jax.process_count() > 1:
    common.fail(
      "rollout.dynamic_sampling",
      True,
      f"not with {jax.process_count()} processes (each would keep a different number of "
      "groups, and a step needs the same number from every process); set it False or "
      "run one process",
    )
  return algo, rollout_cfg, common.forward_config(cfg, cfg.sampling.temperature)


def build(cfg, loaded=None) -> Pieces:
  """Loads the model (or takes `loaded` = (config, params, tokenizer)) and builds the run."""
  algo, rollout_cfg, forward = check_config(cfg)
  _, params, tokenizer = loaded or common.load_model(cfg)
  setup = Setup(
    algo=algo,
    rollout=rollout_cfg,
    forward=forward,
    sampling=rollout.sampling_config(cfg, tokenizer),
    batch_prompts=cfg.train.batch_prompts,
    micro_batch_size=cfg.train.micro_batch_size,
    template=cfg.data.template,
    shuffle=cfg.data.shuffle,
  )
  task = tasks.load_task(cfg.data, "train", cfg.seed)
  policy_pieces = build_policy(cfg, params, algo, forward)
  sampler = rollout.make_sampler(cfg, policy_pieces[1], forward)
  return Pieces(setup, tokenizer, task, *policy_pieces, sampler)


def build_policy(cfg, params, algo: objectives.GRPOConfig, forward: policy.ForwardConfig):
  """(state, frozen, ref_params, train_step) of a GRPO-family policy over `params`."""
  key = jax.random.key(cfg.seed)
  trainable, frozen = common.trainable_and_frozen(params, forward, key)
  if forward.lora:
    ref_params = params
  elif algo.beta > 0:  # updates are donated: train a copy, keep `params` as reference
    trainable, ref_params = jax.tree.map(jnp.copy, params), params
  else:
    ref_params = None
  optimizer = common.make_optimizer(cfg, cfg.train.steps * algo.num_iterations)
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
  return state, frozen, ref_params, train_step


def run(cfg, workdir: str, stop_after: int | None = None, loaded=None):
  """Trains until cfg.train.steps iterations are done (or `stop_after` in this call).

  Resumes from the newest checkpoint in `workdir`. Returns the final TrainState.
  """
  cfg = common.with_compute_dtype(cfg, workdir)
  check_config(cfg)  # a bad config fails before the int8 calibration below (seconds)
  cfg = common.with_int8_paths(cfg, workdir)
  p = build(cfg, loaded)
  loop = loop_lib.loop_config(
    cfg,
    f"grpo[{cfg.name}]",
    ("reward/mean", "answer_accuracy", "format_accuracy", "kl"),
    ("reward/mean", "kl"),
  )
  s = p.setup.rollout.max_staleness
  step_fn, close, carry = rollout.loop_step(p, produce, train, None, s, cfg.train.steps)
  try:
    state, _ = loop_lib.run_loop(
      workdir, cfg, p.state, step_fn, loop, stop_after=stop_after, carry=carry
    )
  finally:
    close()
  return state


def iteration(p: Pieces, state, cursor: Cursor, index: int):
  """One synchronous GRPO iteration (rollout, scoring, num_iterations updates)."""
  step = rollout.loop_step(p, produce, train, None, None, index + 1)[0]
  return step(state, cursor, index)


def produce(p: Pieces, weights, cursor: Cursor, index: int):
  """Iteration `index`'s groups, sampled and scored with `weights` ((params, base key) on
  the sampler's devices: `rollout.sampler_weights`).
  Returns ((groups, rollout metrics, seconds), cursor)."""
  start = time.perf_counter()
  params_s, key = weights
  groups, metrics, cursor = collect(p, params_s, cursor, jax.random.fold_in(key, index))
  del params_s, weights
  host_memory.release_freed_memory()  # the sampler's weight copies, before the train step
  return (groups, metrics, time.perf_counter() - start), cursor


def train(p: Pieces, state, sampled, index: int, version: int, publish=None):
  """The update on `produce`'s groups (sampled by policy `version`; TIS corrects an older
  one). Returns (state, publish(new state) or None, metrics); publish gives the new
  policy's sampler weights to a pipelined producer."""
  groups, metrics, rollout_s = sampled
  setup, start = p.setup, time.perf_counter()
  metrics = {
    **metrics,
    **rollout.metrics(groups, setup.algo.num_generations, p.task.accuracy_fns),
  }
  batch = train_batch(setup, groups, sharding.mesh_of(state))
  state, update_metrics = update(p, state, batch)
  metrics.update(update_metrics)
  weights = publish(state) if publish else None
  train_s = time.perf_counter() - start
  metrics.update(
    {
      "time/rollout_s": rollout_s,
      "time/train_s": train_s,
      "tokens_per_s": float(batch.loss_mask.sum()) / (rollout_s + train_s),
    }
  )
  return state, weights, metrics


def update(p, state, batch: RLBatch):
  """Reference and old logprobs as needed, then num_iterations train steps on `batch`.

  `p` has setup (algo, forward), frozen, ref_params and train_step. Returns
  (state, metrics averaged over the passes, plus first-pass ratio and KL).
  """
  setup = p.setup
  params, adapters = policy.policy_params(state.trainable, p.frozen, setup.forward)
  logprobs = lambda w, a: objectives.completion_logprobs_jit(w, a, batch, setup.forward)
  if setup.algo.beta > 0:
    batch = dataclasses.replace(batch, ref_logp=logprobs(p.ref_params, None))
  if setup.algo.num_iterations > 1:
    batch = dataclasses.replace(batch, old_logp=logprobs(params, adapters))
  passes = []
  for _ in range(setup.algo.num_iterations):
    state, m = p.train_step(state, p.frozen, batch)
    passes.append(m)
  passes = jax.device_get(passes)
  metrics = {k: np.mean([m[k] for m in passes]) for k in passes[0]}
  metrics["ratio_mean/first_pass"] = passes[0]["ratio_mean"]
  if "kl" in passes[0]:
    metrics["kl/first_pass"] = passes[0]["kl"]
  return state, metrics


def collect(p: Pieces, params_s, cursor: Cursor, key):
  """Samples and scores `batch_prompts` groups; dynamic sampling when enabled.

  Each process samples its block of every round's prompts (`rlpost.train.shares`)
  with its own copy of the weights (`params_s`, `key`: `rollout.sampler_weights`); the
  groups returned are this process's. Dynamic sampling drops groups whose G
  rewards are all equal (zero advantage, no signal) and samples further prompts,
  up to `max_resample_rounds` extra rounds; if the batch is still short it is
  filled with dropped groups (they contribute no policy gradient) and
  `dynamic/filled` counts them. Returns (groups, metrics, cursor).
  """
  setup, problems = p.setup, p.task.problems
  B, G, dynamic = setup.batch_prompts, setup.algo.num_generations, setup.rollout.dynamic_sampling
  kept, dropped, rounds, errors = [], [], 0, {}
  while True:
    idx, cursor = next_indices(cursor, len(problems), B, shuffle=setup.shuffle)
    mine = shares.block(B, "train.batch_prompts")
    groups, errs = rollout.sample_groups(
      p, params_s, [problems[i] for i in idx[mine]], jax.random.fold_in(key, rounds), G, mine.start
    )
    for name, n in errs.items():
      name = f"reward/{name}/errors"
      errors[name] = errors.get(name, 0) + shares.sum_over_processes(n)
    rewards = np.concatenate([g["rewards"] for g in groups])
    for group, no_signal in zip(groups, np.asarray(adv_lib.zero_signal_groups(rewards, G))):
      (dropped if dynamic and no_signal else kept).append(group)
    rounds += 1
    if dynamic and rounds >= 3:  # a long streak of signal-less groups shows as it happens
      logging.info(
        "dynamic sampling: %d of %d groups with reward signal after %d rounds "
        "(rollout.max_resample_rounds=%d extra rounds)",
        len(kept),
        B,
        rounds,
        setup.rollout.max_resample_rounds,
      )
    if not dynamic or len(kept) >= B or rounds > setup.rollout.max_resample_rounds:
      break
  filled = max(0, B - len(kept))
  groups = (kept + dropped[:filled])[:B]
  return groups, {**errors, "dynamic/rounds": rounds, "dynamic/filled": filled}, cursor


def process_advantages(rewards, algo: objectives.GRPOConfig) -> np.ndarray:
  """This process's block of the sequence-level advantages [N / P] float32, computed
  over every process's rows (`rewards`: all N of them, `shares.all_rows`), so that
  batch-level estimators (reinforce_pp's whitening) see the whole batch."""
  advantages = objectives.grpo_advantages(jnp.asarray(rewards), algo)
  return shares.take(np.asarray(advantages), "rows")


def train_batch(setup: Setup, groups, mesh) -> RLBatch:
  """The global device RLBatch of every process's groups (`groups`: this process's)."""
  batch = batch_lib.concatenate([g["batch"] for g in groups], setup.sampling.pad_id)
  rewards = shares.all_rows(np.concatenate([g["rewards"] for g in groups]))
  batch = dataclasses.replace(batch, advantages=process_advantages(rewards, setup.algo))
  return batch_lib.to_device(step_lib.global_batch(batch, mesh))
