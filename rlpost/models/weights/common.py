"""Shared pieces of the weight loaders: info dicts, the params layout, dtypes, checks.

An `info` dict carries exactly the fields of a family's `Config`, `family` among them
(`check_info`); the loaders build the Config with `rlpost.models.families`. The params
pytree (numpy arrays; `jax.device_put` it once before use) has the layout of
`rlpost.models.decoder` (`decoder.param_shapes`).

Tensor kinds in the family weight maps (`gemma3_names`, `llama_names`):
  linear         stored [out, in], transposed to our [in, out]
  plain          copied as stored (embeddings, biases, norms stored as w)
  norm_plus_one  a norm stored as 1 + w (Gemma's GGUF): 1 is subtracted
  rope_rows:N    a q/k matrix whose rows llama.cpp's converter permuted for its
                 interleaved RoPE (N heads): un-permuted, then transposed
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from rlpost import errors
from rlpost.models import architecture, decoder

LINEARS = decoder.MATRICES  # the layer matrices, stored [out, in] in checkpoints
# Keys every HF decoder config.json has (the family maps read the rest).
HF_REQUIRED = (
  "vocab_size",
  "hidden_size",
  "num_hidden_layers",
  "num_attention_heads",
  "num_key_value_heads",
  "intermediate_size",
)
_POSITIVE = architecture.SIZES + ("sliding_window", "global_every")
_REQUIRED = object()


_DTYPES = {
  "float32": np.dtype(np.float32),
  "bfloat16": np.dtype(ml_dtypes.bfloat16),
  "float16": np.dtype(np.float16),
}


def canonical_dtype(dtype: Any) -> np.dtype:
  """np.float32 / "bfloat16" / jnp.bfloat16 / ... -> numpy dtype; others raise."""
  try:
    name = np.dtype(dtype).name
  except TypeError:
    name = str(dtype)
  name = {"bf16": "bfloat16", "f32": "float32", "f16": "float16"}.get(name, name)
  if name not in _DTYPES:
    raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(_DTYPES)}")
  return _DTYPES[name]


def empty_params(config, dtype: np.dtype) -> dict[str, Any]:
  """Uninitialised params of `config`'s shapes, filled in place by the loaders."""
  shapes = decoder.param_shapes(config)
  arrays = {k: np.empty(s, dtype) for k, s in shapes.items() if k != "layers"}
  return {**arrays, "layers": {k: np.empty(s, dtype) for k, s in shapes["layers"].items()}}


def check_info(info: Mapping[str, Any], config_type: type, source: str) -> dict[str, Any]:
  """Validates an info dict of a `config_type` (its field set, positive sizes,
  divisibility); DataError naming `source`. Returns it in the Config's field order."""
  fields = tuple(f.name for f in dataclasses.fields(config_type))
  missing = [k for k in fields if k not in info]
  if missing:
    raise errors.DataError(f"{source}: info lacks fields {missing}")
  for k in (k for k in _POSITIVE if k in fields):
    if not isinstance(info[k], (int, np.integer)) or info[k] <= 0:
      raise errors.DataError(f"{source}: {k}={info[k]!r} must be a positive integer")
  if info["num_heads"] % info["num_kv_heads"]:
    raise errors.DataError(
      f"{source}: num_heads={info['num_heads']} is not a multiple of "
      f"num_kv_heads={info['num_kv_heads']}"
    )
  return {k: info[k] for k in fields}


def check_params(params: Mapping[str, Any], config) -> None:
  """Raises ValueError naming every leaf whose shape does not match `config`."""
  want = decoder.param_shapes(config)
  bad = [
    f"{k}: {getattr(params.get(k), 'shape', None)} != {s}"
    for k, s in want.items()
    if k != "layers" and tuple(getattr(params.get(k), "shape", ())) != s
  ]
  layers = params.get("layers", {})
  bad += [
    f"layers/{k}: {getattr(layers.get(k), 'shape', None)} != {s}"
    for k, s in want["layers"].items()
    if tuple(getattr(layers.get(k), "shape", ())) != s
  ]
  if bad:
    raise ValueError("params do not match the model info: " + "; ".join(bad))


def require_keys(cfg: Mapping[str, Any], keys, source: str, what: str) -> None:
  missing = [k for k in keys if k not in cfg]
  if missing:
    raise errors.DataError(f"{source}: missing keys {missing} (is this a {what} config?)")


def gguf_getter(gf, arch: str):
  """get(key, default) of `{arch}.{key}` in a GGUF's metadata; a missing key without a
  default is named with the fix."""

  def get(key, default=_REQUIRED):
    full = f"{arch}.{key}"
    if full not in gf.metadata and default is _REQUIRED:
      raise errors.DataError(
        f"{gf.path}: metadata key {full!r} is missing; re-convert the model "
        "with a current llama.cpp convert_hf_to_gguf.py"
      )
    return gf.metadata.get(full, default)

  return get


def gguf_vocab_size(gf) -> int:
  """Rows of the GGUF's token embedding (else the tokenizer's vocabulary length)."""
  embed = gf.tensors.get("token_embd.weight")
  return int(embed.shape[0] if embed else len(gf.metadata.get("tokenizer.ggml.tokens", ())))


def global_every_from_flags(is_global: list[bool], source: str) -> int:
  """Period g of a per-layer global-attention pattern (layer i global iff
  i % g == g - 1); a pattern with no global layer gives max(6, L + 1)."""
  flags = [bool(x) for x in is_global]
  period = flags.index(True) + 1 if True in flags else max(6, len(flags) + 1)
  if flags != [i % period == period - 1 for i in range(len(flags))]:
    raise errors.DataError(
      f"{source}: per-layer attention pattern {flags} (True = global) is "
      f"not 'one global layer every {period}'; other patterns are not "
      "supported"
    )
  return period
