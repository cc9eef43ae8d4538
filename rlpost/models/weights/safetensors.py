"""Hugging Face Gemma 3 text checkpoints (config.json + safetensors) <-> params.

HF stores linear weights as [out, in] (we use [in, out]) and norm weights as
`w` with scale `1 + w`, the same convention as our params, so norms are copied
as they are. Loading accepts one file or shards (with or without
`model.safetensors.index.json`) and the multimodal `language_model` prefixes;
export writes a `Gemma3ForCausalLM` (`gemma3_text`) directory.
"""

import dataclasses
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from rlpost import errors
from rlpost.models.weights import common

_LAYER_NAMES = {  # params["layers"] leaf -> HF module inside "layers.N."
  "attn_norm": "input_layernorm",
  "post_attn_norm": "post_attention_layernorm",
  "mlp_norm": "pre_feedforward_layernorm",
  "post_mlp_norm": "post_feedforward_layernorm",
  "q_norm": "self_attn.q_norm",
  "k_norm": "self_attn.k_norm",
  "q": "self_attn.q_proj",
  "k": "self_attn.k_proj",
  "v": "self_attn.v_proj",
  "o": "self_attn.o_proj",
  "gate": "mlp.gate_proj",
  "up": "mlp.up_proj",
  "down": "mlp.down_proj",
}
# Gemma3ForCausalLM, Gemma3ForConditionalGeneration (new and old transformers).
_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
_INDEX = "model.safetensors.index.json"


def hf_names(num_layers: int, prefix: str = "model.") -> dict[str, tuple]:
  """HF tensor name -> (params path, is_linear) for every text-model weight."""
  names = {
    f"{prefix}embed_tokens.weight": (("embed",), False),
    f"{prefix}norm.weight": (("final_norm",), False),
  }
  for i in range(num_layers):
    for leaf, module in _LAYER_NAMES.items():
      names[f"{prefix}layers.{i}.{module}.weight"] = (("layers", leaf, i), leaf in common.LINEARS)
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


def hf_config_to_info(config: Mapping[str, Any], source: str = "config.json") -> dict:
  """HF Gemma 3 (text) config dict -> info dict with the Config field names."""
  cfg = config.get("text_config", config)
  for key in ("final_logit_softcapping", "attn_logit_softcapping"):
    if cfg.get(key) is not None:
      raise errors.DataError(f"{source}: {key}={cfg[key]} is not supported (Gemma 3 has none)")
  required = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
  )
  missing = [k for k in required if k not in cfg]
  if missing:
    raise errors.DataError(f"{source}: missing keys {missing} (is this a Gemma 3 config?)")
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
    "global_every": _global_every(cfg, num_layers, source),
    "local_rope_base": local_base,
    "global_rope_base": global_base,
    "query_pre_attn_scalar": cfg.get("query_pre_attn_scalar", 256),
    "rms_eps": float(cfg.get("rms_norm_eps", 1e-6)),
  }
  return common.check_info(info, source)


def info_to_hf_config(
  info: Mapping[str, Any],
  *,
  dtype: Any = np.float32,
  bos_id: int = 2,
  eos_id: int = 1,
  pad_id: int = 0,
  max_position_embeddings: int = 32768,
) -> dict[str, Any]:
  """Info dict -> a `Gemma3ForCausalLM` config.json dict (old and new RoPE keys)."""
  g, n = info["global_every"], info["num_layers"]
  rope = {
    "full_attention": {"rope_type": "default", "rope_theta": info["global_rope_base"]},
    "sliding_attention": {"rope_type": "default", "rope_theta": info["local_rope_base"]},
  }
  return {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": info["vocab_size"],
    "hidden_size": info["embed_dim"],
    "intermediate_size": info["mlp_dim"],
    "num_hidden_layers": n,
    "num_attention_heads": info["num_heads"],
    "num_key_value_heads": info["num_kv_heads"],
    "head_dim": info["head_dim"],
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": max_position_embeddings,
    "rms_norm_eps": info["rms_eps"],
    "rope_theta": info["global_rope_base"],
    "rope_local_base_freq": info["local_rope_base"],
    "rope_scaling": None,
    "rope_parameters": rope,
    "query_pre_attn_scalar": info["query_pre_attn_scalar"],
    "sliding_window": info["sliding_window"],
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
    "torch_dtype": common.canonical_dtype(dtype).name,
    "use_cache": True,
  }


def _json_object(path: pathlib.Path, what: str) -> dict[str, Any]:
  """The JSON object in `path`; ValueError naming the file when it is not one."""
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.DataError(
      f"{path}: not valid JSON ({e}); it must be the checkpoint's {what}"
    ) from e
  if not isinstance(value, dict):
    raise errors.DataError(
      f"{path}: expected a JSON object (the checkpoint's {what}), got {type(value).__name__}"
    )
  return value


def _open_shard(path: pathlib.Path):
  """`safetensors.safe_open(path)`; a file whose header does not parse is named."""
  try:
    return safetensors.safe_open(path, framework="numpy")
  except OSError:  # missing, unreadable: the OS error names the file and the cause
    raise
  except Exception as e:  # SafetensorError is not importable from one stable place
    raise errors.DataError(
      f"{path}: not a readable safetensors file ({type(e).__name__}: {e}); the file is "
      "truncated or corrupt: download or export it again"
    ) from e


def _shards(ckpt_dir: pathlib.Path) -> list[pathlib.Path]:
  """The safetensors files of a checkpoint directory (index json if present)."""
  index = ckpt_dir / _INDEX
  if index.exists():
    weight_map = _json_object(index, "shard index").get("weight_map")
    if not isinstance(weight_map, dict):
      raise errors.DataError(f"{index}: no 'weight_map' object (tensor name -> shard file)")
    files = [ckpt_dir / f for f in sorted(set(weight_map.values()))]
    absent = [str(f) for f in files if not f.exists()]
    if absent:
      raise FileNotFoundError(f"{index} names shards that are absent: {absent}")
    return files
  files = sorted(ckpt_dir.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(f"no *.safetensors files in {ckpt_dir}")
  return files


def _leaf(params: Mapping[str, Any], path: tuple) -> np.ndarray:
  """params["embed"] / params["layers"][leaf][i] for a path from `hf_names`."""
  node = params
  for key in path:
    node = node[key]
  return node


def _text_prefix(names: Mapping[str, Any], ckpt_dir: pathlib.Path) -> str:
  for prefix in _PREFIXES:
    if f"{prefix}embed_tokens.weight" in names:
      return prefix
  raise errors.DataError(
    f"{ckpt_dir}: no embed_tokens.weight under any of the prefixes "
    f"{_PREFIXES}; tensors start with {sorted(names)[:5]}"
  )


def _check_names(where, names, prefix: str, ckpt_dir: pathlib.Path) -> None:
  """Raises on missing text weights and on unknown ones under the text prefix."""
  missing = sorted(n for n in names if n not in where)
  unknown = sorted(n for n in where if n.startswith(prefix) and n not in names)
  if missing or unknown:
    raise errors.DataError(
      f"{ckpt_dir}: tensors do not match config.json: missing "
      f"{missing[:20]}, unexpected {unknown[:20]} (lists cut at 20)"
    )


def load_hf_checkpoint(
  ckpt_dir: str | os.PathLike, dtype: Any = np.float32
) -> tuple[dict[str, Any], dict[str, Any]]:
  """Loads a Hugging Face Gemma 3 text checkpoint directory.

  Args:
    ckpt_dir: directory with config.json and *.safetensors (one file or shards).
    dtype: float32 (default), bfloat16 or float16 for the returned arrays.

  Returns:
    (params, info) as from `load_gguf`: numpy params pytree, Config-field dict.
  """
  ckpt_dir = pathlib.Path(ckpt_dir)
  config_path = ckpt_dir / "config.json"
  if not config_path.exists():
    raise FileNotFoundError(
      f"{config_path} not found: expected a Hugging Face checkpoint "
      "directory (config.json + *.safetensors)"
    )
  info = hf_config_to_info(_json_object(config_path, "model config"), str(config_path))
  params = common.empty_params(info, common.canonical_dtype(dtype))
  handles = [_open_shard(f) for f in _shards(ckpt_dir)]
  where = {name: h for h in handles for name in h.keys()}
  prefix = _text_prefix(where, ckpt_dir)
  names = hf_names(info["num_layers"], prefix)
  _check_names(where, names, prefix, ckpt_dir)
  for name, (path, linear) in names.items():
    arr, dest = where[name].get_tensor(name), _leaf(params, path)
    want = dest.shape[::-1] if linear else dest.shape
    if arr.shape != want:
      raise errors.DataError(
        f"{ckpt_dir}: tensor {name} has shape {arr.shape}, config.json implies {want}"
      )
    if len(path) == 1:  # embed / final_norm: keep the freshly read array
      params[path[0]] = arr.astype(dest.dtype, copy=False)
    else:
      dest[...] = arr.T if linear else arr
  for name in (n for n in where if n.endswith("lm_head.weight")):
    if not np.array_equal(where[name].get_tensor(name), params["embed"]):
      raise errors.DataError(
        f"{ckpt_dir}: {name} differs from the embedding; untied output "
        "projections are not supported by the params layout"
      )
  return params, info


def _as_info(info_or_config: Any) -> dict[str, Any]:
  """Info dict, Config dataclass or any object with the Config fields -> dict."""
  if isinstance(info_or_config, Mapping):
    fields = dict(info_or_config)
  elif dataclasses.is_dataclass(info_or_config):
    fields = dataclasses.asdict(info_or_config)
  else:
    fields = {
      k: getattr(info_or_config, k) for k in common.INFO_FIELDS if hasattr(info_or_config, k)
    }
  return common.check_info(fields, type(info_or_config).__name__)


def export_hf_checkpoint(
  params: Mapping[str, Any],
  info_or_config: Any,
  ckpt_dir: str | os.PathLike,
  dtype: Any = np.float32,
  *,
  bos_id: int = 2,
  eos_id: int = 1,
  pad_id: int = 0,
) -> pathlib.Path:
  """Writes params as a HF `Gemma3ForCausalLM` directory.

  Args:
    params: params pytree (numpy or jax arrays).
    info_or_config: info dict or `Config` (the Config field names).
    ckpt_dir: output directory (created); config.json and model.safetensors
      are overwritten.
    dtype: stored dtype: float32 (default), bfloat16 or float16.
    bos_id, eos_id, pad_id: special token ids written to config.json.

  Returns:
    The checkpoint directory.
  """
  info = _as_info(info_or_config)
  params = {
    "embed": np.asarray(params["embed"]),
    "final_norm": np.asarray(params["final_norm"]),
    "layers": {k: np.asarray(v) for k, v in params["layers"].items()},
  }
  common.check_params(params, info)
  dt = common.canonical_dtype(dtype)
  tensors = {}
  for name, (path, linear) in hf_names(info["num_layers"]).items():
    arr = _leaf(params, path)
    tensors[name] = np.ascontiguousarray(arr.T if linear else arr, dtype=dt)
  ckpt_dir = pathlib.Path(ckpt_dir)
  ckpt_dir.mkdir(parents=True, exist_ok=True)
  safetensors.numpy.save_file(tensors, ckpt_dir / "model.safetensors", metadata={"format": "pt"})
  config = info_to_hf_config(info, dtype=dt, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
  (ckpt_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
  return ckpt_dir
