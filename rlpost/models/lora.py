"""LoRA adapters as a separate pytree: init, merge, and which leaves train.

adapters = {"layers": {name: {"a": [L, in, r], "b": [L, r, out]}}} for each
target projection `name` in the model's stacked `params["layers"]`
(q, k, v, o, gate, up, down). The adapted weight is W + scale * A @ B with
scale = alpha / rank; B starts at zero, so a fresh adapter changes nothing.
The base params are never copied: the reference policy is simply the base
params with `adapters=None`.
"""

import dataclasses

import jax
import jax.numpy as jnp

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
  layers = dict(params["layers"])
  for name, ab in adapters["layers"].items():
    w = layers[name]
    delta = jnp.einsum("lir,lro->lio", ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32))
    layers[name] = (w.astype(jnp.float32) + config.scale * delta).astype(w.dtype)
  return {**params, "layers": layers}
