"""A native CPU matmul over 4-bit weights as stored: the decode steps' `dense4` path.

XLA:CPU emits a dot as a library call that fuses no producer, so `quant4.dense4` writes
each dequantised half of W [O, I / 2] to a float32 buffer before the dot reads it, and in
the sampler's decode loop it hoists that dequantisation out of the loop: a float32 copy of
the layers, read every step (a multiply-and-reduce formulation ran slower still).
`q4_native.cc` holds XLA FFI handlers that read the codes as stored and multiply them
into the rows of x in registers (AVX-512, AVX2 or plain C++: compiled at first use with
`-march=native`), their outputs split over the calling thread and XLA's intra-op pool.

`NativeQ4` is a `quant4.Packed4` laid out for it: the same codes, with one scale and
shift per 32 inputs and a 16-entry table, so w = table[code] * scale + shift in one
rounding: the code itself for the GGUF formats (the value `quant4.halves` gives);
for NF4 its levels rounded to int8 (round(127 level), the scale absmax / 127: within
0.4% of the absmax of quant4's NF4 value). `matmul(x, w)` is x [N, I] @ W -> [N, O]
float32 with x's rows rounded to int8 per 32 inputs (scale max |x| / 127, as llama.cpp's
Q8 activations), so every group's sum is an integer dot product (AVX-512 VNNI, or
AVX2 / AVX-512 maddubs): a sampler-side rounding, corrected like int8 rollouts' by TIS.
`NativeRows` (int8, one scale an output row) is the output projection's and, in a GGUF's
4-bit copy, the other layers' layout, multiplied the same way by `rows_matmul`.

The same library holds the decode steps' attention (`decode_attention.cc`, called by
`attention.decode_native`). It is built once per sources, compiler, jaxlib, CPU and `-march` into
`~/.cache/rlpost/q4_native/` (RLPOST_CACHE_DIR moves it); `available()` says whether it
built, and why not (no compiler, an unsupported backend).
"""

import ctypes
import dataclasses
import functools
import hashlib
import os
import pathlib
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.models import quant, quant4

TARGET = "rlpost_q4_matmul"
ROWS_TARGET = "rlpost_rows_matmul"
GROUP = 32  # inputs per scale and shift
CHUNK = 64  # outputs per task handed to a thread
MAX_ROWS = 16  # `dense` calls the library up to this many rows
ATTENTION_TARGET = "rlpost_decode_attention"
# the library's sources: the 4-bit and int8 matmuls, and the decode steps' attention
_SOURCES = tuple(
  pathlib.Path(__file__).with_name(n) for n in ("q4_native.cc", "decode_attention.cc")
)
_IDENTITY = np.arange(16, dtype=np.int8)
NF4_INT8 = np.round(quant4.NF4_LEVELS * 127).astype(np.int8)  # NF4's levels in 127ths


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NativeQ4:
  """W [I, O] for `matmul`: codes uint8 [O, I / 2] (quant4's nibble order, `half`
  inputs a nibble run), scale and shift [O, I / 32]: float16 for Q4_0 / Q4_1 (their
  stored values) and NF4 (absmax / 127 rounded), float32 for Q4_K (d * sc exactly);
  `fmt`: the Packed4 format it came from ("nf4" for both NF4 formats), which names its
  16-entry table (`table`)."""

  codes: jax.Array
  scale: jax.Array
  shift: jax.Array
  half: int = dataclasses.field(metadata={"static": True})
  fmt: str = dataclasses.field(metadata={"static": True})

  @property
  def shape(self) -> tuple[int, int]:
    O, half_I = self.codes.shape
    return (2 * half_I, O)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class NativeRows:
  """An int8 matrix with one scale an output row, for `rows_matmul`: q int8 [..., O, I],
  scale float32 [..., O]. The sampler's output projection (`quant.quantize_rows`; V rows
  of D inputs, the fields `decoder.embed_rows` gathers the input rows from), and in the
  4-bit copy the layer matrices a GGUF stores in neither 4-bit format (Gemma 3 270M's
  Q5_0 / Q6_K / Q8_0: `for_decode`)."""

  q: jax.Array
  scale: jax.Array


def table(fmt: str) -> np.ndarray:
  """The 16 values (int8) a code stands for before scaling: NF4's levels in 127ths, else
  the code itself."""
  return NF4_INT8 if fmt == "nf4" else _IDENTITY


def _per_group(a: jax.Array, inputs_per_value: int) -> jax.Array:
  """Values per `inputs_per_value` inputs [O, n] -> per 32 inputs [O, I / 32] float32."""
  return jnp.repeat(a.astype(jnp.float32), inputs_per_value // GROUP, axis=-1)


def from_packed(w: quant4.Packed4) -> NativeQ4:
  """`w` ([..., O, I / 2] codes: a matrix or a stack of them) as `matmul` reads it; every
  format of `quant4.FORMATS` (ValueError when 32 does not divide the inputs)."""
  if not supports(w):
    raise ValueError(f"q4_native.from_packed: inputs {w.shape[-2]} are not a multiple of {GROUP}")
  w = quant4.undouble(w)
  h, s = quant4.half(w), w.scales
  if w.fmt == "nf4":  # absmax / 127 rounded to float16
    scale = (_per_group(s["absmax"], 2 * h) / 127.0).astype(jnp.float16)
    return NativeQ4(w.codes, scale, jnp.zeros_like(scale), h, "nf4")
  if w.fmt == "q4_k":  # sc, m per 32 inputs; d, dmin per 256: float32 holds d * sc exactly
    scale = _per_group(s["d"], 256) * s["sc"].astype(jnp.float32)
    shift = -(_per_group(s["dmin"], 256) * s["m"].astype(jnp.float32))
    return NativeQ4(w.codes, scale, shift, h, w.fmt)
  # q4_0, q4_1: d (and m) float16 per 32 inputs, as stored (-8 d is exact too)
  scale = _per_group(s["d"], 32).astype(jnp.float16)
  shift = _per_group(s["m"], 32).astype(jnp.float16) if w.fmt == "q4_1" else -8.0 * scale
  return NativeQ4(w.codes, scale, shift, h, w.fmt)


def concatenate_outputs(parts: list[NativeQ4]) -> NativeQ4:
  """Matrices with the same inputs side by side: [I, O1], [I, O2] -> [I, O1 + O2]."""
  if len({(p.fmt, p.half, p.codes.shape[-1]) for p in parts}) != 1:
    raise ValueError("q4_native.concatenate_outputs: the matrices differ in format or inputs")
  cat = lambda *a: jnp.concatenate(a, axis=-2)
  return NativeQ4(
    cat(*[p.codes for p in parts]),
    cat(*[p.scale for p in parts]),
    cat(*[p.shift for p in parts]),
    parts[0].half,
    parts[0].fmt,
  )


def supports(w: quant4.Packed4) -> bool:
  """Whether `from_packed` takes `w`: inputs in whole groups of 32."""
  return (2 * w.codes.shape[-1]) % GROUP == 0


def halves(w: NativeQ4) -> tuple[jax.Array, jax.Array]:
  """The float32 values under the low and the high nibbles, each [..., O, I / 2] (XLA: a
  select tree over the table, one rounding): `quant4.halves`' for the GGUF formats."""
  per_input = lambda a: quant4.split_inputs(
    jnp.repeat(a.astype(jnp.float32), GROUP, axis=-1), w.half
  )
  scales, shifts = per_input(w.scale), per_input(w.shift)
  out = []
  for code, scale, shift in zip((w.codes & 15, w.codes >> 4), scales, shifts):
    values = [jnp.float32(v) for v in table(w.fmt).astype(np.float32)]
    for bit in range(4):
      on = ((code >> bit) & 1) == 1
      values = [jnp.where(on, values[2 * j + 1], values[2 * j]) for j in range(len(values) // 2)]
    out.append(values[0] * scale + shift)
  return tuple(out)


def matmul(x_NxI: jax.Array, w: NativeQ4, march: str = "native") -> jax.Array:
  """x [N, I] @ W [I, O] -> [N, O] float32 through the native library (CPU) built for
  `march` (the compiler's -march: "native", or e.g. "x86-64-v3" for AVX2 alone), x's
  rows rounded to int8 per 32 inputs (module docstring)."""
  ok, why = available(march)
  if not ok:
    raise RuntimeError(f"q4_native.matmul: {why}")
  N, O = x_NxI.shape[0], w.codes.shape[0]
  call = jax.ffi.ffi_call(_target(march), jax.ShapeDtypeStruct((N, O), jnp.float32))
  return call(
    x_NxI.astype(jnp.float32),
    w.codes,
    w.scale,
    w.shift,
    jnp.asarray(table(w.fmt)),
    half=np.int64(w.half),
    chunk=np.int64(CHUNK),
    signed_table=w.fmt == "nf4",
  )


def rows_matmul(x_NxD: jax.Array, w: NativeRows, march: str = "native") -> jax.Array:
  """x [N, D] @ W.T -> [N, V] float32 for W [V, D] int8 with one scale a row, x's rows
  rounded to int8 per 32 inputs as in `matmul`."""
  ok, why = available(march)
  if not ok:
    raise RuntimeError(f"q4_native.rows_matmul: {why}")
  N, V = x_NxD.shape[0], w.q.shape[0]
  call = jax.ffi.ffi_call(_target(march, ROWS_TARGET), jax.ShapeDtypeStruct((N, V), jnp.float32))
  return call(x_NxD.astype(jnp.float32), w.q, w.scale, chunk=np.int64(4 * CHUNK))


def rows_dense(x: jax.Array, w: NativeRows) -> jax.Array:
  """x [..., I] @ W [I, O] -> [..., O] float32 for the int8 layer matrix W.T = `w`:
  `rows_matmul` for up to MAX_ROWS rows, else XLA's float32 dot (a prefill)."""
  lead, I = x.shape[:-1], x.shape[-1]
  x = x.reshape(-1, I).astype(jnp.float32)
  if x.shape[0] <= MAX_ROWS:
    y = rows_matmul(x, w)
  else:
    y = jnp.einsum("ni,oi->no", x, w.q.astype(jnp.float32)) * w.scale[None, :]
  return y.reshape(*lead, w.q.shape[-2])


def rows_from_dense(w_IxO: jax.Array) -> NativeRows:
  """A float layer matrix (stack) [..., I, O] as NativeRows: int8 per output row, scale
  max |row| / 127 (1 for an all-zero row)."""
  w_OxI = jnp.swapaxes(w_IxO, -1, -2).astype(jnp.float32)
  absmax = jnp.max(jnp.abs(w_OxI), axis=-1)
  scale = jnp.where(absmax > 0, absmax / 127.0, 1.0)
  q = jnp.clip(jnp.round(w_OxI / scale[..., None]), -127, 127).astype(jnp.int8)
  return NativeRows(q, scale)


def concatenate_rows(parts: list[NativeRows]) -> NativeRows:
  """Matrices with the same inputs side by side: [I, O1], [I, O2] -> [I, O1 + O2]."""
  return NativeRows(
    jnp.concatenate([p.q for p in parts], axis=-2),
    jnp.concatenate([p.scale for p in parts], axis=-1),
  )


def logits(x_BxD: jax.Array, w: NativeRows) -> jax.Array:
  """The output projection's logits [V, B] float32: `rows_matmul` for up to MAX_ROWS
  rows, else `quant.vocab_major` (XLA's int8 dot)."""
  if x_BxD.shape[0] <= MAX_ROWS:
    return rows_matmul(x_BxD, w).T
  return quant.vocab_major(quant.Int8Weight(w.q, w.scale, "rows"), x_BxD)


def after(x: jax.Array) -> jax.Array:
  """A float32 0 that XLA can compute only once `x` exists: added to values that depend on
  weights alone, it keeps XLA:CPU from computing them before they are needed (its
  `optimization_barrier`s are gone before it schedules). 0 whatever x holds (NaN, inf)."""
  return jnp.isfinite(x.reshape(-1)[0]).astype(jnp.float32) * 0.0


def dense(x: jax.Array, w: NativeQ4) -> jax.Array:
  """x [..., I] @ W [I, O] -> [..., O] float32: `matmul` for up to MAX_ROWS rows (the
  decode steps), else XLA's dot over `halves` (a prefill: a library matmul wins there).

  The halves are float32 [O, I / 2] each and depend on `w` alone: in the sampler's
  unrolled prefill XLA computed every layer's before the first layer ran, all live at
  once (Gemma 3 1B: 2.6 GiB). Tied to `x` (`after`), a layer's halves are made when its
  input is, one layer's at a time."""
  lead, I = x.shape[:-1], x.shape[-1]
  x = x.reshape(-1, I).astype(jnp.float32)
  if x.shape[0] <= MAX_ROWS:
    y = matmul(x, w)
  else:
    x_lo, x_hi = quant4.split_inputs(x, w.half)
    w_lo, w_hi = (h + after(x) for h in halves(w))
    dot = lambda a, b: jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())))
    y = dot(x_lo, w_lo) + dot(x_hi, w_hi)
  return y.reshape(*lead, w.codes.shape[-2])


def _layer_for_decode(w):
  if isinstance(w, quant4.Packed4):
    return from_packed(w)
  if w.ndim == 3 and (w.shape[-2] % GROUP == 0):  # a float matrix stack [L, I, O]
    return rows_from_dense(w)
  return w


def for_decode(params):
  """`params` laid out for the native kernels: every Packed4 layer matrix (stack) a
  NativeQ4, every float one [L, I, O] (a GGUF's 5-, 6- and 8-bit blocks) int8 NativeRows,
  and the int8 output projection ("unembed", if any) NativeRows: the sampler's 4-bit copy
  (`quant4.for_sampling`) laid out for `dense`, `rows_dense` and `logits`."""
  layers = {k: _layer_for_decode(w) for k, w in params["layers"].items()}
  out = {**params, "layers": layers}
  if "unembed" in params:
    out["unembed"] = rows_for_decode(params["unembed"])
  return out


def rows_for_decode(w) -> NativeRows:
  """`quant.quantize_rows`' [V, D] int8 copy as NativeRows (ValueError when 32 does not
  divide D)."""
  if w.q.shape[-1] % GROUP:
    raise ValueError(
      f"q4_native.rows_for_decode: inputs {w.q.shape[-1]} are not a multiple of {GROUP}"
    )
  return NativeRows(w.q, w.scale)


def _cache_dir() -> pathlib.Path:
  root = os.environ.get("RLPOST_CACHE_DIR", "~/.cache/rlpost")
  return pathlib.Path(os.path.expanduser(root)) / "q4_native"


def _target(march: str, target: str = TARGET) -> str:
  return target if march == "native" else f"{target}_{march.replace('-', '_')}"


def _compile_command(out: str, march: str) -> list[str]:
  return [
    os.environ.get("CXX", "g++"),
    "-O3",
    f"-march={march}",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-I",
    jax.ffi.include_dir(),
    *map(str, _SOURCES),
    "-o",
    out,
  ]


def _library_path(march: str) -> pathlib.Path:
  """Where this source, compiler, jaxlib, CPU and -march's build lives (built when
  missing; an atomic rename, so concurrent processes never read half a file)."""
  cpu = pathlib.Path("/proc/cpuinfo")
  flags = (
    next((l for l in cpu.read_text().splitlines() if l.startswith("flags")), "")
    if cpu.exists()
    else ""
  )
  compiler = subprocess.run(
    [os.environ.get("CXX", "g++"), "--version"], capture_output=True, text=True, check=True
  ).stdout
  key = hashlib.sha256(
    "\0".join(
      [*(s.read_text() for s in _SOURCES), compiler, jax.__version__, flags, march]
    ).encode()
  ).hexdigest()[:16]
  path = _cache_dir() / f"q4_native-{key}.so"
  if not path.exists():
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
      built = os.path.join(tmp, path.name)
      done = subprocess.run(_compile_command(built, march), capture_output=True, text=True)
      if done.returncode:
        raise RuntimeError(f"building {_SOURCES[0].stem} failed: {done.stderr.strip()[-400:]}")
      os.replace(built, path)
  return path


def resolve(setting: str) -> tuple[str, str]:
  """`sampling.int4_matmul` as ("native" | "xla", why): "auto" is native where the
  library builds; "native" where it does not is a ValueError naming the fix."""
  ok, why = available()
  if setting == "xla" or (setting == "auto" and not ok):
    return "xla", "set in the config" if setting == "xla" else f"native unavailable: {why}"
  if not ok:
    raise ValueError(f"sampling.int4_matmul=native: {why}; or set sampling.int4_matmul=xla")
  return "native", f"library {why}" if setting == "auto" else "set in the config"


@functools.cache
def available(march: str = "native") -> tuple[bool, str]:
  """(True, the library's path) once built for `march` and registered; (False, why)
  otherwise."""
  if jax.default_backend() != "cpu":
    return False, f"the native 4-bit matmul is for CPU; the backend is {jax.default_backend()}"
  try:
    path = _library_path(march)
    library = ctypes.cdll.LoadLibrary(str(path))
    for target, symbol in (
      (TARGET, library.RlpostQ4Matmul),
      (ROWS_TARGET, library.RlpostRowsMatmul),
      (ATTENTION_TARGET, library.RlpostDecodeAttention),
    ):
      jax.ffi.register_ffi_target(_target(march, target), jax.ffi.pycapsule(symbol), platform="cpu")
  except (OSError, RuntimeError, subprocess.SubprocessError) as e:
    return False, f"{e} (a C++ compiler: `apt install g++`, or set CXX)"
  return True, str(path)
