"""The device mesh (axes `data` and `fsdp`) and the partition rules that shard weights.

Axes:
  data  replicas of the weights, each training on its own rows.
  fsdp  the weights, their gradients and the optimizer state are split across
        these devices; the train step gathers a layer's weights inside the layer
        scan (`policy.ForwardConfig.fsdp_axis`) and the other weights once per
        step, and the gradients come back reduce-scattered (the transpose of
        the gather).
Batch rows are split over data x fsdp.

Partition rules are data: `(regex, dim)` pairs matched against a leaf's path
("layers/q", "actor/layers/q/a", "embed"); the first match gives the dim that
is split over `fsdp`. A leaf whose dim does not divide by the axis size stays
replicated, except stacked layer leaves ("layers/" in the path): the forward
gathers every one of them, so they must split (ValueError naming the leaf).
"""

import dataclasses
import re

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

DATA = "data"
FSDP = "fsdp"
BATCH = P((DATA, FSDP))  # rows of a batch: split over every device
# Stacked layer leaves [L, in, ...] split their first weight dim (the layer axis
# is scanned over); everything else (embedding [V, D], norms, value head) its first.
RULES = ((r"(^|/)layers/", 1), (r".*", 0))
_LAYER = re.compile(r"(^|/)layers/")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """The `mesh` block: data x fsdp trainer devices, and devices kept for rollouts.

  data: replica groups; 0: every device not used by fsdp or rollouts (devices / fsdp).
  fsdp: devices that split each replica's weights (1: no FSDP, no collectives).
  rollout: the last this many devices of each process sample, on a mesh of their own
    (`rollout_mesh`) that the trainer's weights are copied to device to device
    (`sync`); 0: the sampler runs on the trainer's devices.
  """

  data: int = 0
  fsdp: int = 1
  rollout: int = 0

  def __post_init__(self):
    for name, least, fix in (
      ("data", 0, "use >= 0 replica groups (0: every device not used by fsdp or rollouts)"),
      ("fsdp", 1, "use >= 1 devices per replica (1: no FSDP)"),
      ("rollout", 0, "use >= 0 devices (0: the sampler shares the trainer's)"),
    ):
      if getattr(self, name) < least:
        raise ValueError(f"MeshConfig.{name}={getattr(self, name)}: {fix}")


def _split(config: MeshConfig, devices):
  """(trainer devices, this process's rollout devices): the last `config.rollout` devices
  of every process sample (one process: the last of all)."""
  by_process: dict = {}
  for d in devices:
    by_process.setdefault(d.process_index, []).append(d)
  fewest = min(len(ds) for ds in by_process.values())
  if config.rollout >= fewest:
    raise ValueError(
      f"mesh rollout={config.rollout} leaves no trainer device of a process's {fewest}; "
      f"use rollout < {fewest}"
    )
  keep = lambda ds: ds[: len(ds) - config.rollout]
  trainer = [d for ds in by_process.values() for d in keep(ds)]
  local = by_process.get(jax.process_index(), [])
  return trainer, local[len(local) - config.rollout :] if config.rollout else []


def make_mesh(config: MeshConfig = MeshConfig(), devices=None) -> jax.sharding.Mesh:
  """The trainer's (data, fsdp) mesh over `devices` (default: all) less each process's
  last `config.rollout`, data-major."""
  devices, _ = _split(config, list(jax.devices() if devices is None else devices))
  data = config.data or len(devices) // config.fsdp
  if data < 1 or data * config.fsdp > len(devices):
    raise ValueError(
      f"mesh data={config.data or 'auto'} x fsdp={config.fsdp} needs "
      f"{max(data, 1) * config.fsdp} devices; {len(devices)} are available besides "
      f"rollout={config.rollout} (simulate more on CPU: "
      "XLA_FLAGS=--xla_force_host_platform_device_count=N)"
    )
  grid = np.asarray(devices[: data * config.fsdp]).reshape(data, config.fsdp)
  return jax.sharding.Mesh(grid, (DATA, FSDP))


def rollout_mesh(config: MeshConfig, devices=None) -> jax.sharding.Mesh | None:
  """A 1-D `data` mesh over this process's last `config.rollout` devices (None when 0):
  the sampler's devices, disjoint from the trainer's (`make_mesh`). With several
  processes each has its own (it samples its block of rows alone)."""
  if not config.rollout:
    return None
  _, local = _split(config, list(jax.devices() if devices is None else devices))
  return jax.sharding.Mesh(np.asarray(local), (DATA,))


def sync(tree, target: jax.sharding.Mesh):
  """`tree` (global arrays on the trainer's mesh, maybe split over fsdp) replicated on
  the `target` mesh's devices, without a host round-trip: all-gathered inside the
  trainer's mesh first (the target layout, replicated), then copied device to device
  (several processes: each copies its own replica to its own rollout devices). Bitwise
  the same values."""
  return place(local_replica(tree), target)


def place(tree, target: jax.sharding.Mesh):
  """`tree` (whole arrays of this process, e.g. `local_replica`'s) copied device to device
  onto every device of `target`, replicated."""
  return jax.device_put(tree, NamedSharding(target, P()))


def local_replica(tree):
  """`tree` (global arrays on one mesh) whole on every device of its mesh; with several
  processes, this process's replica on its first device (what `sync` copies)."""
  gathered = _replicated(tree, mesh_of(tree))
  if jax.process_count() > 1:
    gathered = jax.tree.map(lambda x: x.addressable_data(0), gathered)
  return gathered


def _replicated(tree, mesh: jax.sharding.Mesh):
  """`tree` all-gathered on `mesh`: every device holds every leaf whole."""
  return jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, P()))(tree)


def path_str(path) -> str:
  """A key path as "a/b/c" (dict keys, sequence indices, attribute names)."""
  parts = []
  for key in path:
    for attr in ("key", "idx", "name"):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts)


def is_layer_leaf(path: str) -> bool:
  return bool(_LAYER.search(path))


def leaf_spec(path: str, shape: tuple[int, ...], fsdp: int, rules=RULES) -> P:
  """The PartitionSpec of one leaf under `rules` on an fsdp axis of size `fsdp`."""
  if fsdp == 1 or not shape:
    return P()
  dim = next(d for pattern, d in rules if re.search(pattern, path))
  if dim < len(shape) and shape[dim] % fsdp == 0:
    return P(*([None] * dim), FSDP)
  if is_layer_leaf(path):
    size = shape[dim] if dim < len(shape) else "no such dim"
    raise ValueError(
      f"fsdp={fsdp}: the stacked layer weight {path} {list(shape)} must split on dim "
      f"{dim} ({size}); choose an fsdp size that divides it (LoRA: a rank divisible by fsdp)"
    )
  return P()


def tree_specs(tree, mesh: jax.sharding.Mesh, rules=RULES):
  """PartitionSpecs of every leaf of `tree` (arrays or ShapeDtypeStructs)."""
  fsdp = mesh.shape[FSDP]
  return jax.tree_util.tree_map_with_path(
    lambda path, x: leaf_spec(path_str(path), np.shape(x), fsdp, rules), tree
  )


def shard(tree, mesh: jax.sharding.Mesh, rules=RULES):
  """Places `tree` on `mesh`: split over fsdp by `rules`, replicated over data.

  With several processes each one must hold the same `tree` (same seed, same
  checkpoint): it supplies the shards of its own devices.
  """
  specs = tree_specs(tree, mesh, rules)
  place = jax.device_put if jax.process_count() == 1 else _from_host_copy
  return jax.tree.map(lambda x, s: place(x, NamedSharding(mesh, s)), tree, specs)


def _from_host_copy(x, sharding):
  """A global array from this process's full copy of `x` (keys through their key data)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    data = _from_host_copy(jax.random.key_data(x), sharding)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  host = np.asarray(jax.device_get(x))
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def mesh_of(tree) -> jax.sharding.Mesh:
  """The mesh `tree`'s arrays were placed on (by `shard`)."""
  return jax.tree.leaves(tree)[0].sharding.mesh


def local_copy(tree, mesh: jax.sharding.Mesh):
  """This process's own full copy of `tree` (global arrays on `mesh`), on one of its devices.

  Several processes: all-gathered over the mesh device to device, then each process
  keeps the replica on its first local device (a sampler that runs on this process's
  rows alone reads it). One process: `tree` itself.
  """
  if jax.process_count() == 1:
    return tree
  return jax.tree.map(lambda x: x.addressable_data(0), _replicated(tree, mesh))


def gather(tree, specs, axis: str):
  """Inside shard_map: every leaf split over `axis` (per `specs`) gathered whole."""

  def one(x, spec):
    dims = [d for d, name in enumerate(spec) if name == axis]
    return jax.lax.all_gather(x, axis, axis=dims[0], tiled=True) if dims else x

  return jax.tree.map(one, tree, specs)


def device_bytes(tree) -> dict:
  """{device: bytes of `tree`'s shards it holds}."""
  out = {}
  for leaf in jax.tree.leaves(tree):
    for s in leaf.addressable_shards:
      out[s.device] = out.get(s.device, 0) + s.data.nbytes
  return out


def train_forward(fwd, mesh: jax.sharding.Mesh):
  """`fwd` for a loss inside the train step: layer weights gathered over fsdp when it splits."""
  return dataclasses.replace(fwd, fsdp_axis=FSDP if mesh.shape[FSDP] > 1 else None)
