"""Gemma 3's weight map: GGUF and Hugging Face names, metadata -> info, Config -> config.json.

GGUF norm tensors hold `1 + w` (kind "norm_plus_one"); Hugging Face stores `w`, as our
params do. Info dicts carry exactly the fields of `rlpost.models.gemma3.Config`. The
functions are the weight map `rlpost.models.families.Family.weights` names (WEIGHT_MAP
there); `family` is the entry whose files are read.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlpost import errors
from rlpost.models.weights import common

_LAYERS = {  # params["layers"] leaf -> (GGUF name inside "blk.N.", HF module inside "layers.N.")
  "attn_norm": ("attn_norm", "input_layernorm"),
  "post_attn_norm": ("post_attention_norm", "post_attention_layernorm"),
  "mlp_norm": ("ffn_norm", "pre_feedforward_layernorm"),
  "post_mlp_norm": ("post_ffw_norm", "post_feedforward_layernorm"),
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
# Gemma3ForCausalLM, Gemma3ForConditionalGeneration (new and old transformers).
HF_PREFIXES = ("model.", "model.language_model.", "language_model.model.")


def _kind(leaf: str, norm: str) -> str:
  return "linear" if leaf in common.LINEARS else norm


def gguf_targets(config) -> list[tuple[str, tuple, str]]:
  """(GGUF name, params path, kind) for every tensor of a Gemma 3 GGUF."""
  targets = [
    ("token_embd.weight", ("embed",), "plain"),
    ("output_norm.weight", ("final_norm",), "norm_plus_one"),
  ]
  for i in range(config.num_layers):
    for leaf, (part, _) in _LAYERS.items():
      targets.append((f"blk.{i}.{part}.weight", ("layers", leaf, i), _kind(leaf, "norm_plus_one")))
  return targets


def gguf_info(gf, family) -> dict[str, Any]:
  """Info (the Config field names) from a Gemma 3 GGUF's metadata."""
  get = common.gguf_getter(gf, gf.metadata["general.architecture"])
  head_dim = int(get("attention.key_length"))
  if int(get("attention.value_length", head_dim)) != head_dim:
    raise errors.DataError(f"{gf.path}: value_length != key_length is not supported")
  pattern = get("attention.sliding_window_pattern", 6)
  if not isinstance(pattern, int):  # per-layer flags, True = sliding (local)
    pattern = common.global_every_from_flags([not f for f in pattern], gf.path)
  info = {
    "vocab_size": common.gguf_vocab_size(gf),
    "embed_dim": int(get("embedding_length")),
    "num_layers": int(get("block_count")),
    "num_heads": int(get("attention.head_count")),
    "num_kv_heads": int(get("attention.head_count_kv")),
    "head_dim": head_dim,
    "mlp_dim": int(get("feed_forward_length")),
    "sliding_window": int(get("attention.sliding_window")),
    "family": family.name,
    "global_every": pattern,
    # llama.cpp hard-codes the local base for Gemma 3; newer files may store it.
    "local_rope_base": float(get("rope.freq_base_swa", 10_000.0)),
    "global_rope_base": float(get("rope.freq_base", 1_000_000.0)),
    "rms_eps": float(get("attention.layer_norm_rms_epsilon")),
  }
  # Not stored in GGUF. Gemma 3 uses head_dim, except the 27B model (62 layers),
  # which scales by embed_dim / num_heads (the rule llama.cpp applies).
  info["query_pre_attn_scalar"] = (
    info["embed_dim"] // info["num_heads"] if info["num_layers"] == 62 else head_dim
  )
  return common.check_info(info, family.config, gf.path)


def hf_names(config, prefix: str = "model.") -> dict[str, tuple[tuple, str]]:
  """HF tensor name -> (params path, kind) for every text-model weight."""
  names = {
    f"{prefix}embed_tokens.weight": (("embed",), "plain"),
    f"{prefix}norm.weight": (("final_norm",), "plain"),
  }
  for i in range(config.num_layers):
    for leaf, (_, module) in _LAYERS.items():
      names[f"{prefix}layers.{i}.{module}.weight"] = (("layers", leaf, i), _kind(leaf, "plain"))
  return names


def _global_every(cfg: Mapping[str, Any], num_layers: int, source: str) -> int:
  """Period of full-attention layers from layer_types / sliding_window_pattern."""
  period = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern"))
  types = cfg.get("layer_types")
  if types is None:
    return int(period or 6)
  derived = common.global_every_from_flags(
    [t == "full_attention" for t in types], f"{source} layer_types"
  )
  if len(types) != num_layers or (
    period is not None
    and any((i % period == period - 1) != (t == "full_attention") for i, t in enumerate(types))
  ):
    raise errors.DataError(
      f"{source}: layer_types {types} disagrees with num_hidden_layers="
      f"{num_layers} / sliding_window_pattern={period}"
    )
  return int(period if period is not None else derived)


def _rope_bases(cfg: Mapping[str, Any]) -> tuple[float, float]:
  """(local, global) RoPE bases; rejects RoPE scaling, which Config lacks."""
  rope = cfg.get("rope_parameters") or {}
  full, local = rope.get("full_attention", {}), rope.get("sliding_attention", {})
  scaled = [
    p
    for p in (cfg.get("rope_scaling"), full, local)
    if p and p.get("rope_type", p.get("type", "default")) != "default"
  ]
  if scaled:
    raise errors.DataError(
      f"config uses RoPE scaling {scaled}; only unscaled RoPE is supported (Gemma 3 270M / 1B)"
    )
  return (
    float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))),
    float(full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
  )


def hf_info(config: Mapping[str, Any], family, source: str = "config.json") -> dict:
  """HF Gemma 3 (text) config dict -> info dict with the Config field names."""
  cfg = config.get("text_config", config)
  for key in ("final_logit_softcapping", "attn_logit_softcapping"):
    if cfg.get(key) is not None:
      raise errors.DataError(f"{source}: {key}={cfg[key]} is not supported (Gemma 3 has none)")
  common.require_keys(cfg, common.HF_REQUIRED, source, "Gemma 3")
  num_layers = int(cfg["num_hidden_layers"])
  local_base, global_base = _rope_bases(cfg)
  info = {
    "vocab_size": int(cfg["vocab_size"]),
    "embed_dim": int(cfg["hidden_size"]),
    "num_layers": num_layers,
    "num_heads": int(cfg["num_attention_heads"]),
    "num_kv_heads": int(cfg["num_key_value_heads"]),
    "head_dim": int(cfg.get("head_dim", 256)),
    "mlp_dim": int(cfg["intermediate_size"]),
    "sliding_window": int(cfg.get("sliding_window", 4096)),
    "family": family.name,
    "global_every": _global_every(cfg, num_layers, source),
    "local_rope_base": local_base,
    "global_rope_base": global_base,
    "query_pre_attn_scalar": cfg.get("query_pre_attn_scalar", 256),
    "rms_eps": float(cfg.get("rms_norm_eps", 1e-6)),
  }
  return common.check_info(info, family.config, source)


def hf_config(config, *, dtype: Any, bos_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
  """Config -> a `Gemma3ForCausalLM` config.json dict (old and new RoPE keys) less its
  `architectures` and `model_type` (the family's)."""
  g, n = config.global_every, config.num_layers
  rope = {
    "full_attention": {"rope_type": "default", "rope_theta": config.global_rope_base},
    "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_base},
  }
  return {
    "vocab_size": config.vocab_size,
    "hidden_size": config.embed_dim,
    "intermediate_size": config.mlp_dim,
    "num_hidden_layers": n,
    "num_attention_heads": config.num_heads,
    "num_key_value_heads": config.num_kv_heads,
    "head_dim": config.head_dim,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32768,
    "rms_norm_eps": config.rms_eps,
    "rope_theta": config.global_rope_base,
    "rope_local_base_freq": config.local_rope_base,
    "rope_scaling": None,
    "rope_parameters": rope,
    "query_pre_attn_scalar": config.query_pre_attn_scalar,
    "sliding_window": config.sliding_window,
    "sliding_window_pattern": g,
    "layer_types": ["full_attention" if i % g == g - 1 else "sliding_attention" for i in range(n)],
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "bos_token_id": bos_id,
    "eos_token_id": eos_id,
    "pad_token_id": pad_id,
    "torch_dtype": np.dtype(dtype).name,
    "use_cache": True,
  }
