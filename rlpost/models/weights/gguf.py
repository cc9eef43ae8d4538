"""GGUF files (llama.cpp format) of any supported family -> dequantized params pytree.

The file's `general.architecture` picks the family (`rlpost.models.families`) and so its
weight map (`gemma3_names`, `llama_names`): its metadata reader and its tensor list with
each tensor's kind (`common` module docstring). gguf-py lists shapes in ggml order; the data reshaped to
the reversed shape is [out, in] (torch Linear layout), which we transpose to our
[in, out]; `token_embd` reversed is already [V, D].
"""

import concurrent.futures
import os
from typing import Any

import gguf as gguf_lib
import numpy as np

from rlpost import errors
from rlpost.models import families
from rlpost.models.weights import common, gguf_file, packaged

_CHUNK_ELEMENTS = 1 << 22  # dequantize ~16 MB of float32 at a time


def family_of(gf: gguf_file.GGUFFile) -> families.Family:
  """The family of the file's `general.architecture`; DataError listing the supported."""
  return families.by_gguf_architecture(gf.metadata.get("general.architecture"), str(gf.path))


def _kinds(family: families.Family, config) -> list[tuple[str, tuple, str]]:
  """The weight map's (GGUF name, params path, kind), q/k rows marked "rope_rows:N" where
  the family's converter permuted them."""
  targets = family.weights.gguf_targets(config)
  if not family.gguf_rope_rows:
    return targets
  heads = {"q": config.num_heads, "k": config.num_kv_heads}
  return [
    (
      name,
      path,
      f"rope_rows:{heads[path[1]]}" if path[0] == "layers" and path[1] in heads else kind,
    )
    for name, path, kind in targets
  ]


def _targets(gf: gguf_file.GGUFFile, family, config, params) -> list[tuple[str, np.ndarray, str]]:
  """(GGUF name, destination array, kind) for every tensor; checks names and shapes."""
  targets = [(n, _leaf(params, path), kind) for n, path, kind in _kinds(family, config)]
  extra = set(getattr(family.weights, "gguf_extra_tensors", lambda config: ())(config))
  wanted = {t[0] for t in targets} | extra
  missing = [n for n in wanted if n not in gf.tensors]
  unexpected = [n for n in gf.tensors if n not in wanted]
  if missing or unexpected:
    raise errors.DataError(
      f"{gf.path}: tensors do not match a {config.num_layers}-layer {family.name} "
      f"model: missing {sorted(missing)[:20]}, unexpected "
      f"{sorted(unexpected)[:20]} (lists cut at 20)"
    )
  for name, dest, kind in targets:
    want = dest.shape[::-1] if kind != "plain" and kind != "norm_plus_one" else dest.shape
    if gf.tensors[name].shape != want:
      raise errors.DataError(
        f"{gf.path}: tensor {name} has shape {gf.tensors[name].shape} "
        f"(numpy order), expected {want} from the metadata"
      )
  return targets


def _leaf(params, path: tuple) -> np.ndarray:
  node = params
  for key in path:
    node = node[key]
  return node


def unpermute_rope_rows(w_OxI: np.ndarray, heads: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation: within each head, rows stored as interleaved
  (pair i's two rows next to each other) go back to rotate-half order (first halves, then
  second halves). [out, in] -> [out, in]."""
  out = w_OxI.shape[0]
  return w_OxI.reshape(heads, out // heads // 2, 2, -1).swapaxes(1, 2).reshape(w_OxI.shape)


def _fill(gf, name: str, dest: np.ndarray, kind: str, rows: slice) -> None:
  """Dequantizes `rows` of tensor `name` into `dest` as its `kind` says."""
  raw = gf.raw(name)
  w = gguf_lib.quants.dequantize(raw[rows] if raw.ndim > 1 else raw, gf.tensors[name].qtype)
  if kind == "norm_plus_one":
    w = w - np.float32(1.0)  # Gemma's GGUF stores 1 + w
  if kind.startswith("rope_rows:"):
    dest[...] = unpermute_rope_rows(w, int(kind.split(":")[1])).T  # rows: the whole tensor
  elif kind == "linear":
    dest[:, rows] = w.T
  elif raw.ndim > 1:
    dest[rows] = w
  else:
    dest[...] = w


def load_gguf(
  path: str | os.PathLike | None = None, dtype: Any = np.float32
) -> tuple[dict[str, Any], dict[str, Any]]:
  """Loads and dequantizes a GGUF file of any supported family (`families.FAMILIES`).

  Args:
    path: the .gguf file; None means `packaged.default_gguf_path()` (Gemma 3 270M).
    dtype: float32 (default), bfloat16 or float16; values are dequantized in
      float32 and rounded once.

  Returns:
    (params, info): numpy params pytree (layout in `rlpost.models.weights.common`) and
    a dict of the family Config's fields read from the metadata
    (`families.config_from_info`).
  """
  gf = gguf_file.read_gguf(packaged.default_gguf_path() if path is None else path)
  family = family_of(gf)
  info = family.weights.gguf_info(gf, family)
  config = family.config(**info)
  params = common.empty_params(config, common.canonical_dtype(dtype))
  jobs = []
  for name, dest, kind in _targets(gf, family, config, params):
    shape = gf.tensors[name].shape
    whole = kind.startswith("rope_rows:") or len(shape) == 1
    step = shape[0] if whole else max(1, _CHUNK_ELEMENTS // shape[-1])
    for r0 in range(0, shape[0] if len(shape) > 1 else 1, step):
      jobs.append((name, dest, kind, slice(r0, r0 + step)))
  workers = min(4, os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # numpy drops the GIL
    for future in [pool.submit(_fill, gf, *job) for job in jobs]:
      future.result()
  return params, info
