"""Hugging Face checkpoints (config.json + safetensors) of any supported family <-> params.

config.json's `model_type` picks the family (`rlpost.models.families`) and so its weight
map (`gemma3_names`, `llama_names`).
HF stores linear weights as [out, in] (we use [in, out]) and norm weights as our params
do (Gemma's `w` with scale `1 + w`; Llama's and Qwen's `w`), so norms are copied as they
are. Loading accepts one file or shards (with or without `model.safetensors.index.json`)
and Gemma's multimodal `language_model` prefixes; export writes a `*ForCausalLM`
directory of the family.
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
from rlpost.models import families
from rlpost.models import quant4
from rlpost.models.weights import common

_INDEX = "model.safetensors.index.json"


def family_of(config: Mapping[str, Any], source: str = "config.json") -> families.Family:
  """The family of a config.json dict (its `model_type`, or its `text_config`'s)."""
  model_type = config.get("model_type", config.get("text_config", {}).get("model_type"))
  return families.by_hf_model_type(model_type, source)


def hf_config_to_info(config: Mapping[str, Any], source: str = "config.json") -> dict:
  """HF config dict -> info dict with the family Config's field names."""
  family = family_of(config, source)
  return family.weights.hf_info(config, family, source)


def hf_config_json(
  config,
  *,
  dtype: Any = np.float32,
  bos_id: int = 2,
  eos_id: int = 1,
  pad_id: int = 0,
) -> dict[str, Any]:
  """A Config -> its family's `*ForCausalLM` config.json dict."""
  family = families.of(config)
  return {
    "architectures": [family.hf_architecture],
    "model_type": family.hf_model_types[0],
    **family.weights.hf_config(
      config, dtype=common.canonical_dtype(dtype), bos_id=bos_id, eos_id=eos_id, pad_id=pad_id
    ),
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


def _text_prefix(names: Mapping[str, Any], ckpt_dir: pathlib.Path, prefixes) -> str:
  for prefix in prefixes:
    if f"{prefix}embed_tokens.weight" in names:
      return prefix
  raise errors.DataError(
    f"{ckpt_dir}: no embed_tokens.weight under any of the prefixes "
    f"{prefixes}; tensors start with {sorted(names)[:5]}"
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
  """Loads a Hugging Face checkpoint directory of any supported family (`family_of`).

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
  hf_config = _json_object(config_path, "model config")
  family = family_of(hf_config, str(config_path))
  info = family.weights.hf_info(hf_config, family, str(config_path))
  config = family.config(**info)
  params = common.empty_params(config, common.canonical_dtype(dtype))
  handles = [_open_shard(f) for f in _shards(ckpt_dir)]
  where = {name: h for h in handles for name in h.keys()}
  prefix = _text_prefix(where, ckpt_dir, family.weights.HF_PREFIXES)
  names = family.weights.hf_names(config, prefix)
  _check_names(where, names, prefix, ckpt_dir)
  for name, (path, kind) in names.items():
    linear = kind == "linear"
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
  for name in (n for n in where if n.endswith("lm_head.weight") and n not in names):
    if not np.array_equal(where[name].get_tensor(name), params["embed"]):
      raise errors.DataError(
        f"{ckpt_dir}: {name} differs from the embedding although config.json has "
        "tie_word_embeddings; set it to false for an untied output projection"
      )
  return params, info


def _as_config(info_or_config: Any):
  """Info dict or Config dataclass -> the family's Config (the info checked)."""
  if isinstance(info_or_config, Mapping):
    fields = dict(info_or_config)
  else:
    fields = dataclasses.asdict(info_or_config)
  family = families.family(fields.get("family"))
  return family.config(**common.check_info(fields, family.config, type(info_or_config).__name__))


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
  """Writes params as a HF `*ForCausalLM` directory of the model's family.

  Args:
    params: params pytree (numpy or jax arrays); `quant4.Packed4` layer matrices (a QLoRA
      base, its adapters merged in float by `lora.merge(quant4.dequantized(params), ...)`
      or not) are written as their float values.
    info_or_config: info dict or `Config` (the Config field names).
    ckpt_dir: output directory (created); config.json and model.safetensors
      are overwritten.
    dtype: stored dtype: float32 (default), bfloat16 or float16.
    bos_id, eos_id, pad_id: special token ids written to config.json.

  Returns:
    The checkpoint directory.
  """
  config = _as_config(info_or_config)
  arrays = {k: np.asarray(v) for k, v in params.items() if k not in ("layers", "unembed")}
  layers = quant4.dequantized(params)["layers"]  # a 4-bit (QLoRA) base is written as float
  params = {**arrays, "layers": {k: np.asarray(v) for k, v in layers.items()}}
  common.check_params(params, config)
  dt = common.canonical_dtype(dtype)
  tensors = {}
  for name, (path, kind) in families.of(config).weights.hf_names(config).items():
    arr = _leaf(params, path)
    tensors[name] = np.ascontiguousarray(arr.T if kind == "linear" else arr, dtype=dt)
  ckpt_dir = pathlib.Path(ckpt_dir)
  ckpt_dir.mkdir(parents=True, exist_ok=True)
  safetensors.numpy.save_file(tensors, ckpt_dir / "model.safetensors", metadata={"format": "pt"})
  hf_config = hf_config_json(config, dtype=dt, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
  (ckpt_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
  return ckpt_dir
