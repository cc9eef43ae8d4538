"""Shared pieces of the weight loaders: the params layout, dtypes, shape checks.

The params pytree (numpy arrays; `jax.device_put` it once before use):

  embed       [V, D]         tied input/output embedding
  final_norm  [D]            RMSNorm weight w, the norm scales by (1 + w)
  layers/     every leaf stacked on a leading [L] axis
    attn_norm, post_attn_norm, mlp_norm, post_mlp_norm  [L, D]
    q [L, D, H*hd]  k, v [L, D, K*hd]  o [L, H*hd, D]   ([in, out]: y = x @ W)
    q_norm, k_norm [L, hd]
    gate, up [L, D, F]  down [L, F, D]

`info` dicts carry exactly the fields of `rlpost.models.gemma3.Config`.
"""

from typing import Any

import ml_dtypes
import numpy as np

from rlpost import errors

INFO_FIELDS = (
  "vocab_size",
  "embed_dim",
  "num_layers",
  "num_heads",
  "num_kv_heads",
  "head_dim",
  "mlp_dim",
  "sliding_window",
  "global_every",
  "local_rope_base",
  "global_rope_base",
  "query_pre_attn_scalar",
  "rms_eps",
)

NORMS = ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm", "q_norm", "k_norm")
LINEARS = ("q", "k", "v", "o", "gate", "up", "down")

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


def layer_shapes(info: dict[str, Any]) -> dict[str, tuple[int, ...]]:
  """Per-layer leaf shapes (without the leading [L]) in our [in, out] layout."""
  d, f, hd = info["embed_dim"], info["mlp_dim"], info["head_dim"]
  qd, kd = info["num_heads"] * hd, info["num_kv_heads"] * hd
  shapes = {n: (d,) for n in ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm")}
  shapes.update(
    q_norm=(hd,),
    k_norm=(hd,),
    q=(d, qd),
    k=(d, kd),
    v=(d, kd),
    o=(qd, d),
    gate=(d, f),
    up=(d, f),
    down=(f, d),
  )
  return shapes


def param_shapes(info: dict[str, Any]) -> dict[str, Any]:
  """The full params pytree of shapes for `info`."""
  n = info["num_layers"]
  return {
    "embed": (info["vocab_size"], info["embed_dim"]),
    "final_norm": (info["embed_dim"],),
    "layers": {k: (n, *s) for k, s in layer_shapes(info).items()},
  }


def empty_params(info: dict[str, Any], dtype: np.dtype) -> dict[str, Any]:
  """Uninitialised params of the right shapes, filled in place by the loaders."""
  shapes = param_shapes(info)
  return {
    "embed": np.empty(shapes["embed"], dtype),
    "final_norm": np.empty(shapes["final_norm"], dtype),
    "layers": {k: np.empty(s, dtype) for k, s in shapes["layers"].items()},
  }


def check_info(info: dict[str, Any], source: str) -> dict[str, Any]:
  """Validates an info dict (exact field set, positive sizes, divisibility)."""
  missing = [k for k in INFO_FIELDS if k not in info]
  if missing:
    raise errors.DataError(f"{source}: info lacks fields {missing}")
  for k in INFO_FIELDS[:9]:
    if not isinstance(info[k], (int, np.integer)) or info[k] <= 0:
      raise errors.DataError(f"{source}: {k}={info[k]!r} must be a positive integer")
  if info["num_heads"] % info["num_kv_heads"]:
    raise errors.DataError(
      f"{source}: num_heads={info['num_heads']} is not a multiple of "
      f"num_kv_heads={info['num_kv_heads']}"
    )
  return {k: info[k] for k in INFO_FIELDS}


def check_params(params: dict[str, Any], info: dict[str, Any]) -> None:
  """Raises ValueError naming every leaf whose shape does not match `info`."""
  want = param_shapes(info)
  got = {
    "embed": params["embed"].shape,
    "final_norm": params["final_norm"].shape,
    "layers": {k: params["layers"][k].shape for k in want["layers"] if k in params["layers"]},
  }
  bad = [f"{k}: {got[k]} != {want[k]}" for k in ("embed", "final_norm") if tuple(got[k]) != want[k]]
  bad += [
    f"layers/{k}: {got['layers'].get(k)} != {s}"
    for k, s in want["layers"].items()
    if tuple(got["layers"].get(k, ())) != s
  ]
  if bad:
    raise ValueError("params do not match the model info: " + "; ".join(bad))


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
