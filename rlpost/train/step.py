"""TrainState pytree and ONE jitted, shard_mapped `train_step` shared by every algorithm.

The loss is a plain function `loss_fn(trainable, frozen, micro_batch) ->
(loss, metrics)`; GRPO, PPO, SFT and DPO differ only in that function and in
the batch they pass (an `rl.batch.RLBatch`, or the supervised dicts: any
pytree whose leaves have rows on axis 0). Inside `train_step`:

  batch [N, ...] --shard_map over the (data, fsdp) mesh--> per device [N/d, ...]
    -> reshape to [num_micro, micro, ...] -> lax.scan accumulating the gradients
       of this device's weight shards (fsdp: layer weights gathered per layer in
       the forward, the rest per step; gradients reduce-scattered back)
    -> mean over devices -> [jit, outside the shard_map: the global gradient norm,
       the non-finite guard, clipping (in the optax chain) and the optax update
       on the sharded weights and optimizer state]

The gradient is the mean over micro-batches of each micro-batch's loss
gradient, so token-mean losses are token means per micro-batch (exact for
sequence-level aggregation with equal-size micro-batches).

With several processes each passes only its block of the batch's rows
(`rlpost.train.shares`); `global_batch` assembles the global arrays from them.
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

from rlpost.train import shares
from rlpost.train import sharding

OPTIMIZERS = ("adamw", "sgd")


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
  optimizer: str = "adamw",
) -> optax.GradientTransformation:
  """AdamW (or plain SGD: `optimizer="sgd"`, its update the scheduled gradient, weight
  decay added to it) with linear warm-up then cosine decay, after global-norm clipping."""
  if optimizer not in OPTIMIZERS:
    raise ValueError(f"optimizer={optimizer!r}: use one of {OPTIMIZERS}")
  warmup = int(round(warmup_fraction * total_steps))
  if warmup:
    schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=learning_rate,
      warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1),
      end_value=0.0,
    )
  else:  # no warm-up segment at all (optax logs a zero-length one as a misconfiguration)
    schedule = optax.cosine_decay_schedule(learning_rate, decay_steps=max(total_steps, 1))
  chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  if optimizer == "sgd":
    chain += [optax.add_decayed_weights(weight_decay), optax.sgd(schedule)]
  else:
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


def make_mesh(num_devices: int | None = None, fsdp: int = 1) -> jax.sharding.Mesh:
  """(data, fsdp) mesh over the first `num_devices` devices (default: all); see `sharding`."""
  devices = jax.devices()[:num_devices] if num_devices else jax.devices()
  return sharding.make_mesh(sharding.MeshConfig(fsdp=fsdp), devices)


def place(tree, mesh: jax.sharding.Mesh):
  """Places a pytree on `mesh`: split over fsdp by `sharding.RULES`, replicated over data."""
  return sharding.shard(tree, mesh)


def _micro_batches(batch, num_micro: int):
  """Every leaf [rows, ...] -> [num_micro, rows / num_micro, ...] (consecutive rows)."""
  return jax.tree.map(lambda x: einops.rearrange(x, "(n m) ... -> n m ...", n=num_micro), batch)


def make_train_step(
  loss_fn: Callable,
  optimizer: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  micro_batch_size: int,
  grad_norm_parts: tuple[tuple[str, str], ...] = (),
):
  """Returns jitted `train_step(state, frozen, batch, opt_args=None) -> (state, metrics)`.

  Args:
    loss_fn: `(trainable, frozen, micro_batch) -> (scalar loss, dict of scalar metrics)`;
      with fsdp > 1 its forward must gather layer weights over "fsdp"
      (`sharding.train_forward`).
    optimizer: optax transformation (clipping included).
    mesh: a (data, fsdp) mesh (`sharding.make_mesh`); batch leaves are split on
      axis 0 over all its devices, `state` and `frozen` are placed by `place`.
    micro_batch_size: rows per micro-batch on each device.
    grad_norm_parts: (name, key) pairs covering a dict `trainable`: each key's own
      gradient norm is reported as "grad_norm/<name>", and "grad_norm" sums the parts
      in this order (PPO: ("actor", "policy"), ("critic", "critic"))

  The old state is donated. `opt_args` (a dict of scalars passed to
  `optimizer.update` as extra arguments, e.g. the `gated` flag) never
  recompiles the step. Metrics are means over micro-batches and devices, plus
  "grad_norm", "loss" and "skipped_nonfinite" (1.0 when the loss or gradient
  norm was not finite: the update was skipped and `state.bad_steps` counts it;
  see TrainState).
  """
  device_grads = functools.partial(
    _device_gradients,
    loss_fn,
    micro_batch_size,
    mesh.shape[sharding.DATA],
    mesh.shape[sharding.FSDP],
  )

  @functools.partial(jax.jit, donate_argnums=(0,))
  def jitted_step(state, frozen, batch, opt_args=None):
    trainable_specs = sharding.tree_specs(state.trainable, mesh)
    frozen_specs = P() if frozen is None else sharding.tree_specs(frozen, mesh)
    grads, loss, metrics = jax.shard_map(
      functools.partial(device_grads, trainable_specs=trainable_specs, frozen_specs=frozen_specs),
      mesh=mesh,
      in_specs=(trainable_specs, frozen_specs, sharding.BATCH),
      out_specs=(trainable_specs, P(), P()),
      check_vma=False,
    )(state.trainable, frozen, batch)
    in_order = [grads[key] for _, key in grad_norm_parts] if grad_norm_parts else grads
    grad_norm = optax.tree.norm(in_order)
    new_state, finite = _apply_if_finite(optimizer, state, grads, grad_norm, loss, opt_args)
    # Keep the state where `place` put it, so the next call reuses this compilation.
    new_state = jax.lax.with_sharding_constraint(
      new_state,
      jax.tree.map(lambda s: NamedSharding(mesh, s), sharding.tree_specs(new_state, mesh)),
    )
    metrics = {
      **metrics,
      "loss": loss,
      "grad_norm": grad_norm,
      "skipped_nonfinite": (~finite).astype(jnp.float32),
      **{f"grad_norm/{name}": optax.tree.norm(grads[key]) for name, key in grad_norm_parts},
    }
    return new_state, metrics

  def train_step(state, frozen, batch, opt_args=None):
    batch = global_batch(batch, mesh)  # several processes: each passes its block of rows
    return jitted_step(state, frozen, batch, opt_args)

  return train_step


def _mean_over(x, axis: str, size: int):
  # On a size-1 axis the mean is the identity; XLA:CPU would still copy every
  # gradient through an all-reduce (~0.5 s per step for 268M float32 grads).
  return x if size == 1 else jax.lax.pmean(x, axis)


def _device_gradients(
  loss_fn, micro_batch_size, data, fsdp, trainable, frozen, batch, trainable_specs, frozen_specs
):
  """Inside shard_map: this device's rows -> (gradients of its weight shards, loss,
  metrics), averaged over micro-batches and devices."""
  rows = jax.tree.leaves(batch)[0].shape[0]
  if rows % micro_batch_size:
    raise ValueError(
      f"{rows} rows per device are not divisible by micro_batch_size={micro_batch_size}"
    )
  # Layer weights stay split (the forward gathers them inside the layer scan); the
  # others are gathered whole: frozen ones once, trainable ones inside the gradient
  # so that their gradients come back reduce-scattered.
  outer = lambda specs: jax.tree_util.tree_map_with_path(
    lambda path, s: P() if sharding.is_layer_leaf(sharding.path_str(path)) else s, specs
  )
  if frozen is not None:
    frozen = sharding.gather(frozen, outer(frozen_specs), sharding.FSDP)
  trainable_outer = outer(trainable_specs)
  local_grad = jax.value_and_grad(
    lambda t, mb: loss_fn(sharding.gather(t, trainable_outer, sharding.FSDP), frozen, mb),
    has_aux=True,
  )
  n = rows // micro_batch_size
  grads, loss, metrics = _summed_over_micro_batches(local_grad, trainable, batch, n)
  # A split leaf's gradient arrives summed over the fsdp group (the gather's
  # transpose); a replicated leaf's is this device's own.
  grads = jax.tree.map(
    lambda g, s: g / fsdp if sharding.FSDP in s else _mean_over(g, sharding.FSDP, fsdp),
    grads,
    trainable_specs,
  )
  both = lambda x: _mean_over(_mean_over(x / n, sharding.FSDP, fsdp), sharding.DATA, data)
  grads = jax.tree.map(lambda g: _mean_over(g / n, sharding.DATA, data), grads)
  return grads, both(loss), jax.tree.map(both, metrics)


def _summed_over_micro_batches(local_grad, trainable, batch, n: int):
  """(gradients, loss, metrics) of `local_grad` summed over the n micro-batches of `batch`."""
  micro = _micro_batches(batch, n)
  first = jax.tree.map(lambda x: x[0], micro)
  if n == 1:  # no accumulator: saves a zeroed gradient-sized buffer and an add
    (loss, metrics), grads = local_grad(trainable, first)
    return grads, loss, metrics

  def accumulate(carry, mb):
    (loss, metrics), grads = local_grad(trainable, mb)
    return jax.tree.map(jnp.add, carry, (grads, loss)), metrics

  # The metrics leave the scan stacked ([n] each) and are summed after it: an accumulator
  # for them would need their shapes first, i.e. a second trace of the forward and backward.
  zeros = (jax.tree.map(jnp.zeros_like, trainable), jnp.zeros(()))
  (grads, loss), metrics = jax.lax.scan(accumulate, zeros, micro)
  return grads, loss, jax.tree.map(lambda m: jnp.sum(m, axis=0), metrics)


def _apply_if_finite(optimizer, state: TrainState, grads, grad_norm, loss, opt_args):
  """The optimizer's update of `state`, or `state` kept when the loss or `grad_norm` (the
  gradients' global norm) is not finite (counted in bad_steps). Returns (new state,
  finite)."""
  # A non-finite loss or gradient norm must not reach the weights: the update runs in
  # the taken branch of a cond, so a bad step keeps the old trainable and optimizer
  # state (a jnp.where over the two states would hold both at once: +1.1 GiB for a
  # full-parameter 270M step).
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  def update(trainable_and_opt):
    trainable, opt_state = trainable_and_opt
    updates, opt_state = optimizer.update(grads, opt_state, trainable, **(opt_args or {}))
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
  return new_state, finite


def global_batch(batch, mesh: jax.sharding.Mesh, pad: bool = False):
  """The global batch as arrays split over the mesh's rows, from this process's rows.

  Each leaf of `batch` holds this process's block of rows (`rlpost.train.shares`):
  process p (devices p*k .. p*k+k-1) gives rows [p * N/P, (p+1) * N/P) of the N-row
  global batch. Leaves that already are global arrays pass through. One process:
  `batch` unchanged.

  pad: zero-pad trailing axes to their widest over processes (for widths where zero
  is inert, as SFT's gather slots); else widths that differ between processes raise
  (an RLBatch's prompt and completion columns must line up across rows).
  """
  if jax.process_count() == 1:
    return batch
  sharding_ = NamedSharding(mesh, sharding.BATCH)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(batch)
  local = [None if _is_global(x) else np.asarray(x) for _, x in leaves]
  widths = [w for x in local if x is not None for w in x.shape[1:]]
  widest = iter(shares.max_over_processes(widths).tolist() if widths else ())
  out = []
  for (path, leaf), x in zip(leaves, local):
    if x is None:
      out.append(leaf)
      continue
    target = [next(widest) for _ in x.shape[1:]]
    if not pad and list(x.shape[1:]) != target:
      raise ValueError(
        f"batch field {jax.tree_util.keystr(path)}: this process's rows are "
        f"{list(x.shape[1:])} wide, another's {target}; build every process's rows to "
        "one agreed width (e.g. pad prompts to the longest over processes)"
      )
    x = np.pad(x, [(0, 0)] + [(0, t - w) for t, w in zip(target, x.shape[1:])])
    shape = (x.shape[0] * jax.process_count(), *x.shape[1:])
    out.append(jax.make_array_from_process_local_data(sharding_, x, shape))
  return jax.tree.unflatten(treedef, out)


def _is_global(x) -> bool:
  return isinstance(x, jax.Array) and not x.is_fully_addressable
