"""TrainState pytree and ONE jitted, shard_mapped `train_step` shared by every algorithm.

The loss is a plain function `loss_fn(trainable, frozen, micro_batch) ->
(loss, metrics)`; GRPO, PPO, SFT and DPO differ only in that function and in
the batch they pass (an `rl.batch.RLBatch`, or the supervised dicts: any
pytree whose leaves have rows on axis 0). Inside `train_step`:

  batch [N, ...] --shard_map over mesh axis "data"--> per device [N/d, ...]
    -> reshape to [num_micro, micro, ...] -> lax.scan accumulating grads
    -> pmean over "data" -> clip (in the optax chain) -> optax update

The gradient is the mean over micro-batches of each micro-batch's loss
gradient, so token-mean losses are token means per micro-batch (exact for
sequence-level aggregation with equal-size micro-batches).
"""

import functools
from typing import Any, Callable, NamedTuple

import einops
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"


class TrainState(NamedTuple):
  """Everything that changes during training; print it, save it, diff it.

  step: [] int32 optimizer updates applied (non-finite steps excluded).
  trainable: the trained pytree (LoRA adapters, or the full params).
  opt_state: optax state of `trainable`.
  key: PRNG key of the run (split deterministically by step).
  bad_steps: [] int32 consecutive train steps with a non-finite loss or gradient
    norm (0 after a finite one); such steps leave trainable and opt_state as they were.
  total_bad_steps: [] int32 such steps over the whole run.
  """

  step: jax.Array
  trainable: Any
  opt_state: Any
  key: jax.Array
  bad_steps: jax.Array
  total_bad_steps: jax.Array


def make_optimizer(
  *,
  learning_rate: float,
  total_steps: int,
  warmup_fraction: float = 0.1,
  weight_decay: float = 0.1,
  b1: float = 0.9,
  b2: float = 0.99,
  max_grad_norm: float | None = 0.1,
) -> optax.GradientTransformation:
  """AdamW with linear warm-up then cosine decay, after global-norm clipping."""
  warmup = int(round(warmup_fraction * total_steps))
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=learning_rate,
    warmup_steps=max(warmup, 1) if warmup else 0,
    decay_steps=max(total_steps, warmup + 1),
    end_value=0.0,
  )
  chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  chain.append(optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay))
  return optax.chain(*chain)


def gated(inner: optax.GradientTransformation, flag: str) -> optax.GradientTransformation:
  """`inner`, applied only when the update's extra argument `flag` (a traced bool) is True.

  When it is False the update is zero and the state is returned as it was
  (moments, step count, schedule position, weight decay: nothing moves), with
  no recompilation when the flag flips. PPO gates the actor this way during
  critic warm-up: `optimizer.update(grads, state, params, actor_on=...)`.
  """
  inner = optax.with_extra_args_support(inner)

  def update(updates, state, params=None, **extra_args):
    on = extra_args.get(flag, True)
    skip = lambda: (jax.tree.map(jnp.zeros_like, updates), state)
    return jax.lax.cond(on, lambda: inner.update(updates, state, params, **extra_args), skip)

  return optax.GradientTransformationExtraArgs(inner.init, update)


def init_train_state(trainable, optimizer: optax.GradientTransformation, key) -> TrainState:
  zero = lambda: jnp.zeros((), jnp.int32)  # distinct buffers: the step donates each one
  return TrainState(
    step=zero(),
    trainable=trainable,
    opt_state=optimizer.init(trainable),
    key=key,
    bad_steps=zero(),
    total_bad_steps=zero(),
  )


def make_mesh(num_devices: int | None = None) -> jax.sharding.Mesh:
  """1-D data-parallel mesh over the first `num_devices` devices (default: all)."""
  devices = jax.devices()[:num_devices] if num_devices else jax.devices()
  return jax.sharding.Mesh(np.asarray(devices), (DATA_AXIS,))


def _micro_batches(batch, num_micro: int):
  """Every leaf [rows, ...] -> [num_micro, rows / num_micro, ...] (consecutive rows)."""
  return jax.tree.map(lambda x: einops.rearrange(x, "(n m) ... -> n m ...", n=num_micro), batch)


def make_train_step(
  loss_fn: Callable,
  optimizer: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  micro_batch_size: int,
  grad_norm_parts: tuple[str, ...] = (),
):
  """Returns jitted `train_step(state, frozen, batch, opt_args=None) -> (state, metrics)`.

  Args:
    loss_fn: `(trainable, frozen, micro_batch) -> (scalar loss, dict of scalar metrics)`.
    optimizer: optax transformation (clipping included).
    mesh: device mesh with axis "data"; every batch leaf is split on axis 0.
    micro_batch_size: rows per micro-batch on each device.
    grad_norm_parts: keys of a dict `trainable` whose own gradient norms are
      reported as "grad_norm/<key>" (PPO: actor, critic).

  The old state is donated. `frozen` (base params, or None) and `opt_args` (a
  dict of scalars passed to `optimizer.update` as extra arguments, e.g. the
  `gated` flag) are replicated; their values never recompile the step.
  Metrics are means over micro-batches and devices, plus "grad_norm", "loss" and
  "skipped_nonfinite" (1.0 when the loss or gradient norm was not finite: the
  update was skipped and `state.bad_steps` counts it; see TrainState).
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  # On a 1-device mesh the mean is the identity; XLA:CPU would still copy every
  # gradient through an all-reduce (~0.5 s per step for 268M float32 grads).
  mean_over_devices = (
    (lambda x: x) if mesh.shape[DATA_AXIS] == 1 else (lambda x: jax.lax.pmean(x, DATA_AXIS))
  )

  def per_device(state: TrainState, frozen, batch, opt_args):
    rows = jax.tree.leaves(batch)[0].shape[0]
    if rows % micro_batch_size:
      raise ValueError(
        f"{rows} rows per device are not divisible by micro_batch_size={micro_batch_size}"
      )
    micro = _micro_batches(batch, rows // micro_batch_size)

    def accumulate(carry, mb):
      (loss, metrics), grads = grad_fn(state.trainable, frozen, mb)
      return jax.tree.map(jnp.add, carry, (grads, loss, metrics)), None

    n = rows // micro_batch_size
    first = jax.tree.map(lambda x: x[0], micro)
    if n == 1:  # no accumulator: saves a zeroed gradient-sized buffer and an add
      (loss, metrics), grads = grad_fn(state.trainable, frozen, first)
    else:
      zero_grads = jax.tree.map(jnp.zeros_like, state.trainable)
      metric_shapes = jax.eval_shape(lambda: loss_fn(state.trainable, frozen, first)[1])
      zeros = (
        zero_grads,
        jnp.zeros(()),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes),
      )
      (grads, loss, metrics), _ = jax.lax.scan(accumulate, zeros, micro)
    grads, loss, metrics = jax.tree.map(lambda x: mean_over_devices(x / n), (grads, loss, metrics))
    grad_norm = optax.tree.norm(grads)
    # A non-finite loss or gradient norm (global: both are means over devices) must not
    # reach the weights: the update runs in the taken branch of a cond, so a bad step
    # keeps the old trainable and optimizer state (a jnp.where over the two states
    # would hold both at once: +1.1 GiB for a full-parameter 270M step).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def update(trainable_and_opt):
      trainable, opt_state = trainable_and_opt
      updates, opt_state = optimizer.update(grads, opt_state, trainable, **opt_args)
      return optax.apply_updates(trainable, updates), opt_state

    trainable, opt_state = jax.lax.cond(
      finite, update, lambda old: old, (state.trainable, state.opt_state)
    )
    new_state = TrainState(
      step=state.step + finite.astype(jnp.int32),
      trainable=trainable,
      opt_state=opt_state,
      key=state.key,
      bad_steps=jnp.where(finite, 0, state.bad_steps + 1),
      total_bad_steps=state.total_bad_steps + (~finite).astype(jnp.int32),
    )
    metrics = {
      **metrics,
      "loss": loss,
      "grad_norm": grad_norm,
      "skipped_nonfinite": (~finite).astype(jnp.float32),
      **{f"grad_norm/{k}": optax.tree.norm(grads[k]) for k in grad_norm_parts},
    }
    return new_state, metrics

  sharded = jax.shard_map(
    per_device,
    mesh=mesh,
    in_specs=(P(), P(), P(DATA_AXIS), P()),
    out_specs=(P(), P()),
    check_vma=False,
  )

  @functools.partial(jax.jit, donate_argnums=(0,))
  def train_step(state, frozen, batch, opt_args=None):
    return sharded(state, frozen, batch, opt_args or {})

  return train_step


def replicate(tree, mesh: jax.sharding.Mesh):
  """Places a pytree on every device of `mesh` (replicated)."""
  return jax.device_put(tree, NamedSharding(mesh, P()))
