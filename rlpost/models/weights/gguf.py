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
from rlpost.models.weights import common, gguf_file, gguf_packed, packaged

_CHUNK_ELEMENTS = 1 << 22  # dequantize ~16 MB of float32 at a time


def family_of(gf: gguf_file.GGUFFile) -> families.Family:
  """The family of the file's `general.architecture`; DataError listing the supported."""
  return families.by_gguf_architecture(gf.metadata.get("general.architecture"), str(gf.path))


def tensor_kinds(family: families.Family, config) -> list[tuple[str, tuple, str]]:
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
  targets = [(n, _leaf(params, path), kind) for n, path, kind in tensor_kinds(family, config)]
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


def _packed_stacks(gf, targets) -> tuple[dict[str, Any], dict[str, str]]:
  """({leaf: stacked Packed4}, {GGUF name: leaf}) for each layer matrix whose every
  layer's tensor has one type of `gguf_packed.PACKED_TYPES` (q/k rows un-permuted as
  `_fill` does)."""
  by_leaf: dict[str, list] = {}
  for name, path, kind in targets:
    if path[0] == "layers" and kind != "plain":
      by_leaf.setdefault(path[1], []).append((name, kind))
  stacks = {}
  for leaf, tensors in by_leaf.items():
    types = {gf.tensors[name].qtype for name, _ in tensors}
    if len(types) > 1 or next(iter(types)) not in gguf_packed.PACKED_TYPES:
      continue
    parts = []
    for name, kind in tensors:
      w = gguf_packed.from_raw(gf.raw(name), gf.tensors[name].qtype)
      if kind.startswith("rope_rows:"):
        rows = np.arange(w.codes.shape[0])[:, None]
        w = gguf_packed.take_rows(w, unpermute_rope_rows(rows, int(kind.split(":")[1]))[:, 0])
      parts.append(w)
    stacks[leaf] = gguf_packed.stack(parts)
  return stacks, {name: leaf for leaf in stacks for name, _ in by_leaf[leaf]}


def load_gguf(
  path: str | os.PathLike | None = None, dtype: Any = np.float32, packed: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
  """Loads and dequantizes a GGUF file of any supported family (`families.FAMILIES`).

  Args:
    path: the .gguf file; None means `packaged.default_gguf_path()` (Gemma 3 270M).
    dtype: float32 (default), bfloat16 or float16; values are dequantized in
      float32 and rounded once.
    packed: keep the layer matrices stored as Q4_0 / Q4_1 / Q4_K (every layer in one
      of them) as `quant4.Packed4` stacks instead (`_packed_stacks`).

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
  stacks, stacks_of = _packed_stacks(gf, tensor_kinds(family, config)) if packed else ({}, {})
  jobs = []
  for name, dest, kind in _targets(gf, family, config, params):
    if name in stacks_of:
      continue
    shape = gf.tensors[name].shape
    whole = kind.startswith("rope_rows:") or len(shape) == 1
    step = shape[0] if whole else max(1, _CHUNK_ELEMENTS // shape[-1])
    for r0 in range(0, shape[0] if len(shape) > 1 else 1, step):
      jobs.append((name, dest, kind, slice(r0, r0 + step)))
  workers = min(4, os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # numpy drops the GIL
    for future in [pool.submit(_fill, gf, *job) for job in jobs]:
      future.result()
  return {**params, "layers": {**params["layers"], **stacks}}, info
