"""What `rlpost.models.decoder` reads from a model's `Config`, declared once.

Every family's frozen `Config` (`rlpost.models.gemma3`, `rlpost.models.llama`) provides
the members of `Architecture`, as dataclass fields, class attributes or properties;
`rlpost.models.families` checks each preset against it (`check`) when the family is
registered, so a Config that lacks a member or gives it the wrong type is refused there,
naming the member, and not deep inside a jitted forward.
"""

import types
import typing
from typing import Protocol

ACTIVATIONS = ("gelu_tanh", "silu")  # the gated MLP's activation (`Architecture.activation`)
# Every family's Config has these sizes (>= 1; `check_sizes`).
SIZES = (
  "vocab_size",
  "embed_dim",
  "num_layers",
  "num_heads",
  "num_kv_heads",
  "head_dim",
  "mlp_dim",
)


class Architecture(Protocol):
  """A model's static architecture (hashable: every member is a jit static value).

  family            the `rlpost.models.families.FAMILIES` entry the Config belongs to
  vocab_size, embed_dim, num_layers, num_heads, num_kv_heads, head_dim, mlp_dim, rms_eps
  global_layers     per layer (num_layers of them), True for full causal attention,
                    False for the sliding window
  sliding_window    keys a local layer sees (unused when every layer is global)
  rope_bases        (local, global) RoPE base
  rope_freq_factors None, or per frequency pair [head_dim / 2] the divisor of its frequency
                    (Llama 3's RoPE scaling: `llama.llama3_rope_factors`; GGUF rope_freqs)
  norm_offset       an RMSNorm scales by (norm_offset + w): 1 for Gemma, 0 for Llama/Qwen
  embed_multiplier  the embedding lookup is scaled by it (Gemma: sqrt(D)); None: not scaled
  activation        the gated MLP's, one of ACTIVATIONS: "gelu_tanh" (Gemma), "silu" (SwiGLU)
  query_scale       queries are multiplied by it after RoPE
  post_norms        RMSNorms after attention and the MLP too (Gemma's sandwich norms)
  qk_norm           an RMSNorm over each query and key head before RoPE (Gemma 3, Qwen3)
  qkv_bias          biases on the q/k/v projections (Qwen2)
  tied_output       logits from the input embedding (else an `output` matrix)
  """

  family: str
  vocab_size: int
  embed_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rms_eps: float
  global_layers: tuple
  sliding_window: int
  rope_bases: tuple
  rope_freq_factors: tuple | None
  norm_offset: float
  embed_multiplier: float | None
  activation: str
  query_scale: float
  post_norms: bool
  qk_norm: bool
  qkv_bias: bool
  tied_output: bool


def check_sizes(config, extra: tuple[str, ...] = ()) -> None:
  """A Config's sizes (SIZES and `extra`) are >= 1, its query heads a multiple of its
  key/value heads, its head size even (RoPE pairs); ValueError naming the field."""
  for name in SIZES + extra:
    if getattr(config, name) < 1:
      raise ValueError(f"Config.{name}={getattr(config, name)} must be >= 1")
  if config.num_heads % config.num_kv_heads:
    raise ValueError(
      f"Config.num_heads={config.num_heads} must be a multiple of "
      f"num_kv_heads={config.num_kv_heads}"
    )
  if config.head_dim % 2:
    raise ValueError(f"Config.head_dim={config.head_dim} must be even for RoPE")


def _is(value, kind) -> bool:
  if kind is float:  # an int is a float here (Python's numeric tower)
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if isinstance(kind, types.UnionType):
    return any(_is(value, k) for k in typing.get_args(kind))
  return isinstance(value, kind)


def check(config, where: str) -> None:
  """Raises TypeError naming each `Architecture` member `config` lacks or gives a value
  of another type; `where` names the config ("family NAME, preset NAME")."""
  bad = []
  for name, kind in typing.get_type_hints(Architecture).items():
    if not hasattr(config, name):
      bad.append(f"{name} is missing")
    elif not _is(getattr(config, name), kind):
      bad.append(f"{name}={getattr(config, name)!r} is not {kind}")
  if not bad and len(config.global_layers) != config.num_layers:
    bad.append(f"global_layers has {len(config.global_layers)} entries, not num_layers")
  if not bad and config.activation not in ACTIVATIONS:
    bad.append(f"activation={config.activation!r} is not one of {ACTIVATIONS}")
  if bad:
    raise TypeError(
      f"{where}: {type(config).__qualname__} does not provide what the decoder reads "
      f"(rlpost.models.architecture.Architecture): {'; '.join(bad)}. Give each as a field, "
      "a class attribute or a property."
    )
