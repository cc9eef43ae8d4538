"""What every learner's update shares: the built learner, and its passes of mini-batches.

A learner's update is a pure function of arrays and static settings:

  update(learner, state, batch, index) -> (state, metrics)

`batch` is the global device `RLBatch` of one iteration's rows (every process's) with
`scores` set: each row's reward `[N]`, or per-token rewards `[N, T]` (per-turn rewards).
Advantages, whitening and group statistics are computed on that global batch
(`rlpost.rl.credit`), so no learner knows which process sampled which rows. `state` is
the run's train state (a NamedTuple with `trainable`, `opt_state`, ...), its `trainable`
one layout for every learner: `{"policy": adapters or params}`, PPO's with `"critic"`
beside it; `learner` the
static rest, built by the recipe (`rlpost.recipes.learners`: arrays placed, optimizer
made, train step jitted). The updates: `grpo_update` (the GRPO family), `ppo_update`.
"""

from typing import Any, NamedTuple

import jax
import numpy as np

from rlpost.rl import batch as batch_lib


class Learner(NamedTuple):
  """A built learner: `name` (its LEARNERS key), `settings` (its frozen settings:
  `GRPOSettings`, `PPOSettings`), `frozen` (base params under LoRA or a LoRA critic's
  trunk, else None), `ref_params` (the reference policy, None when unused) and the jitted
  `train_step(state, frozen, batch, *step_args) -> (state, metrics)`."""

  name: str
  settings: Any
  frozen: Any
  ref_params: Any
  train_step: Any


def updates_per_iteration(settings) -> int:
  """Optimizer steps per batch: passes (algo.num_iterations) x mini-batches."""
  return settings.algo.num_iterations * (settings.rows // settings.mini_batch_size)


# A mini-batch's rows in one program, not one eager gather per field and primitive. With
# several CPU devices per process (and across processes) dozens of small programs queued at
# once could exhaust a device's in-flight slots, which later programs, launched out of
# order, hold while waiting on an earlier one: a deadlock (seen on 2 processes x 2 devices).
_select_rows = jax.jit(batch_lib.select_rows)


def train_passes(learner: Learner, state, batch: batch_lib.RLBatch, index: int, *step_args):
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


def pass_metrics(passes: list[dict], first_pass: tuple[str, ...]) -> dict:
  """Each metric's mean over the steps, plus `NAME/first_pass` (the first step's) for the
  names in `first_pass` that the steps report."""
  metrics = {k: np.mean([m[k] for m in passes]) for k in passes[0]}
  for name in first_pass:
    if name in passes[0]:
      metrics[f"{name}/first_pass"] = passes[0][name]
  return metrics
