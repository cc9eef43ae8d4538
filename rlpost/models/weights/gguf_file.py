"""Fast GGUF container reading: metadata, tensor index and raw tensor bytes.

`gguf.GGUFReader` builds about a million numpy memmap views while it parses the
262,144-entry Gemma 3 vocabulary and takes 10-16 s on a laptop CPU. This module
parses the same layout (GGUF v2/v3, little-endian) with `struct` in well under
a second, using the `gguf` package's type tables, and leaves the numerics to
`gguf.quants.dequantize`. `tests/test_weights.py` checks it against GGUFReader.
"""

import dataclasses
import math
import mmap
import os
import struct
from typing import Any

import gguf
import numpy as np

from rlpost import errors

_VT = gguf.GGUFValueType
_SCALARS = {  # value type -> (struct format, python type)
  _VT.UINT8: ("<B", int),
  _VT.INT8: ("<b", int),
  _VT.UINT16: ("<H", int),
  _VT.INT16: ("<h", int),
  _VT.UINT32: ("<I", int),
  _VT.INT32: ("<i", int),
  _VT.UINT64: ("<Q", int),
  _VT.INT64: ("<q", int),
  _VT.FLOAT32: ("<f", float),
  _VT.FLOAT64: ("<d", float),
  _VT.BOOL: ("<?", bool),
}
_NUMPY = {  # numeric array element type -> numpy dtype
  _VT.UINT8: np.uint8,
  _VT.INT8: np.int8,
  _VT.UINT16: np.uint16,
  _VT.INT16: np.int16,
  _VT.UINT32: np.uint32,
  _VT.INT32: np.int32,
  _VT.UINT64: np.uint64,
  _VT.INT64: np.int64,
  _VT.FLOAT32: np.float32,
  _VT.FLOAT64: np.float64,
  _VT.BOOL: np.bool_,
}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """One tensor of a GGUF file.

  Attributes:
    name: GGUF tensor name, e.g. "blk.0.attn_q.weight".
    shape: numpy (row-major) shape, i.e. gguf-py's ggml-order shape reversed.
      For a linear layer this is [out, in].
    qtype: storage type (F32, Q8_0, Q4_K, ...).
    offset: absolute byte offset of the data in the file.
    nbytes: size of the stored data in bytes.
  """

  name: str
  shape: tuple[int, ...]
  qtype: gguf.GGMLQuantizationType
  offset: int
  nbytes: int


@dataclasses.dataclass(frozen=True, eq=False)
class GGUFFile:
  """A parsed GGUF file: `metadata` maps keys to Python values (numeric arrays
  as numpy arrays, string arrays as lists); `tensors` maps names to TensorInfo.
  """

  path: str
  metadata: dict[str, Any]
  tensors: dict[str, TensorInfo]
  buffer: mmap.mmap = dataclasses.field(repr=False)

  def raw(self, name: str) -> np.ndarray:
    """Stored bytes of tensor `name`: uint8 [*shape[:-1], row_bytes], zero-copy."""
    info = self.tensors[name]
    data = np.frombuffer(self.buffer, np.uint8, count=info.nbytes, offset=info.offset)
    return data.reshape(*info.shape[:-1], -1)

  def dequantize(self, name: str) -> np.ndarray:
    """Tensor `name` as float32 with shape `tensors[name].shape`."""
    info = self.tensors[name]
    return np.asarray(gguf.quants.dequantize(self.raw(name), info.qtype), np.float32)


class _Cursor:
  """Sequential little-endian reader over a buffer."""

  def __init__(self, buf, offset: int = 0):
    self.buf, self.off = buf, offset

  def unpack_tuple(self, fmt: str) -> tuple:
    values = struct.unpack_from(fmt, self.buf, self.off)
    self.off += struct.calcsize(fmt)
    return values

  def unpack(self, fmt: str):
    values = self.unpack_tuple(fmt)
    return values[0] if len(values) == 1 else values

  def string(self) -> str:
    n = self.unpack("<Q")
    start, self.off = self.off, self.off + n
    return self.buf[start : self.off].decode("utf-8")

  def value(self, vtype: int) -> Any:
    vtype = _VT(vtype)
    if vtype == _VT.STRING:
      return self.string()
    if vtype in _SCALARS:
      fmt, cast = _SCALARS[vtype]
      return cast(self.unpack(fmt))
    etype, count = self.unpack("<IQ")
    etype = _VT(etype)
    if etype in _NUMPY:
      arr = np.frombuffer(self.buf, _NUMPY[etype], count=count, offset=self.off).copy()
      self.off += arr.nbytes
      return arr
    if etype == _VT.STRING:
      return [self.string() for _ in range(count)]
    return [self.value(etype) for _ in range(count)]


def _metadata(cur: _Cursor, count: int) -> dict[str, Any]:
  """Reads `count` key-value pairs from the cursor."""
  metadata = {}
  for _ in range(count):
    key = cur.string()
    metadata[key] = cur.value(cur.unpack("<I"))
  return metadata


def _check_magic(cur: _Cursor, path: str) -> None:
  magic, version = cur.unpack("<4sI")
  if magic != b"GGUF":
    raise errors.DataError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
  if version not in (2, 3):
    raise errors.DataError(
      f"{path}: GGUF version {version} is not supported (only little-endian "
      "v2/v3; big-endian files show a byte-swapped version)"
    )


def _tensor_index(cur: _Cursor, count: int, data_start_fn, size: int, path: str):
  """Reads `count` tensor infos; returns them once the data offset is known."""
  raw = []
  for _ in range(count):
    name = cur.string()
    ndim = cur.unpack("<I")
    if not 1 <= ndim <= 4:
      raise errors.DataError(f"{path}: tensor {name} has {ndim} dimensions; GGUF allows 1 to 4")
    ggml_shape = cur.unpack_tuple(f"<{ndim}Q")
    qtype, rel = cur.unpack("<IQ")
    raw.append((name, ggml_shape, gguf.GGMLQuantizationType(qtype), rel))
  data_start = data_start_fn(cur.off)
  tensors = {}
  for name, ggml_shape, qtype, rel in raw:
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if ggml_shape[0] % block:
      raise errors.DataError(
        f"{path}: tensor {name} has row length {ggml_shape[0]}, not a "
        f"multiple of the {qtype.name} block size {block}"
      )
    nbytes = ggml_shape[0] // block * type_size * math.prod(ggml_shape[1:])
    offset = data_start + rel
    if offset + nbytes > size:
      raise errors.DataError(
        f"{path}: tensor {name} ends at byte {offset + nbytes} but the file "
        f"has {size} bytes (truncated download?)"
      )
    tensors[name] = TensorInfo(name, tuple(reversed(ggml_shape)), qtype, offset, nbytes)
  return tensors


def read_gguf(path: str | os.PathLike) -> GGUFFile:
  """Parses the header of the GGUF file at `path`; tensor data stays mapped.

  A file that ends inside its header or holds undecodable header fields (a truncated
  download, another format) raises ValueError naming the file and the byte offset.
  """
  path = os.fspath(path)
  if os.path.isfile(path) and os.path.getsize(path) == 0:
    raise errors.DataError(f"{path} is empty (0 bytes), not a GGUF file; download it again")
  with open(path, "rb") as f:
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  cur = _Cursor(buf)
  try:
    _check_magic(cur, path)
    n_tensors, n_kv = cur.unpack("<QQ")
    metadata = _metadata(cur, n_kv)
    align = int(metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT))
    tensors = _tensor_index(cur, n_tensors, lambda off: -(-off // align) * align, len(buf), path)
  except (struct.error, UnicodeDecodeError, ValueError) as e:
    if str(e).startswith(path):  # this module's own errors already say what is wrong
      raise
    raise errors.DataError(
      f"{path}: unreadable GGUF header at byte {cur.off} of {len(buf)} "
      f"({type(e).__name__}: {e}); the file is truncated or corrupt: download it again"
    ) from e
  return GGUFFile(path, metadata, tensors, buf)


def write_metadata_only(src: str | os.PathLike, dst: str | os.PathLike) -> int:
  """Writes to `dst` a GGUF holding `src`'s metadata (tokenizer included) and no tensors.

  A few MB instead of the model's hundreds: what a random-weight run needs from the
  model file, for machines the packaged GGUF cannot reach. Returns the bytes written.
  """
  src = os.fspath(src)
  with open(src, "rb") as f:
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  cur = _Cursor(buf)
  _check_magic(cur, src)
  _, n_kv = cur.unpack("<QQ")
  start = cur.off
  _metadata(cur, n_kv)
  header = buf[:8] + struct.pack("<QQ", 0, n_kv)  # magic and version as in `src`
  with open(dst, "wb") as f:
    f.write(header + buf[start : cur.off])
  return len(header) + cur.off - start
