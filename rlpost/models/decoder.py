"""The decoder every model family runs: pure functions over an explicit params pytree.

One transformer, configured by a family's frozen `Config` (`rlpost.models.gemma3`,
`rlpost.models.llama`; `rlpost.models.families` chooses one by name), which provides
what `rlpost.models.architecture.Architecture` declares (every member a jit static
value). Params (every layer leaf stacked on a leading `[L]` axis, run with `lax.scan`):

  embed       [V, D]          input embedding (and the output projection when tied)
  output      [V, D]          untied output projection (only when `not tied_output`)
  final_norm  [D]             RMSNorm weight
  layers:
    attn_norm, mlp_norm                    [L, D]
    post_attn_norm, post_mlp_norm          [L, D]   (`post_norms`: Gemma's sandwich norms)
    q [L, D, H*hd]  k, v [L, D, K*hd]  o [L, H*hd, D]     ([in, out]: y = x @ W)
    q_bias [L, H*hd]  k_bias, v_bias [L, K*hd]             (`qkv_bias`: Qwen2)
    q_norm, k_norm  [L, hd]                                 (`qk_norm`: Gemma 3, Qwen3)
    gate, up [L, D, F]  down [L, F, D]

Block: x + [post_norm](o(attention(rope([qk_norm](q, k)), v))) over the pre-normed x,
then x + [post_norm](down(act(gate) * up)) over the pre-normed x; final RMSNorm; logits
from the output projection. Attention is grouped-query with rotate-half RoPE.

`unstack_layers` turns the stacks into a tuple of per-layer dicts (q/k/v and gate/up
concatenated) that `forward` with a cache unrolls: the sampler's decode layout for
layers large enough to pay for it (`decode_layout`).

The KV cache is one dict of a few large arrays (see `init_cache`), keys and values
KV-head-major ([L, B, K, S, H]: what a decode step's attention matmuls read in place);
new keys and values are written at slot `cache["index"]` for every row, so rows use left
padding and per-row positions.
"""

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from rlpost.models import architecture, q4_native, quant, quant4
from rlpost.models import attention as attention_lib
from rlpost.models import lora as lora_lib

Params = dict[str, Any]
Cache = dict[str, jax.Array]
Config = architecture.Architecture  # a family's frozen Config dataclass

COMPUTE_DTYPES = ("float32", "bfloat16")  # training matmul input dtypes (`compute_dtype`)
# What the "dots" remat policy keeps per layer: the projection outputs the backward
# pass reads (q, k, v before their norms; o and down before theirs), the MLP hidden
# `act(gate) * up` and the two products gated_gelu saves, and the LoRA `x @ a`.
# Everything else (norms, RoPE, attention) is recomputed. Not kept: the gate and up
# projections (gated_gelu's backward does not read them) and the base and adapter
# halves of each projection apart (only their sum is read).
_SAVED_BY_DOTS = ("proj_out", "mlp_hidden", "gated_gelu", "lora_xa")

_REMAT_POLICIES = {
  None: None,
  "dots": jax.checkpoint_policies.save_only_these_names(*_SAVED_BY_DOTS),
  "full": jax.checkpoint_policies.nothing_saveable,
}
MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


def layer_shapes(config: Config) -> dict[str, tuple[int, ...]]:
  """Per-layer leaf shapes (without the leading [L]) of `config`'s params, [in, out]."""
  c = config
  D, F, hd = c.embed_dim, c.mlp_dim, c.head_dim
  qd, kd = c.num_heads * hd, c.num_kv_heads * hd
  shapes = {"attn_norm": (D,), "mlp_norm": (D,)}
  if c.post_norms:
    shapes.update(post_attn_norm=(D,), post_mlp_norm=(D,))
  if c.qk_norm:
    shapes.update(q_norm=(hd,), k_norm=(hd,))
  if c.qkv_bias:
    shapes.update(q_bias=(qd,), k_bias=(kd,), v_bias=(kd,))
  shapes.update(q=(D, qd), k=(D, kd), v=(D, kd), o=(qd, D), gate=(D, F), up=(D, F), down=(F, D))
  return shapes


def param_shapes(config: Config) -> dict[str, Any]:
  """The params pytree of shapes for `config` (module docstring)."""
  c = config
  shapes = {"embed": (c.vocab_size, c.embed_dim), "final_norm": (c.embed_dim,)}
  if not c.tied_output:
    shapes["output"] = (c.vocab_size, c.embed_dim)
  shapes["layers"] = {k: (c.num_layers, *s) for k, s in layer_shapes(c).items()}
  return shapes


def init_params(key: jax.Array, config: Config, dtype=jnp.float32) -> Params:
  """Random params: normal * 0.02 for the matrices and embeddings, zero biases, and norm
  weights that scale by 1 (w = 1 - norm_offset)."""
  c = config
  shapes = param_shapes(c)["layers"]
  matrices = [n for n in MATRICES if n in shapes]
  keys = jax.random.split(key, len(matrices) + 1)
  normal = lambda k, shape: (0.02 * jax.random.normal(k, shape)).astype(dtype)
  layers = {name: normal(k, shapes[name]) for k, name in zip(keys[1:], matrices)}
  for name, shape in shapes.items():
    if name.endswith("_norm"):
      layers[name] = jnp.full(shape, 1.0 - c.norm_offset, dtype)
    elif name.endswith("_bias"):
      layers[name] = jnp.zeros(shape, dtype)
  params = {
    "embed": normal(keys[0], (c.vocab_size, c.embed_dim)),
    "final_norm": jnp.full((c.embed_dim,), 1.0 - c.norm_offset, dtype),
    "layers": {name: layers[name] for name in shapes},
  }
  if not c.tied_output:
    params["output"] = normal(jax.random.fold_in(key, 1), (c.vocab_size, c.embed_dim))
  return params


SLOT_AXIS = 3  # the slot axis of the cache's "k" and "v" [L, B, K, S, H]


def init_cache(config: Config, batch: int, size: int, dtype=jnp.float32) -> Cache:
  """Empty KV cache for `batch` rows and `size` slots.

  Returns {"k", "v": [L, batch, K, size, hd] dtype (slots on axis `SLOT_AXIS`), "pos":
  [batch, size] int32 (position of the key in each slot, -1 when empty), "index": []
  int32 (next slot to write)}.
  """
  shape = (config.num_layers, batch, config.num_kv_heads, size, config.head_dim)
  return {
    "k": jnp.zeros(shape, dtype),
    "v": jnp.zeros(shape, dtype),
    "pos": jnp.full((batch, size), -1, jnp.int32),
    "index": jnp.zeros((), jnp.int32),
  }


def rms_norm(x: jax.Array, w: jax.Array, eps: float, offset: float = 1.0) -> jax.Array:
  """x * rsqrt(mean(x^2) + eps) * (offset + w), in float32 (offset: `Config.norm_offset`)."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  scale = w.astype(jnp.float32)
  if offset:
    scale = offset + scale
  return normed * scale.reshape((1,) * (x.ndim - w.ndim) + w.shape)


def inverse_frequencies(head_dim: int, base: float, factors=None) -> jax.Array:
  """RoPE's per-pair angular frequencies [hd/2] float32: base^(-2i/hd), divided by
  `factors` ([hd/2] or None: `Config.rope_freq_factors`)."""
  half = head_dim // 2
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / head_dim)
  if factors is None:
    return inv_freq
  return inv_freq / jnp.asarray(factors, jnp.float32)


def rope_tables(positions_BxT: jax.Array, inv_freq: jax.Array):
  """(cos, sin) tables [B, T, 1, hd/2] float32 for rotate-half RoPE."""
  angles = positions_BxT.astype(jnp.float32)[..., None] * inv_freq[None, None, :]
  return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def apply_rope(x_BxTxNxH: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotate-half (NeoX) RoPE: dimension i pairs with i + hd/2."""
  x1, x2 = jnp.split(x_BxTxNxH, 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


_GELU_C = math.sqrt(2.0 / math.pi)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def gated_gelu(gate: jax.Array, up: jax.Array, saved_dtype=None) -> jax.Array:
  """gelu_tanh(gate) * up, whose backward pass reuses two products of the forward.

  Autodiff of the tanh approximation recomputes a long elementwise chain in the
  backward pass, and XLA:CPU fuses it with the transposition that feeds the
  weight-gradient matmul: that fusion ran unvectorized (~20-60 ms per layer on
  the CI machine). Here the forward keeps `up * gelu'(gate)` and `gelu(gate)`
  (named "gated_gelu", saved by the "dots" remat policy), so the backward is
  two multiplies. `saved_dtype` (mixed precision: the matmul compute dtype,
  which the gradients are rounded to next anyway) stores those two products
  at lower precision; None keeps the input dtype.
  """
  return jax.nn.gelu(gate, approximate=True) * up


def _gated_gelu_fwd(gate, up, saved_dtype):
  x = gate
  gelu = jax.nn.gelu(x, approximate=True)  # the primal's exact values
  t = jnp.tanh(_GELU_C * (x + 0.044715 * x * x * x))
  dgelu = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * x * x)
  store = lambda x: checkpoint_name(
    x if saved_dtype is None else x.astype(saved_dtype), "gated_gelu"
  )
  return gelu * up, (store(up * dgelu), store(gelu))


def _gated_gelu_bwd(saved_dtype, saved, g):
  up_dgelu, gelu = saved
  return g * up_dgelu.astype(g.dtype), g * gelu.astype(g.dtype)


gated_gelu.defvjp(_gated_gelu_fwd, _gated_gelu_bwd)


def _dense(x: jax.Array, w: jax.Array, compute_dtype=None) -> jax.Array:
  """x @ w with float32 output; inputs cast to `compute_dtype`, or to the weight dtype.

  An int8 `w` (the sampler's, `rlpost.models.quant`) runs int8 x int8; a 4-bit one
  (`rlpost.models.quant4`) dequantises inside its matmul (`q4_native`: in registers).
  """
  if isinstance(w, quant.Int8Weight):
    return quant.dense(x, w)
  if isinstance(w, quant4.Packed4):
    return quant4.dense4(x, w)
  if isinstance(w, q4_native.NativeQ4):
    return q4_native.dense(x, w)
  if isinstance(w, q4_native.NativeRows):
    return q4_native.rows_dense(x, w)
  if compute_dtype is None or jnp.dtype(compute_dtype) == w.dtype == x.dtype:
    return jnp.matmul(x.astype(w.dtype), w, preferred_element_type=jnp.float32)
  return _mixed_dense(x, w, jnp.dtype(compute_dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mixed_dense(x_NxI: jax.Array, w_IxO: jax.Array, compute_dtype) -> jax.Array:
  """x @ w, float32 output, with both inputs rounded to `compute_dtype` (mixed precision).

  Its backward pass also runs in `compute_dtype` with float32 accumulation:
  dx = g @ w.T and dw = x.T @ g on the rounded values and the rounded
  cotangent, returned in the dtypes of x and w (float32 master weights get
  float32 gradients). Autodiff of the cast would instead feed each backward
  matmul a float32 cotangent and run it in float32.
  """
  return jnp.matmul(
    x_NxI.astype(compute_dtype), w_IxO.astype(compute_dtype), preferred_element_type=jnp.float32
  )


def _mixed_dense_fwd(x_NxI, w_IxO, compute_dtype):
  x_c, w_c = x_NxI.astype(compute_dtype), w_IxO.astype(compute_dtype)
  like = (jnp.zeros((0,), x_NxI.dtype), jnp.zeros((0,), w_IxO.dtype))
  return jnp.matmul(x_c, w_c, preferred_element_type=jnp.float32), (x_c, w_c, like)


def _mixed_dense_bwd(compute_dtype, residuals, g_NxO):
  x_c, w_c, (x_like, w_like) = residuals
  g_c = g_NxO.astype(compute_dtype)
  dx = jnp.einsum("...o,io->...i", g_c, w_c, preferred_element_type=jnp.float32)
  dw = jnp.einsum("...i,...o->io", x_c, g_c, preferred_element_type=jnp.float32)
  return dx.astype(x_like.dtype), dw.astype(w_like.dtype)


_mixed_dense.defvjp(_mixed_dense_fwd, _mixed_dense_bwd)


def _proj(
  x: jax.Array,
  layer,
  adapters,
  names: tuple[str, ...],
  sizes: tuple[int, ...],
  lora_scale: float,
  compute_dtype=None,
) -> list[jax.Array]:
  """[x @ W_name for name in names] (output widths `sizes`), each plus its LoRA path.

  The unmerged LoRA path of a name with an adapter is (x @ A) @ B * lora_scale; a
  name with a bias (`{name}_bias`, Qwen2's q/k/v) adds it. A layer from
  `unstack_layers` holds the concatenation of the weights under "+".join(names)
  ("q+k+v", "gate+up"): one wider matmul, split afterwards.
  """
  fused = "+".join(names)
  if fused in layer:
    points = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)]
    ys = jnp.split(_dense(x, layer[fused], compute_dtype), points, axis=-1)
  else:
    ys = [_dense(x, layer[name], compute_dtype) for name in names]
  bias = lambda b, y: b.astype(jnp.float32).reshape((1,) * (y.ndim - 1) + b.shape)
  ys = [
    y + bias(layer[f"{name}_bias"], y) if f"{name}_bias" in layer else y
    for name, y in zip(names, ys)
  ]
  return [
    y + lora_lib.delta(x, adapters[name]["a"], adapters[name]["b"], lora_scale, compute_dtype)
    if adapters is not None and name in adapters
    else y
    for name, y in zip(names, ys)
  ]


def _pick(is_global, local_and_global):
  """The global or local member of a pair; `is_global` is a Python bool or a traced scalar."""
  local, glob = local_and_global
  if isinstance(is_global, bool):
    return glob if is_global else local
  return jax.tree.map(lambda a, b: jnp.where(is_global, b, a), local, glob)


def _block(
  x_BxTxD,
  layer,
  adapters,
  is_global,
  keys_fn,
  masks,
  ropes,
  config: Config,
  lora_scale: float,
  compute_dtype=None,
):
  """One decoder block. `keys_fn(k, v) -> (k_all, v_all, carry_out)` handles the cache."""
  c = config
  B, T, _ = x_BxTxD.shape
  proj = lambda x, names, sizes: _proj(x, layer, adapters, names, sizes, lora_scale, compute_dtype)
  qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  norm = lambda x, name: rms_norm(x, layer[name], c.rms_eps, c.norm_offset)
  post = lambda y, name: norm(y, name) if c.post_norms else y
  h = norm(x_BxTxD, "attn_norm")
  q, k, v = (checkpoint_name(y, "proj_out") for y in proj(h, ("q", "k", "v"), (qd, kd, kd)))
  q = q.reshape(B, T, c.num_heads, c.head_dim)
  k = k.reshape(B, T, c.num_kv_heads, c.head_dim)
  v = v.reshape(B, T, c.num_kv_heads, c.head_dim)
  if c.qk_norm:
    q, k = norm(q, "q_norm"), norm(k, "k_norm")
  cos, sin = _pick(is_global, ropes)
  q = apply_rope(q, cos, sin) * c.query_scale
  k = apply_rope(k, cos, sin).transpose(0, 2, 1, 3)  # [B, K, T, H], the cache's layout
  k_all, v_all, carry_out = keys_fn(k, v.transpose(0, 2, 1, 3))
  mask = _pick(is_global, masks)
  attn = attention_lib.attention(q, k_all, v_all, mask, c.num_kv_heads)
  out = lambda x, name, size: checkpoint_name(proj(x, (name,), (size,))[0], "proj_out")
  x = x_BxTxD + post(out(attn, "o", c.embed_dim), "post_attn_norm")
  h = norm(x, "mlp_norm")
  gate, up = proj(h, ("gate", "up"), (c.mlp_dim, c.mlp_dim))
  mlp = checkpoint_name(_gated(c.activation, gate, up, compute_dtype), "mlp_hidden")
  x = x + post(out(mlp, "down", c.embed_dim), "post_mlp_norm")
  return x, carry_out


def _gated(activation: str, gate, up, compute_dtype):
  """act(gate) * up: Gemma's tanh GELU (`gated_gelu`) or SwiGLU's SiLU."""
  if activation == "gelu_tanh":
    return gated_gelu(gate, up, compute_dtype)
  if activation == "silu":
    return jax.nn.silu(gate) * up
  raise ValueError(f"Config.activation={activation!r}: use one of {architecture.ACTIVATIONS}")


def _cache_writer(ck_LxBxKxSxH, cv_LxBxKxSxH, layer, index, in_place: bool = False):
  """keys_fn for `_block`: writes this layer's new k/v [B, K, T, H] at slot `index`,
  returns all of its keys and values [B, K, S, H], or (`in_place`) the updated stacks as
  `attention.CacheLayer`s, which a decode step's native attention reads without a copy."""

  def keys_fn(k, v):
    nk = jax.lax.dynamic_update_slice(
      ck_LxBxKxSxH, k[None].astype(ck_LxBxKxSxH.dtype), (layer, 0, 0, index, 0)
    )
    nv = jax.lax.dynamic_update_slice(
      cv_LxBxKxSxH, v[None].astype(cv_LxBxKxSxH.dtype), (layer, 0, 0, index, 0)
    )
    if in_place:
      return attention_lib.CacheLayer(nk, layer), attention_lib.CacheLayer(nv, layer), (nk, nv)
    return nk[layer], nv[layer], (nk, nv)

  return keys_fn


def _native_layers(layers) -> bool:
  """Whether the decode layers hold the native library's weights (`q4_native.for_decode`):
  their decode steps then compute attention in the library too."""
  native = (q4_native.NativeQ4, q4_native.NativeRows)
  leaves = jax.tree.leaves(layers, is_leaf=lambda w: isinstance(w, native))
  return any(isinstance(w, native) for w in leaves)


_FUSED = (("q", "k", "v"), ("gate", "up"))


# Below this many weight bytes per layer the sampler decodes from the stacks (`lax.scan`):
# copying such a layer's slice at each step costs microseconds, while each unrolled layer
# adds its own copy of the layer's kernels to the compiled program. The tiny test model
# (49 KB a layer) compiles its sampler ~35% faster scanned and runs no slower at XLA's
# default code generation; Gemma 3 270M (22 MB a layer in float32, 5.6 MB in int8) decodes
# 25% faster unrolled.
UNROLL_MIN_LAYER_BYTES = 1 << 20


def decode_layout(params: Params) -> Params:
  """The layout the sampler decodes from: `unstack_layers(params)` when one layer's weights
  hold at least UNROLL_MIN_LAYER_BYTES, else `params` unchanged (stacked, scanned)."""
  if isinstance(params["layers"], (list, tuple)):  # already unstacked
    return params
  leaves = jax.tree.leaves(params["layers"])
  layer_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves) // leaves[0].shape[0]
  return unstack_layers(params) if layer_bytes >= UNROLL_MIN_LAYER_BYTES else params


@jax.jit
def _decoding_layers(layers):
  return decode_layout({"layers": layers})["layers"]


def decode_layout_once(params: Params) -> Params:
  """`decode_layout(params)` with the layers laid out by one program and the embedding
  passed through outside it (a program's output is a copy: 0.25 s for Gemma 3 270M's);
  params already laid out are returned as they are."""
  if isinstance(params["layers"], (list, tuple)):
    return params
  return {**params, "layers": _decoding_layers(params["layers"])}


_concatenate_floats = functools.partial(jnp.concatenate, axis=-1)
_CONCATENATE = {
  quant.Int8Weight: quant.concatenate_outputs,
  quant4.Packed4: quant4.concatenate_outputs,
  q4_native.NativeQ4: q4_native.concatenate_outputs,
  q4_native.NativeRows: q4_native.concatenate_rows,
}


def unstack_layers(params: Params) -> Params:
  """Decode layout: "layers" as a tuple of per-layer dicts, q/k/v and gate/up concatenated.

  `forward` with a cache unrolls such layers instead of scanning them. Inside
  the sampler's decode loop a scan slices every weight out of its stack (a
  copy) at every step, ~25% of a batch-8 decode step on XLA:CPU; and at decode
  batch sizes one [D, 2F] matmul streams its weights faster than two [D, F]
  ones. Call it once, outside the loop (it copies the layer weights once). The stacks
  are fused before they are sliced: one concatenation per stack runs 2-2.5x faster on
  XLA:CPU than one per layer (Gemma 3 270M: 0.13 s against 0.27-0.31 s, Zen 4).
  """
  layers = dict(params["layers"])
  for names in _FUSED:
    parts = [layers[n] for n in names]
    if len({(type(p), getattr(p, "fmt", None)) for p in parts}) > 1:
      continue  # a GGUF storing q and k in different types: left apart
    for n in names:
      del layers[n]
    layers["+".join(names)] = _CONCATENATE.get(type(parts[0]), _concatenate_floats)(parts)
  count = jax.tree.leaves(layers)[0].shape[0]
  return {
    **params,
    "layers": tuple(jax.tree.map(lambda w, i=i: w[i], layers) for i in range(count)),
  }


def forward(
  params: Params,
  tokens_BxT: jax.Array,
  positions_BxT: jax.Array,
  attn_mask_BxTxS: jax.Array,
  cache: Cache | None = None,
  *,
  config: Config,
  return_hidden: bool = False,
  adapters: Params | None = None,
  lora_scale: float = 1.0,
  remat: str | None = None,
  compute_dtype=None,
  gather=None,
  shared_prefix: int = 0,
):
  """Runs the decoder on `tokens_BxT`.

  Args:
    params: the params pytree (module docstring).
    tokens_BxT: int32 token ids.
    positions_BxT: int32 RoPE positions of the tokens (per row; padding any value).
    attn_mask_BxTxS: bool, True where query t may attend key s. Without a cache
      S == T (keys are these tokens); with a cache S is the cache size and key
      slot s holds what was written there (this call writes slots
      [index, index + T)). The sliding window is applied on top, from positions.
    cache: None, or a dict from `init_cache`.
    config: the architecture.
    return_hidden: return the final-normed hidden states [B, T, D] float32
      instead of the logits [B, T, V] float32 (logits = hidden @ embed.T).
    adapters: optional LoRA adapters {"layers": {name: {"a": [L, in, r],
      "b": [L, r, out]}}} applied unmerged (see rlpost.models.lora).
    lora_scale: alpha / rank multiplier of the adapters' contribution.
    remat: training memory policy for the layer scan (no cache only): None
      keeps every activation for the backward pass; "dots" keeps the
      projection outputs the backward reads (_SAVED_BY_DOTS) and recomputes
      the elementwise work and attention (norms, RoPE, softmax, GELU);
      "full" keeps only each layer's input and recomputes the layer.
    compute_dtype: None runs the layer matmuls in the weights' dtype; e.g. "bfloat16"
      rounds the inputs of every layer matmul (forward and backward) to it and accumulates
      in float32 (weights, gradients and the residual stream keep their own dtypes).
    gather: None, or (no cache only) a function applied to each layer's
      (weights, adapters) at the top of the layer scan: FSDP gathers the layer's
      shards there (`policy.ForwardConfig.fsdp_axis`), so one layer is whole at a time.
    shared_prefix: K (static; no cache): each row's first K slots equal row 0's and
      attend only each other; they run once, from row 0 (`_shared_prefix_layers`).

  Returns:
    (logits or hidden, new cache or None).
  """
  c = config
  B, T = tokens_BxT.shape
  _check_forward_args(T, cache, remat, shared_prefix)
  x = embed_rows(params, tokens_BxT)
  x = x if c.embed_multiplier is None else x * c.embed_multiplier
  if cache is None:
    key_pos_BxS = positions_BxT
  else:
    key_pos_BxS = jax.lax.dynamic_update_slice(
      cache["pos"], positions_BxT.astype(jnp.int32), (0, cache["index"])
    )
  masks, ropes = _masks_and_ropes(positions_BxT, key_pos_BxS, attn_mask_BxTxS, c)
  is_global = jnp.asarray(c.global_layers)
  lora_layers = None if adapters is None else adapters["layers"]

  block = functools.partial(
    _block, masks=masks, ropes=ropes, config=c, lora_scale=lora_scale, compute_dtype=compute_dtype
  )

  new_cache = None
  if cache is None:
    run = (lambda *a: _shared_prefix_layers(*a, shared_prefix)) if shared_prefix else _layers
    x = run(x, params["layers"], lora_layers, is_global, block, remat, gather)
  else:
    x, ck, cv = _cached_layers(x, params["layers"], lora_layers, is_global, cache, block, c)
    new_cache = {"k": ck, "v": cv, "pos": key_pos_BxS, "index": cache["index"] + T}
  hidden = rms_norm(x, params["final_norm"], c.rms_eps, c.norm_offset)
  if return_hidden:
    return hidden, new_cache
  return logits_from_hidden(params, hidden), new_cache


def _masks_and_ropes(positions_BxT, key_pos_BxS, attn_mask_BxTxS, config: Config):
  """((local mask, global mask), (local RoPE, global RoPE)); one pair member each when
  every layer is global (no sliding window, one RoPE base)."""
  c = config
  glob = rope_tables(
    positions_BxT, inverse_frequencies(c.head_dim, c.rope_bases[1], c.rope_freq_factors)
  )
  if all(c.global_layers):
    return (attn_mask_BxTxS, attn_mask_BxTxS), (glob, glob)
  in_window = positions_BxT[:, :, None] - key_pos_BxS[:, None, :] < c.sliding_window
  local = rope_tables(
    positions_BxT, inverse_frequencies(c.head_dim, c.rope_bases[0], c.rope_freq_factors)
  )
  return (attn_mask_BxTxS & in_window, attn_mask_BxTxS), (local, glob)


def _check_forward_args(T: int, cache, remat, shared_prefix: int = 0) -> None:
  if remat not in _REMAT_POLICIES:
    raise ValueError(f"remat={remat!r} is not one of {sorted(map(str, _REMAT_POLICIES))}")
  if shared_prefix and (cache is not None or not 0 < shared_prefix < T):
    raise ValueError(
      f"shared_prefix={shared_prefix}: must be in [0, {T}) slots, and 0 with a cache"
    )
  if cache is not None and T > cache["k"].shape[SLOT_AXIS]:
    raise ValueError(
      f"{T} tokens do not fit in a KV cache of {cache['k'].shape[SLOT_AXIS]} slots; "
      "allocate a larger cache with init_cache(..., size=...)"
    )


def _layers(x, layers, lora_layers, is_global_L, block, remat, gather):
  """The training path: the stacked layers under `lax.scan`, no cache (`remat`, `gather`:
  `forward`'s). Returns x [B, T, D]."""

  def body(x, inputs):
    layer, lora, glob = inputs
    if gather is not None:
      layer, lora = gather((layer, lora))
    x, _ = block(x, layer, lora, glob, lambda k, v: (k, v, None))
    return x, None

  if remat is not None:
    body = jax.checkpoint(body, policy=_REMAT_POLICIES[remat])
  x, _ = jax.lax.scan(body, x, (layers, lora_layers, is_global_L))
  return x


def _shared_prefix_layers(x, layers, lora_layers, is_global_L, block, remat, gather, K: int):
  """`_layers` with the first K slots of every row computed once, from row 0: the same
  function of the inputs as `_layers` (float32 rounding aside) at every slot that attends
  at least one key (slots that attend none, padding, are garbage either way), in
  (B - 1) * K fewer token-layers.

  Per layer, row 0's prefix [1, K] runs first (its keys and values kept); then every
  row's other slots [B, T - K] run with row 0's prefix keys and values broadcast in
  front of their own. Masks and RoPE tables are sliced to match. Returns x [B, T, D]
  with row 0's prefix in every row (a broadcast: its gradient sums over rows)."""
  B = x.shape[0]
  front = lambda a, b, axis=1: jnp.concatenate(
    [jnp.broadcast_to(a, (B, *a.shape[1:])), b], axis=axis
  )
  prefix_block = _sliced_block(block, lambda a: a[:1, :K], lambda m: m[:1, :K, :K])
  rest_block = _sliced_block(block, lambda a: a[:, K:], lambda m: m[:, K:, :])

  def body(carry, inputs):
    x_p, x_r = carry
    layer, lora, glob = inputs
    if gather is not None:
      layer, lora = gather((layer, lora))
    x_p, kv_p = prefix_block(x_p, layer, lora, glob, lambda k, v: (k, v, (k, v)))
    keys = lambda k, v: (front(kv_p[0], k, 2), front(kv_p[1], v, 2), None)  # [B, K, S, H]
    x_r, _ = rest_block(x_r, layer, lora, glob, keys)
    return (x_p, x_r), None

  if remat is not None:
    body = jax.checkpoint(body, policy=_REMAT_POLICIES[remat])
  (x_p, x_r), _ = jax.lax.scan(body, (x[:1, :K], x[:, K:]), (layers, lora_layers, is_global_L))
  return front(x_p, x_r)


def _sliced_block(block, rows_and_slots, mask_slice):
  """`block` (a `_block` partial over full-width masks and RoPE tables) for some of the
  slots: `rows_and_slots` cuts [B, T, ...] tables, `mask_slice` cuts [B, T, S] masks."""
  masks = jax.tree.map(mask_slice, block.keywords["masks"])
  ropes = jax.tree.map(rows_and_slots, block.keywords["ropes"])
  return functools.partial(block, masks=masks, ropes=ropes)


def _cached_layers(x, layers, lora_layers, is_global_L, cache, block, config: Config):
  """The decode path: the layers in the sampler's layout (`decode_layout`) over a KV
  cache, each writing its keys and values at slot `cache["index"]`: a tuple of
  per-layer dicts is unrolled, stacks are scanned. Returns (x, k, v)."""
  idx, ck, cv = cache["index"], cache["k"], cache["v"]
  native = _native_layers(layers)
  if isinstance(layers, (list, tuple)):  # unrolled: see unstack_layers
    for l, layer in enumerate(layers):
      lora = None if lora_layers is None else jax.tree.map(lambda a, l=l: a[l], lora_layers)
      writer = _cache_writer(ck, cv, l, idx, native)
      x, (ck, cv) = block(x, layer, lora, config.global_layers[l], writer)
    return x, ck, cv

  def body(carry, inputs):
    x, ck, cv = carry
    layer, lora, glob, l = inputs
    x, (ck, cv) = block(x, layer, lora, glob, _cache_writer(ck, cv, l, idx, native))
    return (x, ck, cv), None

  steps = (layers, lora_layers, is_global_L, jnp.arange(config.num_layers))
  (x, ck, cv), _ = jax.lax.scan(body, (x, ck, cv), steps)
  return x, ck, cv


def embed_rows(params: Params, tokens_BxT: jax.Array) -> jax.Array:
  """The input embedding's rows of `tokens` [B, T] int32: [B, T, D] float32.

  A 16-bit float table is read through the sampler's int8 copy of it when there is one
  ("unembed" of a tied embedding, one scale a row): XLA:CPU gathers no 16-bit floats, so
  it widens the whole table to float32 before the gather and hoists that out of the
  decode loop (a [262144, 640] float32 temporary for Gemma 3 270M, 0.625 GiB); int8 rows
  and their scales are gathered as they are, and only the B * T rows widened. On the Gemma
  3 fixtures the QLoRA sampler copy's logprobs move 0.055 nats a token (mean) against its
  bfloat16 rows; against float32, 0.354 with them and 0.349 without (NF4 dominates)."""
  table, int8 = params["embed"], params.get("unembed")
  if int8 is None or "output" in params or table.dtype == jnp.float32:
    return jnp.take(table, tokens_BxT, axis=0).astype(jnp.float32)
  rows = jnp.take(int8.q, tokens_BxT, axis=0).astype(jnp.float32)
  return rows * jnp.take(int8.scale, tokens_BxT, axis=0)[..., None]


def output_matrix(params: Params) -> jax.Array:
  """The output projection [V, D]: "output" when untied, else the embedding."""
  return params["output"] if "output" in params else params["embed"]


def logits_from_hidden(params: Params, hidden_BxTxD: jax.Array) -> jax.Array:
  """Output projection: [..., D] -> [..., V] float32 (the int8 "unembed" if any)."""
  if "unembed" in params:
    lead = hidden_BxTxD.shape[:-1]
    flat = hidden_BxTxD.reshape(-1, hidden_BxTxD.shape[-1])
    return vocab_major_logits(params, flat).T.reshape(*lead, -1)
  embed = output_matrix(params)
  return jnp.einsum(
    "...d,vd->...v", hidden_BxTxD.astype(embed.dtype), embed, preferred_element_type=jnp.float32
  )


def vocab_major_logits(params: Params, hidden_BxD: jax.Array) -> jax.Array:
  """Output projection for a few rows, as [V, B] float32.

  `embed @ h.T` streams the [V, D] embedding in its stored layout; on XLA:CPU it
  is ~1.6x faster than `h @ embed.T` at decode batch sizes.
  """
  unembed = params.get("unembed")  # the sampler's int8 copy (rlpost.models.quant)
  if isinstance(unembed, q4_native.NativeRows):
    return q4_native.logits(hidden_BxD, unembed)
  if unembed is not None:
    return quant.vocab_major(unembed, hidden_BxD)
  embed = output_matrix(params)
  return jnp.einsum(
    "vd,bd->vb", embed, hidden_BxD.astype(embed.dtype), preferred_element_type=jnp.float32
  )
