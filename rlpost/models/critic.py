"""The PPO critic: a value head `[D, 1]` on a trunk's final hidden states, in three layouts.

`critic` is a plain pytree trained beside the actor (`trainable = {"policy": ...,
"critic": ...}`); the trunk it reads depends on `CriticLayout.mode`:

  lora    {"adapters", "head"}: the frozen base params (shared with the actor and
          the reference: no second copy of the weights) + critic LoRA adapters.
  full    {"params", "head"}: a separate trunk, initialised as a copy of the actor.
  shared  {"head"}: the policy's own hidden states (one forward for logprobs and
          values; the value loss also moves the policy trunk, so the two
          objectives compete for the same weights and `vf_coef` matters).

Alignment: the value of completion token t (slot P + t) is read at slot
P + t - 1, the position whose hidden state predicts token t, so V(t) is a
function of the tokens before t only (the state in which action t is taken).
The head is zero-initialised: a fresh critic predicts 0 everywhere.

Normalised values (`CriticLayout.normalize`, PopArt-style): the critic also holds
`"stats"` {"mean", "var", "count"} [] float32, running statistics of the returns; the
head predicts returns in units of them (value = head output x std + mean, so every
consumer reads values in return units), the value loss is measured in those units
(`value_scale`), and `with_return_stats` moves the statistics towards a batch's and
rescales the head so that no value changes. The optimizer never updates "stats".
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rlpost.models import lora as lora_lib
from rlpost.models import policy

MODES = ("lora", "full", "shared")


@dataclasses.dataclass(frozen=True)
class CriticLayout:
  """Static critic settings: `mode` (one of MODES) and its adapters' LoraConfig (lora mode)."""

  mode: str = "lora"
  lora: lora_lib.LoraConfig | None = None
  normalize: bool = False  # values in units of running return statistics ("stats")

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(
        f"CriticLayout.mode={self.mode!r}: use one of {', '.join(MODES)} (lora: adapters on "
        "the frozen base; full: a trunk copy; shared: a head on the policy's hidden states)"
      )
    if self.mode == "lora" and self.lora is None:
      raise ValueError("CriticLayout.lora=None: lora mode needs the adapters' LoraConfig")


def init_head(dim: int) -> dict:
  """Zero value head: {"w": [D, 1] float32, "b": [] float32}."""
  return {"w": jnp.zeros((dim, 1), jnp.float32), "b": jnp.zeros((), jnp.float32)}


MIN_STD = 1e-3  # the return statistics' std never goes below this (constant returns)


def init_critic(key: jax.Array, params, layout: CriticLayout) -> dict:
  """A fresh critic pytree for `layout` over base `params` (the actor's initial weights)."""
  head = init_head(params["embed"].shape[1])
  if layout.mode == "lora":
    critic = {"adapters": lora_lib.init_adapters(key, params, layout.lora), "head": head}
  elif layout.mode == "full":
    critic = {"params": jax.tree.map(jnp.copy, params), "head": head}
  else:
    critic = {"head": head}
  if layout.normalize:  # mean 0, std 1 until the first batch's returns set them
    scalar = lambda v: jnp.full((), v, jnp.float32)  # a buffer each (the step donates them)
    critic["stats"] = {"mean": scalar(0.0), "var": scalar(1.0), "count": scalar(0.0)}
  return critic


def _mean_std(stats) -> tuple[jax.Array, jax.Array]:
  mean, var = (jax.lax.stop_gradient(stats[k]) for k in ("mean", "var"))
  return mean, jnp.sqrt(jnp.maximum(var, MIN_STD * MIN_STD))


def return_stats(critic) -> tuple[jax.Array, jax.Array]:
  """([] mean, [] std) of the critic's running return statistics (normalised values)."""
  return _mean_std(critic["stats"])


def value_scale(critic) -> jax.Array:
  """[] float32: the unit the critic's values are learned in (the returns' running std;
  1 without normalised values), under stop_gradient."""
  if "stats" not in critic:
    return jnp.ones((), jnp.float32)
  return _mean_std(critic["stats"])[1]


@jax.jit
def with_return_stats(critic, batch_mean, batch_std, decay):
  """`critic` with its return statistics moved towards a batch's (`batch_mean`,
  `batch_std` of its returns; weight `decay` in (0, 1], the first batch's alone: the
  mixture (1 - decay) x running + decay x batch, its mean and variance) and its head
  rescaled so that every value stays the same (PopArt): w' = w s / s',
  b' = (s b + m - m') / s'."""
  stats = critic["stats"]
  first = stats["count"] == 0
  weight = jnp.where(first, 1.0, decay).astype(jnp.float32)
  mean = (1 - weight) * stats["mean"] + weight * batch_mean
  # the mixture's variance, from each part's spread about the new mean (no cancellation)
  var = (1 - weight) * (stats["var"] + jnp.square(stats["mean"] - mean)) + weight * (
    jnp.square(batch_std) + jnp.square(batch_mean - mean)
  )
  new = {"mean": mean, "var": var, "count": stats["count"] + 1}
  (mean, std), (new_mean, new_std) = _mean_std(stats), _mean_std(new)
  head = critic["head"]
  head = {"w": head["w"] * std / new_std, "b": (std * head["b"] + mean - new_mean) / new_std}
  return {**critic, "head": head, "stats": new}


def values_from_hidden(head, hidden_BxTxD, stats=None) -> jax.Array:
  """`[B, T]` float32 values `hidden @ w + b` (with `stats`: times their std plus their
  mean, in return units)."""
  out = jnp.einsum("btd,do->bto", hidden_BxTxD.astype(jnp.float32), head["w"])[..., 0] + head["b"]
  if stats is None:
    return out
  mean, std = _mean_std(stats)
  return out * std + mean


def trunk_forward(layout: CriticLayout, fwd: policy.ForwardConfig) -> policy.ForwardConfig:
  """The forward config of the critic's own trunk (lora / full modes)."""
  return dataclasses.replace(fwd, lora=layout.lora if layout.mode == "lora" else None)


def values(critic, frozen, batch, layout: CriticLayout, fwd: policy.ForwardConfig, policy_hidden):
  """Critic values `[N, T]` float32 of the completion tokens, 0 off `loss_mask`.

  Args:
    critic: the critic pytree (`init_critic`).
    frozen: the frozen base params (lora mode's trunk); unused otherwise.
    batch: an `RLBatch`.
    layout: CriticLayout.
    fwd: the actor's ForwardConfig (dtype, remat, chunk shared with the critic).
    policy_hidden: `[N, T, D]` the policy's `policy.completion_hidden` (shared mode), else None.
  """
  if layout.mode == "shared":
    hidden_BxTxD = policy_hidden
  elif layout.mode == "lora":
    hidden_BxTxD = policy.completion_hidden(
      frozen, critic["adapters"], batch, trunk_forward(layout, fwd)
    )
  else:
    hidden_BxTxD = policy.completion_hidden(
      critic["params"], None, batch, trunk_forward(layout, fwd)
    )
  values_BxT = values_from_hidden(critic["head"], hidden_BxTxD, critic.get("stats"))
  return jnp.where(batch.loss_mask > 0, values_BxT, 0.0)


@functools.partial(jax.jit, static_argnames=("fwd", "layout", "with_logp"))
def rollout_forward(
  actor, critic, frozen, batch, fwd: policy.ForwardConfig, layout: CriticLayout, with_logp: bool
):
  """No-gradient pass after sampling: (the actor's logprobs [N, T] or None, critic values
  [N, T]) of an `RLBatch`. `actor`: the policy's trainable part (`policy.policy_params`).

  The shared layout reads both from one policy forward.
  """
  fwd = fwd.without_remat()
  params, adapters = policy.policy_params(actor, frozen, fwd)
  hidden_BxTxD = None
  if with_logp or layout.mode == "shared":
    hidden_BxTxD = policy.completion_hidden(params, adapters, batch, fwd)
  logp = None
  if with_logp:
    logp = policy.logprobs_from_hidden(hidden_BxTxD, params, batch, fwd, False)
  return logp, values(critic, frozen, batch, layout, fwd, hidden_BxTxD)
