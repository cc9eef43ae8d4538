"""Gemma 3 text models: their `Config`, presets and context lengths.

Architecture (run by `rlpost.models.decoder`): embedding scaled by sqrt(D); sandwich
RMSNorms (pre and post) around attention and the gated-GELU(tanh) MLP, each scaling by
(1 + w); grouped-query attention with RMSNorm on queries and keys before rotate-half
RoPE; queries scaled by query_pre_attn_scalar**-0.5; layer i is global (full causal,
RoPE base `global_rope_base`) iff i % global_every == global_every - 1, the others are
local (sliding window, RoPE base `local_rope_base`); final RMSNorm; tied output.
"""

import dataclasses
import math

from rlpost.models import architecture


@dataclasses.dataclass(frozen=True)
class Config:
  """Static architecture of a Gemma 3 text model (hashable: safe as a jit static arg);
  provides `rlpost.models.architecture.Architecture`.

  family: its `rlpost.models.families` entry ("gemma3"; a Gemma-style variant registers
    its own name).
  """

  vocab_size: int
  embed_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  sliding_window: int
  family: str = "gemma3"
  global_every: int = 6
  local_rope_base: float = 10_000.0
  global_rope_base: float = 1_000_000.0
  query_pre_attn_scalar: float = 256.0
  rms_eps: float = 1e-6

  def __post_init__(self):
    architecture.check_sizes(self, ("sliding_window", "global_every"))

  # What the decoder reads (`architecture.Architecture`): Gemma 3's fixed choices.
  norm_offset = 1.0
  activation = "gelu_tanh"
  rope_freq_factors = None
  post_norms = True
  qk_norm = True
  qkv_bias = False
  tied_output = True

  @property
  def global_layers(self) -> tuple[bool, ...]:
    """Per layer: True for global (full causal) attention, False for sliding window."""
    return tuple(i % self.global_every == self.global_every - 1 for i in range(self.num_layers))

  @property
  def rope_bases(self) -> tuple[float, float]:
    return (self.local_rope_base, self.global_rope_base)

  @property
  def embed_multiplier(self) -> float:
    return math.sqrt(self.embed_dim)

  @property
  def query_scale(self) -> float:
    return self.query_pre_attn_scalar**-0.5


PRESETS: dict[str, Config] = {
  "gemma3_270m": Config(
    vocab_size=262_144,
    embed_dim=640,
    num_layers=18,
    num_heads=4,
    num_kv_heads=1,
    head_dim=256,
    mlp_dim=2048,
    sliding_window=512,
  ),
  "gemma3_1b": Config(
    vocab_size=262_144,
    embed_dim=1152,
    num_layers=26,
    num_heads=4,
    num_kv_heads=1,
    head_dim=256,
    mlp_dim=6912,
    sliding_window=512,
  ),
  # Tiny random model for tests: 2 of its 4 layers are global, window 8.
  "tiny": Config(
    vocab_size=261,
    embed_dim=32,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    mlp_dim=64,
    sliding_window=8,
    global_every=2,
    query_pre_attn_scalar=16.0,
  ),
}


# Tokens a preset was trained to attend over (Gemma 3 270M and 1B: 32K); the tiny test
# model's is the limit its tests need. A run whose prompt plus completion could exceed it
# is refused when its config is read (`rlpost.recipes.common.check_context`).
CONTEXT_TOKENS: dict[str, int] = {"gemma3_270m": 32_768, "gemma3_1b": 32_768, "tiny": 8_192}
