"""GGUF Q4_0 / Q4_1 / Q4_K tensors kept packed: raw blocks -> `quant4.Packed4`.

The nibbles stay as stored (one byte copy out of the interleaved blocks); the float16
scales stay float16 and Q4_K's 6-bit sub-block scales and mins are unpacked to one
byte each (llama.cpp's `get_scale_min_k4` layout: sub-blocks 0-3 in the low 6 bits of
bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 in the nibbles of bytes 8-11 with
their top two bits in the top bits of bytes 0-7). `quant4.dequantize` of the result
equals `gguf.quants.dequantize` of the bytes bit for bit (tests/test_gguf_packed.py).

`load_gguf_packed` loads a file as `gguf.load_gguf` does and replaces each layer
matrix stack whose every layer is stored in one of these types by a stacked Packed4
[L, ...]; other types are dequantised as before.
"""

import gguf as gguf_lib
import numpy as np

from rlpost.models import quant4

Q = gguf_lib.GGMLQuantizationType
PACKED_TYPES = {Q.Q4_0: "q4_0", Q.Q4_1: "q4_1", Q.Q4_K: "q4_k"}


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
  """Bytes start, start + 1 of each block [..., n, size] as float16 [..., n]."""
  return np.ascontiguousarray(blocks[..., start : start + 2]).view(np.float16)[..., 0]


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Q4_K's 12 scale bytes [..., 12] -> (scales, mins) uint8 [..., 8], 6 bits each."""
  low, high, mixed = s[..., 0:4], s[..., 4:8], s[..., 8:12]
  sc = np.concatenate([low & 63, (mixed & 15) | ((low >> 6) << 4)], axis=-1)
  mn = np.concatenate([high & 63, (mixed >> 4) | ((high >> 6) << 4)], axis=-1)
  return sc, mn


def from_raw(raw: np.ndarray, qtype) -> quant4.Packed4:
  """A tensor's stored bytes [O, row_bytes] (`GGUFFile.raw`) -> Packed4 of W [I, O]."""
  fmt = PACKED_TYPES.get(Q(qtype))
  if fmt is None:
    raise ValueError(f"from_raw: {Q(qtype).name} is not kept packed; use {list(PACKED_TYPES)}")
  _, size = gguf_lib.GGML_QUANT_SIZES[Q(qtype)]
  O = raw.shape[0]
  blocks = raw.reshape(O, -1, size)
  codes = lambda start: np.ascontiguousarray(blocks[..., start:]).reshape(O, -1)
  if fmt == "q4_0":
    return quant4.Packed4(codes(2), {"d": _f16(blocks, 0)}, fmt)
  if fmt == "q4_1":
    return quant4.Packed4(codes(4), {"d": _f16(blocks, 0), "m": _f16(blocks, 2)}, fmt)
  sc, mn = _k4_scales(blocks[..., 4:16])
  scales = {
    "d": _f16(blocks, 0),
    "dmin": _f16(blocks, 2),
    "sc": sc.reshape(O, -1),
    "m": mn.reshape(O, -1),
  }
  return quant4.Packed4(codes(16), scales, fmt)


def take_rows(w: quant4.Packed4, rows: np.ndarray) -> quant4.Packed4:
  """The output rows `rows` of w (codes and every scale array; a numpy index [O])."""
  return quant4.Packed4(w.codes[rows], {k: v[rows] for k, v in w.scales.items()}, w.fmt)


def stack(parts: list[quant4.Packed4]) -> quant4.Packed4:
  """Per-layer Packed4s (one format) -> one stacked [L, ...] Packed4 (numpy)."""
  scales = {k: np.stack([p.scales[k] for p in parts]) for k in parts[0].scales}
  return quant4.Packed4(np.stack([p.codes for p in parts]), scales, parts[0].fmt)
