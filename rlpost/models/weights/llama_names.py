"""The weight map of the Llama-architecture families (Llama / SmolLM2, Qwen2, Qwen3, and
any Llama-style family registered with it in `rlpost.models.families`).

GGUF (llama.cpp's converter): norms are stored as w (kind "plain"); where the family's
`gguf_rope_rows` says so (llama.cpp's `llama` architecture), the GGUF loader un-permutes
the q/k rows. Llama 3's RoPE scaling is the `rope_freqs` tensor (per-pair divisors). An
untied output projection is `output.weight` (GGUF) / `lm_head.weight` (HF). The parts a
family always has (Qwen2's q/k/v biases, Qwen3's head norms) come from its `fixed`.

Info dicts carry exactly the fields of `rlpost.models.llama.Config`, `family` included.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlpost import errors
from rlpost.models import decoder, llama
from rlpost.models.weights import common

HF_PREFIXES = ("model.",)
_LAYERS = {  # params["layers"] leaf -> (GGUF name inside "blk.N.", HF module inside "layers.N.")
  "attn_norm": ("attn_norm", "input_layernorm"),
  "mlp_norm": ("ffn_norm", "post_attention_layernorm"),
  "q_norm": ("attn_q_norm", "self_attn.q_norm"),
  "k_norm": ("attn_k_norm", "self_attn.k_norm"),
  "q": ("attn_q", "self_attn.q_proj"),
  "k": ("attn_k", "self_attn.k_proj"),
  "v": ("attn_v", "self_attn.v_proj"),
  "o": ("attn_output", "self_attn.o_proj"),
  "gate": ("ffn_gate", "mlp.gate_proj"),
  "up": ("ffn_up", "mlp.up_proj"),
  "down": ("ffn_down", "mlp.down_proj"),
}


def _leaves(config):
  """(leaf, GGUF part, HF module, suffix) of one layer's tensors: biases end in "bias"."""
  shapes = decoder.layer_shapes(config)
  for leaf in shapes:
    base = leaf[: -len("_bias")] if leaf.endswith("_bias") else leaf
    part, module = _LAYERS[base]
    yield leaf, part, module, "bias" if leaf != base else "weight"


def gguf_targets(config) -> list[tuple[str, tuple, str]]:
  """(GGUF name, params path, kind) for every tensor of the model's GGUF file."""
  targets = [
    ("token_embd.weight", ("embed",), "plain"),
    ("output_norm.weight", ("final_norm",), "plain"),
  ]
  if not config.tied_output:
    targets.append(("output.weight", ("output",), "plain"))
  for i in range(config.num_layers):
    for leaf, part, _, suffix in _leaves(config):
      kind = "linear" if leaf in common.LINEARS else "plain"
      targets.append((f"blk.{i}.{part}.{suffix}", ("layers", leaf, i), kind))
  return targets


def gguf_info(gf, family) -> dict[str, Any]:
  """Info (the llama.Config field names) from a llama / qwen2 / qwen3 GGUF's metadata."""
  arch = gf.metadata["general.architecture"]
  get = common.gguf_getter(gf, arch)
  embed_dim, heads = int(get("embedding_length")), int(get("attention.head_count"))
  head_dim = int(get("attention.key_length", embed_dim // heads))
  rotated = int(get("rope.dimension_count", head_dim))
  if int(get("attention.value_length", head_dim)) != head_dim or rotated != head_dim:
    raise errors.DataError(
      f"{gf.path}: key/value lengths or RoPE dimensions differ from the head size {head_dim} "
      f"(rope.dimension_count={rotated}); only whole-head RoPE with equal key and value sizes "
      "is supported"
    )
  scaling = get("rope.scaling.type", "none")
  if scaling not in ("none", "", None):
    raise errors.DataError(
      f"{gf.path}: {arch}.rope.scaling.type={scaling!r} is not supported; only Llama 3's "
      "scaling (the rope_freqs tensor) and unscaled RoPE are"
    )
  factors = None
  if "rope_freqs.weight" in gf.tensors:
    factors = tuple(float(x) for x in gf.dequantize("rope_freqs.weight").reshape(-1))
  info = {
    "vocab_size": common.gguf_vocab_size(gf),
    "embed_dim": embed_dim,
    "num_layers": int(get("block_count")),
    "num_heads": heads,
    "num_kv_heads": int(get("attention.head_count_kv", heads)),
    "head_dim": head_dim,
    "mlp_dim": int(get("feed_forward_length")),
    "family": family.name,
    "rope_base": float(get("rope.freq_base", 10_000.0)),
    "rope_freq_factors": factors,
    "rms_eps": float(get("attention.layer_norm_rms_epsilon")),
    "tied_output": "output.weight" not in gf.tensors,
    "qkv_bias": False,
    "qk_norm": False,
    **family.fixed,
  }
  return common.check_info(info, family.config, gf.path)


def gguf_extra_tensors(config) -> tuple[str, ...]:
  """Tensors the metadata reads (not params): Llama 3's RoPE divisors."""
  return ("rope_freqs.weight",) if config.rope_freq_factors is not None else ()


def hf_names(config, prefix: str = "model.") -> dict[str, tuple[tuple, str]]:
  """HF tensor name -> (params path, kind) for every weight (lm_head when untied)."""
  names = {
    f"{prefix}embed_tokens.weight": (("embed",), "plain"),
    f"{prefix}norm.weight": (("final_norm",), "plain"),
  }
  if not config.tied_output:
    names["lm_head.weight"] = (("output",), "plain")
  for i in range(config.num_layers):
    for leaf, _, module, suffix in _leaves(config):
      kind = "linear" if leaf in common.LINEARS else "plain"
      names[f"{prefix}layers.{i}.{module}.{suffix}"] = (("layers", leaf, i), kind)
  return names


def _rope_factors(cfg: Mapping[str, Any], head_dim: int, base: float, source: str):
  rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind == "default":
    return None
  if kind != "llama3":
    raise errors.DataError(
      f"{source}: RoPE scaling {rope} is not supported; only Llama 3's ('llama3') and none"
    )
  try:
    return llama.llama3_rope_factors(
      head_dim,
      base,
      float(rope["factor"]),
      float(rope["low_freq_factor"]),
      float(rope["high_freq_factor"]),
      int(rope["original_max_position_embeddings"]),
    )
  except (KeyError, ValueError) as e:
    raise errors.DataError(f"{source}: rope_scaling {rope}: {e}") from None


def hf_info(config: Mapping[str, Any], family, source: str = "config.json") -> dict[str, Any]:
  """HF Llama / Qwen2 / Qwen3 config dict -> info dict with the llama.Config field names."""
  cfg = config
  common.require_keys(cfg, common.HF_REQUIRED, source, family.name)
  if cfg.get("use_sliding_window"):
    raise errors.DataError(f"{source}: use_sliding_window=true is not supported")
  if cfg.get("attention_bias") and not family.fixed.get("qkv_bias"):
    raise errors.DataError(
      f"{source}: attention_bias=true (biases on q, k, v and o) is not supported for "
      f"{family.name}; only Qwen2's q/k/v biases are"
    )
  if cfg.get("mlp_bias"):
    raise errors.DataError(f"{source}: mlp_bias=true is not supported")
  embed_dim, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
  head_dim = int(cfg.get("head_dim") or embed_dim // heads)
  rope = cfg.get("rope_parameters") or {}
  base = float(rope.get("rope_theta", cfg.get("rope_theta", 10_000.0)))
  info = {
    "vocab_size": int(cfg["vocab_size"]),
    "embed_dim": embed_dim,
    "num_layers": int(cfg["num_hidden_layers"]),
    "num_heads": heads,
    "num_kv_heads": int(cfg["num_key_value_heads"]),
    "head_dim": head_dim,
    "mlp_dim": int(cfg["intermediate_size"]),
    "family": family.name,
    "rope_base": base,
    "rope_freq_factors": _rope_factors(cfg, head_dim, base, source),
    "rms_eps": float(cfg.get("rms_norm_eps", 1e-6)),
    "tied_output": bool(cfg.get("tie_word_embeddings", False)),  # transformers' default
    "qkv_bias": False,
    "qk_norm": False,
    **family.fixed,  # parts no config.json states (Qwen2's biases)
  }
  return common.check_info(info, family.config, source)


def hf_config(config, *, dtype: Any, bos_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
  """Config -> a `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` config.json
  dict less its `architectures` and `model_type` (the family's)."""
  if config.rope_freq_factors is not None:
    raise ValueError(
      "export of a model with RoPE frequency factors is not supported: config.json holds "
      "Llama 3's four scaling parameters, which the factors do not determine"
    )
  return {
    "vocab_size": config.vocab_size,
    "hidden_size": config.embed_dim,
    "intermediate_size": config.mlp_dim,
    "num_hidden_layers": config.num_layers,
    "num_attention_heads": config.num_heads,
    "num_key_value_heads": config.num_kv_heads,
    "head_dim": config.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": config.rms_eps,
    "rope_theta": config.rope_base,
    "rope_scaling": None,
    "attention_bias": config.qkv_bias,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "tie_word_embeddings": config.tied_output,
    "use_sliding_window": False,
    "bos_token_id": bos_id,
    "eos_token_id": eos_id,
    "pad_token_id": pad_id,
    "torch_dtype": np.dtype(dtype).name,
    "use_cache": True,
  }
