"""Llama-architecture families: Llama (SmolLM2, Llama 3.x), Qwen2/Qwen2.5 and Qwen3.

Architecture (run by `rlpost.models.decoder`): unscaled embedding; pre-RMSNorms
(scaling by w) before attention and the SwiGLU MLP, no post-norms; grouped-query
attention with rotate-half RoPE (one base, Llama 3's frequency scaling optional),
queries scaled by head_dim**-0.5; every layer attends over the whole causal context;
final RMSNorm; tied or untied output projection. The families differ in two parts, each
a field: Qwen2 adds biases to the q/k/v projections (`qkv_bias`), Qwen3 an RMSNorm over
each query and key head before RoPE (`qk_norm`, Gemma 3's place for it). Another
Llama-style family is presets here plus its entry in `rlpost.models.families`.
"""

import dataclasses
import math

import numpy as np

from rlpost.models import architecture


@dataclasses.dataclass(frozen=True)
class Config:
  """Static architecture of a Llama / Qwen2 / Qwen3 model (hashable: a jit static arg);
  provides `rlpost.models.architecture.Architecture`.

  family: its `rlpost.models.families` entry (llama, qwen2, qwen3, ...).
  rope_freq_factors: None, or per RoPE frequency pair (head_dim / 2 of them) the divisor
    of its frequency: Llama 3's RoPE scaling (`llama3_rope_factors`; a GGUF's
    `rope_freqs` tensor).
  """

  vocab_size: int
  embed_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  family: str = "llama"
  rope_base: float = 10_000.0
  rope_freq_factors: tuple[float, ...] | None = None
  rms_eps: float = 1e-5
  tied_output: bool = True
  qkv_bias: bool = False
  qk_norm: bool = False

  # What the decoder reads (`architecture.Architecture`): fixed for these families.
  norm_offset = 0.0
  activation = "silu"
  post_norms = False
  embed_multiplier = None
  sliding_window = 0

  def __post_init__(self):
    architecture.check_sizes(self)
    if self.rope_freq_factors is not None:
      factors = tuple(float(x) for x in self.rope_freq_factors)
      if len(factors) != self.head_dim // 2 or not all(math.isfinite(f) and f > 0 for f in factors):
        raise ValueError(
          f"Config.rope_freq_factors has {len(factors)} entries (min {min(factors, default=0)}): "
          f"give head_dim / 2 = {self.head_dim // 2} finite divisors > 0"
        )
      object.__setattr__(self, "rope_freq_factors", factors)

  @property
  def global_layers(self) -> tuple[bool, ...]:
    return (True,) * self.num_layers

  @property
  def rope_bases(self) -> tuple[float, float]:
    return (self.rope_base, self.rope_base)

  @property
  def query_scale(self) -> float:
    return self.head_dim**-0.5


def llama3_rope_factors(
  head_dim: int,
  base: float,
  factor: float,
  low_freq_factor: float,
  high_freq_factor: float,
  original_context: int,
) -> tuple[float, ...]:
  """Llama 3's RoPE scaling as per-pair frequency divisors: wavelengths above
  original_context / low_freq_factor are slowed by `factor`, those below
  original_context / high_freq_factor are kept, and the band between is interpolated
  smoothly (1 / divisor = (1 - s) / factor + s, s rising from 0 to 1 across the band)."""
  if not (factor >= 1 and 0 < low_freq_factor < high_freq_factor and original_context > 0):
    raise ValueError(
      f"Llama 3 RoPE scaling (factor={factor}, low_freq_factor={low_freq_factor}, "
      f"high_freq_factor={high_freq_factor}, original_max_position_embeddings="
      f"{original_context}): needs factor >= 1 and 0 < low_freq_factor < high_freq_factor"
    )
  inv_freq = base ** (-np.arange(head_dim // 2, dtype=np.float64) * 2.0 / head_dim)
  wavelength = 2 * math.pi / inv_freq
  smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
  divisor = 1.0 / ((1 - smooth) / factor + smooth)
  divisor = np.where(wavelength > original_context / low_freq_factor, factor, divisor)
  divisor = np.where(wavelength < original_context / high_freq_factor, 1.0, divisor)
  return tuple(float(np.float32(d)) for d in divisor)


_TINY = dict(vocab_size=261, embed_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)

LLAMA_PRESETS: dict[str, Config] = {
  "smollm2_135m": Config(
    vocab_size=49_152,
    embed_dim=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    mlp_dim=1536,
    rope_base=100_000.0,
  ),
  "llama3.2_1b": Config(
    vocab_size=128_256,
    embed_dim=2048,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    mlp_dim=8192,
    rope_base=500_000.0,
    rope_freq_factors=llama3_rope_factors(64, 500_000.0, 32.0, 1.0, 4.0, 8192),
  ),
  # Tiny random models for tests (byte tokenizer). The Llama one has Llama 3's RoPE
  # scaling with a short original context, so positions in the tests reach all three of
  # its frequency bands, and an untied output.
  "llama_tiny": Config(
    **_TINY,
    mlp_dim=64,
    rope_freq_factors=llama3_rope_factors(8, 10_000.0, 8.0, 1.0, 4.0, 128),
    tied_output=False,
  ),
}
QWEN2_PRESETS: dict[str, Config] = {
  "qwen2.5_0.5b": Config(
    vocab_size=151_936,
    embed_dim=896,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    head_dim=64,
    mlp_dim=4864,
    family="qwen2",
    rope_base=1_000_000.0,
    rms_eps=1e-6,
    qkv_bias=True,
  ),
  "qwen2_tiny": Config(
    **_TINY, mlp_dim=64, family="qwen2", rope_base=1_000_000.0, rms_eps=1e-6, qkv_bias=True
  ),
}
QWEN3_PRESETS: dict[str, Config] = {
  "qwen3_0.6b": Config(
    vocab_size=151_936,
    embed_dim=1024,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    head_dim=128,
    mlp_dim=3072,
    family="qwen3",
    rope_base=1_000_000.0,
    rms_eps=1e-6,
    qk_norm=True,
  ),
  "qwen3_tiny": Config(
    **_TINY,
    mlp_dim=64,
    family="qwen3",
    rope_base=1_000_000.0,
    rms_eps=1e-6,
    tied_output=False,
    qk_norm=True,
  ),
}
# Tokens each preset was trained to attend over; the tiny ones', what their tests need.
CONTEXT_TOKENS: dict[str, int] = {
  "smollm2_135m": 8_192,
  "llama3.2_1b": 131_072,
  "llama_tiny": 8_192,
  "qwen2.5_0.5b": 32_768,
  "qwen2_tiny": 8_192,
  "qwen3_0.6b": 40_960,
  "qwen3_tiny": 8_192,
}
