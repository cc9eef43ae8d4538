"""Int8 weights for the sampler: int8 x int8 matmuls with float32 scales.

`quantize_for_sampling(params)` makes the copy of a Gemma params pytree the sampler
reads, once per weight sync (the trainer keeps its own weights):
- every layer matrix [..., I, O] becomes an `Int8Weight` with a scale per block of
  `GROUP` input rows and output column (scale [..., I / GROUP, O]); the matmul
  quantizes its activations in the same blocks, per token, multiplies int8 x int8
  into int32 per block, and sums the blocks' products of scales in float32;
- the tied output projection gets an int8 copy under "unembed" with one scale per
  vocabulary row and per-token activation scales (one block: at decode batch sizes
  XLA:CPU's blocked int8 dot over [V, D] is slower than float32); the input lookup
  keeps reading the float "embed" (a few rows per step; no copy is made of it);
- norms stay as they are.
The sampler's prefill reads `float_view(params)` (dequantized layers, the float
output projection): at hundreds of rows the blocked int8 dots run slower than float32
(262 against 613 prompt tokens/s on our CPU); the decode steps read the int8 matrices.

On XLA:CPU int8 x int8 -> int32 is the fast int8 path: a weight-only dot that
converts int8 weights to float materializes the converted matrix first. Which operand
order and layout stream the weights fastest depends on the CPU (an AMD EPYC and an Intel
Xeon with AMX disagree: experiments/benchmarks/results/issue18/): `Int8Paths` holds the
choice, calibrated per machine by `rlpost.train.compute_paths.resolve_int8`. Every choice
computes the same int32 products and the same scaling, so it changes speed only.

Error per block: |w - q s| <= s / 2 entrywise for weights and activations alike, so
|x @ w - dense(x, w_int8)| <= sum_i (|x_i| s_w / 2 + |w_i| s_x / 2 + s_x s_w / 4)
over each block (`matmul_error_bound`).
"""

import dataclasses

import jax
import jax.numpy as jnp

from rlpost import errors

_QMAX = 127.0
# Input rows per scale block of a layer matrix (and of its activations); a matrix whose
# row count it does not divide is one block. 256 blocks the o and down projections of
# Gemma 3 270M (inputs 1024, 2048) and leaves the D = 640 inputs whole: 128 also blocks
# those (top-1 agreement with float32 0.95 instead of 0.93 on the reference prompts)
# but costs ~25% of decode speed at batch 8 on XLA:CPU
# (experiments/benchmarks/results/issue18/compute_paths_and_int8.md).
GROUP = 256
_MIN_ROWS = 2  # XLA:CPU's int8 dot runs ~10x slower on one row than on two


LAYER_LAYOUTS = ("io", "oik")


@dataclasses.dataclass(frozen=True)
class Int8Paths:
  """How the sampler's int8 dots are formed (static; `compute_paths.resolve_int8`).

  layer_layout: "io" stores a layer matrix as q [..., I, O] and puts the activations on
    the left of the dot; "oik" stores q [..., G, O, K] (G blocks of K inputs) and puts
    the weights on the left.
  activations_left_max_rows: up to this many (padded) rows the output projection's dot
    has the activations on the left, above it the [V, D] weights (0: always the weights).
  The defaults are the AMD EPYC's calibration
  (experiments/benchmarks/results/issue18/compute_paths_and_int8.md) and what tests pin.
  """

  layer_layout: str = "io"
  activations_left_max_rows: int = 8

  def __post_init__(self):
    if self.layer_layout not in LAYER_LAYOUTS:
      raise ValueError(f"Int8Paths.layer_layout={self.layer_layout!r}: use one of {LAYER_LAYOUTS}")
    if self.activations_left_max_rows < 0:
      raise ValueError(
        f"Int8Paths.activations_left_max_rows={self.activations_left_max_rows}: use >= 0"
      )


def paths_text(paths: Int8Paths) -> str:
  """ "LAYOUT:ROWS", the `sampling.int8_paths` setting that `parse_paths` reads back."""
  return f"{paths.layer_layout}:{paths.activations_left_max_rows}"


def parse_paths(text: str, field: str = "sampling.int8_paths") -> Int8Paths:
  """`Int8Paths` from "LAYOUT:ROWS" (e.g. "io:8", the default; "oik:0"), errors naming
  `field`."""
  layout, _, rows = str(text).partition(":")
  try:
    return Int8Paths(layout, int(rows))
  except ValueError:
    raise errors.ConfigError(
      f"config.{field}={text!r}: use 'auto' (calibrated on this machine) or LAYOUT:ROWS "
      f"with LAYOUT one of {LAYER_LAYOUTS} and ROWS >= 0, e.g. 'io:8'"
    ) from None


_STATIC = {"static": True}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Int8Weight:
  """A matrix as int8 values `q` and float32 scales.

  Layer matrix [I, O]: q [..., I, O] (layout "io") or [..., G, O, K] ("oik"; K = I / G),
  scale [..., G, O] (G blocks of K input rows).
  Output projection (layout "rows"): q [V, D], scale [V] (one per vocabulary row);
  `activations_left_max_rows` as in `Int8Paths`.
  """

  q: jax.Array
  scale: jax.Array
  layout: str = dataclasses.field(default="io", metadata=_STATIC)
  activations_left_max_rows: int = dataclasses.field(default=0, metadata=_STATIC)


def _absmax_scale(x: jax.Array, axis: int) -> jax.Array:
  """absmax / 127 along `axis` (kept), 1 where the slice is all zeros."""
  m = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axis, keepdims=True)
  return jnp.where(m > 0, m / _QMAX, 1.0)


def _round(x: jax.Array, scale: jax.Array) -> jax.Array:
  return jnp.clip(jnp.round(x.astype(jnp.float32) / scale), -_QMAX, _QMAX).astype(jnp.int8)


def block_size(rows: int, group: int = GROUP) -> int:
  """`group` when it divides `rows`, else `rows` (one block)."""
  return group if rows % group == 0 else rows


def quantize_blocks(w_IxO: jax.Array, group: int = GROUP, layout: str = "io") -> Int8Weight:
  """A layer matrix [..., I, O] (e.g. a stack [L, I, O]): one scale per block of
  `block_size(I, group)` input rows and output column, stored in `layout`."""
  if layout not in LAYER_LAYOUTS:
    raise ValueError(f"layout={layout!r}: use one of {LAYER_LAYOUTS}")
  *lead, I, O = w_IxO.shape
  k = block_size(I, group)
  blocks = w_IxO.reshape(*lead, I // k, k, O)
  scale = _absmax_scale(blocks, axis=-2)
  q = _round(blocks, scale)
  q = q.reshape(w_IxO.shape) if layout == "io" else jnp.swapaxes(q, -1, -2)
  return Int8Weight(q, scale[..., 0, :], layout)


def quantize_rows(w_VxD: jax.Array, activations_left_max_rows: int = 8) -> Int8Weight:
  """The output projection [V, D] with one scale per vocabulary row.

  The scales and the rounding read `w` in two passes, each widening it to float32 as it
  goes: written as one, XLA:CPU widens a 16-bit [V, D] once into a float32 temporary
  both read (Gemma 3 270M's bfloat16 embedding: 0.63 GiB at every weight sync)."""
  scale = _absmax_scale(w_VxD, axis=-1)
  w_VxD, scale = jax.lax.optimization_barrier((w_VxD, scale))  # the scales first, apart
  return Int8Weight(_round(w_VxD, scale), scale[:, 0], "rows", activations_left_max_rows)


def dequantize_blocks(w: Int8Weight) -> jax.Array:
  """The float32 matrix [..., I, O] a `quantize_blocks` result stands for."""
  *lead, G, O = w.scale.shape
  if w.layout == "io":
    I = w.q.shape[-2]
    blocks = w.q.reshape(*lead, G, I // G, O)
  else:
    blocks = jnp.swapaxes(w.q, -1, -2)
  blocks = blocks.astype(jnp.float32) * w.scale[..., :, None, :]
  return blocks.reshape(*lead, -1, O)


def dequantize_rows(w: Int8Weight) -> jax.Array:
  """The float32 matrix a `quantize_rows` result stands for."""
  return w.q.astype(jnp.float32) * w.scale[:, None]


def concatenate_outputs(parts: list[Int8Weight]) -> Int8Weight:
  """Layer matrices with the same inputs side by side: [I, O1], [I, O2] -> [I, O1 + O2]."""
  axis = -1 if parts[0].layout == "io" else -2
  return Int8Weight(
    jnp.concatenate([p.q for p in parts], axis=axis),
    jnp.concatenate([p.scale for p in parts], axis=-1),
    parts[0].layout,
  )


def _quantize_tokens(x_NxGxK: jax.Array):
  """Per-token, per-block int8 activations: ([N, G, K] int8, [N, G, 1] float32 scales)."""
  scale = _absmax_scale(x_NxGxK, axis=-1)
  return _round(x_NxGxK, scale), scale


def _pad_rows(x_NxI: jax.Array) -> jax.Array:
  return jnp.pad(x_NxI, ((0, max(0, _MIN_ROWS - x_NxI.shape[0])), (0, 0)))


def dense(x: jax.Array, w: Int8Weight) -> jax.Array:
  """x [..., I] @ w [I, O] -> [..., O] float32: blocked int8 x int8, int32 per block."""
  lead, I = x.shape[:-1], x.shape[-1]
  G, O = w.scale.shape
  x_NxI = x.reshape(-1, I)
  N = x_NxI.shape[0]
  xq, xs = _quantize_tokens(_pad_rows(x_NxI).reshape(-1, G, I // G))
  if w.layout == "io":
    acc = jax.lax.dot_general(
      xq, w.q.reshape(G, I // G, O), (((2,), (1,)), ((1,), (0,))), preferred_element_type=jnp.int32
    )
    out = jnp.einsum("gno,ng,go->no", acc.astype(jnp.float32), xs[..., 0], w.scale)
  else:
    acc = jax.lax.dot_general(
      w.q, xq, (((2,), (2,)), ((0,), (1,))), preferred_element_type=jnp.int32
    )
    out = jnp.einsum("gon,ng,go->no", acc.astype(jnp.float32), xs[..., 0], w.scale)
  return out[:N].reshape(*lead, O)


def vocab_major(w: Int8Weight, h_BxD: jax.Array) -> jax.Array:
  """w [V, D] (per-row scales) times h [B, D]: logits as [V, B] float32. The activations
  are the dot's left operand up to `w.activations_left_max_rows` padded rows (measured:
  Gemma 3 270M's [262144, 640] on an AMD EPYC, 2 rows: 11.7 against 17.8 ms; on an Intel
  Xeon with AMX 10.7 against 6.0 ms)."""
  B = h_BxD.shape[0]
  hq, hs = _quantize_tokens(_pad_rows(h_BxD)[:, None, :])
  hq_NxD, hs_N = hq[:, 0], hs[:, 0, 0]
  if hq_NxD.shape[0] <= w.activations_left_max_rows:
    acc_NxV = jax.lax.dot_general(
      hq_NxD, w.q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32
    )
    return (acc_NxV[:B].astype(jnp.float32) * hs_N[:B, None] * w.scale[None, :]).T
  acc_VxN = jax.lax.dot_general(
    w.q, hq_NxD, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32
  )
  return acc_VxN[:, :B].astype(jnp.float32) * w.scale[:, None] * hs_N[None, :B]


def quantize_for_sampling(params, group: int = GROUP, paths: Int8Paths = Int8Paths()):
  """The sampler's int8 copy of a Gemma params pytree (see the module docstring), its
  dots formed as `paths` says."""
  return with_int8_parts(params, int8_parts(params, group, paths))


def with_int8_parts(params, parts):
  """`params` with `int8_parts`'s (unembed, quantized layer matrices) put in."""
  unembed, quantized = parts
  return {**params, "unembed": unembed, "layers": {**params["layers"], **quantized}}


def int8_parts(params, group: int = GROUP, paths: Int8Paths = Int8Paths()):
  """(unembed, {name: Int8Weight} of the layer matrices): what `quantize_for_sampling`
  adds, alone, so a program making it outputs no copy of the weights it keeps (the
  embedding, the norms)."""
  quantized = {
    name: quantize_blocks(w, group, paths.layer_layout)
    for name, w in params["layers"].items()
    if w.ndim == 3
  }
  output = params["output"] if "output" in params else params["embed"]
  return quantize_rows(output, paths.activations_left_max_rows), quantized


def float_view(params):
  """float32 layer matrices from an int8 copy (and no "unembed"); other params as given.
  Works on the stacked and on the decode layout (`decoder.unstack_layers`)."""
  if "unembed" not in params:
    return params
  layers = jax.tree.map(
    lambda w: dequantize_blocks(w) if isinstance(w, Int8Weight) else w,
    params["layers"],
    is_leaf=lambda w: isinstance(w, Int8Weight),
  )
  return {k: v for k, v in params.items() if k != "unembed"} | {"layers": layers}


def matmul_error_bound(x_NxI: jax.Array, w_IxO: jax.Array, group: int = GROUP) -> jax.Array:
  """Worst-case |x @ w - dense(x, quantize_blocks(w, group))| per output [N, O]."""
  (N, I), O = x_NxI.shape, w_IxO.shape[1]
  k = block_size(I, group)
  xb, wb = x_NxI.reshape(N, I // k, k), w_IxO.reshape(I // k, k, O)
  s_x, s_w = _absmax_scale(xb, axis=-1), _absmax_scale(wb, axis=-2)  # [N, G, 1], [G, 1, O]
  ax, aw = jnp.abs(xb).sum(-1), jnp.abs(wb).sum(-2)  # [N, G], [G, O]
  return (
    jnp.einsum("ng,go->no", ax, s_w[:, 0] / 2)
    + jnp.einsum("ng,go->no", s_x[..., 0] / 2, aw)
    + jnp.einsum("ng,go->no", s_x[..., 0], s_w[:, 0]) * k / 4
  )
