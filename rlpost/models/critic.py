"""The PPO critic: a value head `[D, 1]` on a trunk's final hidden states, in three layouts.

`critic` is a plain pytree trained beside the actor (`trainable = {"actor": ...,
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
"""

import dataclasses

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


def init_critic(key: jax.Array, params, layout: CriticLayout) -> dict:
  """A fresh critic pytree for `layout` over base `params` (the actor's initial weights)."""
  head = init_head(params["embed"].shape[1])
  if layout.mode == "lora":
    return {"adapters": lora_lib.init_adapters(key, params, layout.lora), "head": head}
  if layout.mode == "full":
    return {"params": jax.tree.map(jnp.copy, params), "head": head}
  return {"head": head}


def values_from_hidden(head, hidden_BxTxD) -> jax.Array:
  """`[B, T]` float32 values `hidden @ w + b`."""
  return jnp.einsum("btd,do->bto", hidden_BxTxD.astype(jnp.float32), head["w"])[..., 0] + head["b"]


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
  return jnp.where(batch.loss_mask > 0, values_from_hidden(critic["head"], hidden_BxTxD), 0.0)
