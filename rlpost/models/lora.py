"""LoRA adapters as a separate pytree: init, merge, and which leaves train.

adapters = {"layers": {name: {"a": [L, in, r], "b": [L, r, out]}}} for each
target projection `name` in the model's stacked `params["layers"]`
(q, k, v, o, gate, up, down). The adapted weight is W + scale * A @ B with
scale = alpha / rank; B starts at zero, so a fresh adapter changes nothing.
The base params are never copied: the reference policy is simply the base
params with `adapters=None`.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from rlpost.models import quant4

ALL_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """rank r, alpha, and the target projections (names in params["layers"])."""

  rank: int = 32
  alpha: float = 32.0
  targets: tuple[str, ...] = ALL_TARGETS

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f"lora.rank={self.rank} must be >= 1")
    if not (math.isfinite(self.alpha) and self.alpha > 0):
      raise ValueError(
        f"lora.alpha={self.alpha} must be a finite number > 0 (the adapters' scale is "
        "alpha / rank; 0 would freeze them)"
      )
    unknown = sorted(set(self.targets) - set(ALL_TARGETS))
    if unknown or not self.targets:
      raise ValueError(
        f"lora.targets={self.targets!r}: unknown or empty; valid names: {ALL_TARGETS}"
      )
    object.__setattr__(self, "targets", tuple(self.targets))

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def init_adapters(key: jax.Array, params, config: LoraConfig, dtype=jnp.float32):
  """A ~ N(0, 1/in) (Kaiming-like), B = 0, for every target of `params["layers"]`."""
  layers = {}
  for name, k in zip(config.targets, jax.random.split(key, len(config.targets))):
    L, fan_in, fan_out = params["layers"][name].shape
    a = jax.random.normal(k, (L, fan_in, config.rank), jnp.float32) / jnp.sqrt(fan_in)
    layers[name] = {"a": a.astype(dtype), "b": jnp.zeros((L, config.rank, fan_out), dtype)}
  return {"layers": layers}


def merge(params, adapters, config: LoraConfig):
  """params with W <- W + scale * A @ B for every adapted projection (same dtypes)."""
  adapted = {name: params["layers"][name] for name in adapters["layers"]}
  merged = merged_weights(adapted, adapters, config)
  return {**params, "layers": {**params["layers"], **merged}}


def merged_weights(weights: dict, adapters, config: LoraConfig) -> dict:
  """{name: W + scale * A @ B} for the adapted stacks `weights` ({name: [L, in, out]}, the
  keys of adapters["layers"]) in their dtypes: `merge` without the weights it keeps, so
  a program computing it outputs (copies) only the merged ones. A 4-bit (`quant4.Packed4`)
  weight comes out NF4 again, A @ B made one layer at a time (`quant4.lora_requantized`)."""
  out = {}
  for name, ab in adapters["layers"].items():
    w = weights[name]
    if isinstance(w, quant4.Packed4):  # a 4-bit base (QLoRA): merged, then NF4 again
      out[name] = quant4.lora_requantized(w, ab["a"], ab["b"], config.scale)
      continue
    delta = jnp.einsum("lir,lro->lio", ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32))
    out[name] = (w.astype(jnp.float32) + config.scale * delta).astype(w.dtype)
  return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def delta(x: jax.Array, a: jax.Array, b: jax.Array, scale: float, compute_dtype=None) -> jax.Array:
  """The unmerged adapter path `scale * (x @ a) @ b`: `[..., in] -> [..., out]` float32.

  Inputs are cast to `compute_dtype` (None: the adapters' dtype) with float32
  accumulation. The thin product `x @ a` `[..., r]` is named "lora_xa" (kept by
  the "dots" remat policy). The backward pass computes the adapter gradients
  as `[r, n] @ [n, out]` and `[r, n] @ [n, in]` from row-major copies of the
  thin `[n, r]` factors: written the autodiff way (`xa.T @ g`), XLA:CPU
  transposes the wide cotangent `g` instead, in a strided loop fusion that
  cost ~1/3 of a LoRA backward pass on the CI machine.
  """
  return _delta_fwd(x, a, b, scale, compute_dtype)[0]


def _delta_fwd(x, a, b, scale, compute_dtype):
  dtype = jnp.dtype(compute_dtype or a.dtype)
  xa = checkpoint_name(
    jnp.matmul(x.astype(dtype), a.astype(dtype), preferred_element_type=jnp.float32), "lora_xa"
  )
  y = scale * jnp.matmul(xa.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)
  return y, (x, a, b, xa)


def _delta_bwd(scale, compute_dtype, residuals, g):
  x, a, b, xa = residuals
  dtype = jnp.dtype(compute_dtype or a.dtype)
  rows = lambda t: t.reshape(-1, t.shape[-1]).astype(dtype)  # [..., k] -> [n, k]
  g_c, x_c = rows(g), rows(x)
  mm = functools.partial(jnp.matmul, preferred_element_type=jnp.float32)
  gb = scale * mm(g_c, b.astype(dtype).T)  # [n, r]
  db = scale * mm(rows(xa).T, g_c)  # [r, n] @ [n, out]: the thin factor is the one transposed
  da = mm(gb.astype(dtype).T, x_c).T  # ([r, n] @ [n, in]).T
  dx = mm(gb.astype(dtype), a.astype(dtype).T).reshape(x.shape)
  return dx.astype(x.dtype), da.astype(a.dtype), db.astype(b.dtype)


delta.defvjp(_delta_fwd, _delta_bwd)
