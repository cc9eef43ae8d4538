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
converts int8 weights to float materializes the converted matrix first.

Error per block: |w - q s| <= s / 2 entrywise for weights and activations alike, so
|x @ w - dense(x, w_int8)| <= sum_i (|x_i| s_w / 2 + |w_i| s_x / 2 + s_x s_w / 4)
over each block (`matmul_error_bound`).
"""

import dataclasses

import jax
import jax.numpy as jnp

_QMAX = 127.0
# Input rows per scale block of a layer matrix (and of its activations); a matrix whose
# row count it does not divide is one block. 256 blocks the o and down projections of
# Gemma 3 270M (inputs 1024, 2048) and leaves the D = 640 inputs whole: 128 also blocks
# those (top-1 agreement with float32 0.95 instead of 0.93 on the reference prompts)
# but costs ~25% of decode speed at batch 8 on XLA:CPU (BUILD.md).
GROUP = 256
_MIN_ROWS = 2  # XLA:CPU's int8 dot runs ~10x slower on one row than on two


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Int8Weight:
  """A matrix as int8 values `q` and float32 scales.

  Layer matrix: q [..., I, O], scale [..., G, O] (G blocks of I / G input rows).
  Output projection: q [V, D], scale [V] (one per vocabulary row).
  """

  q: jax.Array
  scale: jax.Array


def _absmax_scale(x: jax.Array, axis: int) -> jax.Array:
  """absmax / 127 along `axis` (kept), 1 where the slice is all zeros."""
  m = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axis, keepdims=True)
  return jnp.where(m > 0, m / _QMAX, 1.0)


def _round(x: jax.Array, scale: jax.Array) -> jax.Array:
  return jnp.clip(jnp.round(x.astype(jnp.float32) / scale), -_QMAX, _QMAX).astype(jnp.int8)


def block_size(rows: int, group: int = GROUP) -> int:
  """`group` when it divides `rows`, else `rows` (one block)."""
  return group if rows % group == 0 else rows


def quantize_blocks(w_IxO: jax.Array, group: int = GROUP) -> Int8Weight:
  """A layer matrix [..., I, O] (e.g. a stack [L, I, O]): one scale per block of
  `block_size(I, group)` input rows and output column."""
  *lead, I, O = w_IxO.shape
  k = block_size(I, group)
  blocks = w_IxO.reshape(*lead, I // k, k, O)
  scale = _absmax_scale(blocks, axis=-2)
  return Int8Weight(_round(blocks, scale).reshape(w_IxO.shape), scale[..., 0, :])


def quantize_rows(w_VxD: jax.Array) -> Int8Weight:
  """The output projection [V, D] with one scale per vocabulary row."""
  scale = _absmax_scale(w_VxD, axis=-1)
  return Int8Weight(_round(w_VxD, scale), scale[:, 0])


def dequantize_blocks(w: Int8Weight) -> jax.Array:
  """The float32 matrix a `quantize_blocks` result stands for."""
  *lead, I, O = w.q.shape
  G = w.scale.shape[-2]
  blocks = w.q.reshape(*lead, G, I // G, O).astype(jnp.float32) * w.scale[..., :, None, :]
  return blocks.reshape(w.q.shape)


def dequantize_rows(w: Int8Weight) -> jax.Array:
  """The float32 matrix a `quantize_rows` result stands for."""
  return w.q.astype(jnp.float32) * w.scale[:, None]


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
  acc_GxNxO = jax.lax.dot_general(
    xq, w.q.reshape(G, I // G, O), (((2,), (1,)), ((1,), (0,))), preferred_element_type=jnp.int32
  )
  out = jnp.einsum("gno,ng,go->no", acc_GxNxO.astype(jnp.float32), xs[..., 0], w.scale)
  return out[:N].reshape(*lead, O)


# Up to this many (padded) rows `vocab_major` puts the activations on the left of the
# int8 dot: XLA:CPU then streams [V, D] faster (Gemma 3 270M's [262144, 640], AMD EPYC,
# 2 cores: 11.7 against 17.8 ms at 2 rows, 13.5 / 17.5 at 4, 18.3 / 19.7 at 8; 37.9
# against 29.9 at 16 rows, where the weights-on-the-left order wins).
_ACTIVATIONS_LEFT_MAX_ROWS = 8


def vocab_major(w: Int8Weight, h_BxD: jax.Array) -> jax.Array:
  """w [V, D] (per-row scales) times h [B, D]: logits as [V, B] float32."""
  B = h_BxD.shape[0]
  hq, hs = _quantize_tokens(_pad_rows(h_BxD)[:, None, :])
  hq_NxD, hs_N = hq[:, 0], hs[:, 0, 0]
  if hq_NxD.shape[0] <= _ACTIVATIONS_LEFT_MAX_ROWS:
    acc_NxV = jax.lax.dot_general(
      hq_NxD, w.q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32
    )
    return (acc_NxV[:B].astype(jnp.float32) * hs_N[:B, None] * w.scale[None, :]).T
  acc_VxN = jax.lax.dot_general(
    w.q, hq_NxD, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32
  )
  return acc_VxN[:, :B].astype(jnp.float32) * w.scale[:, None] * hs_N[None, :B]


def quantize_for_sampling(params, group: int = GROUP):
  """The sampler's int8 copy of a Gemma params pytree (see the module docstring)."""
  layers = {
    name: quantize_blocks(w, group) if w.ndim == 3 else w for name, w in params["layers"].items()
  }
  return {**params, "unembed": quantize_rows(params["embed"]), "layers": layers}


def float_view(params):
  """float32 layer matrices from an int8 copy (and no "unembed"); other params as given.
  Works on the stacked and on the decode layout (`gemma3.unstack_layers`)."""
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
