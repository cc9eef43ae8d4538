"""Int8 sampler weights (rlpost.models.quant): rounding bounds, int8 matmuls against the
float product within their worst-case bound, the copy's layout through the sampler."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlpost import sampling
from rlpost.models import decoder
from rlpost.models import families
from rlpost.models import quant

# (rows, inputs, outputs, group): a few fixed shapes, each size of rows {1, 2, 5}, inputs
# {8, 24, 64, 96}, outputs {1, 3, 9} and block rows {8, 32, 1000} at least once; blocks
# that divide the inputs (8 | 24, 8 | 96, 32 | 96) and one block (32 does not divide 8 or
# 24; 1000 none). Each property runs as one jitted program per shape (compiled once, so
# the examples vary the data, drawn by seed, not the compilations).
_SHAPES = [
  (1, 8, 1, 32),
  (2, 24, 3, 8),
  (5, 96, 9, 32),
  (2, 64, 9, 1000),
  (5, 24, 1, 32),
  (1, 96, 3, 8),
]
_shapes = st.tuples(st.sampled_from(_SHAPES), st.integers(0, 2**16)).map(lambda s: (*s[0], s[1]))
_jit_group = functools.partial(jax.jit, static_argnames=("group",))


def _data(rows, inputs, outputs, seed):
  rng = np.random.default_rng(seed)
  # Channels of very different size: one scale per row would round the small ones away.
  x = rng.standard_normal((rows, inputs)) * rng.uniform(0.01, 30.0, inputs)
  w = rng.standard_normal((inputs, outputs)) * rng.uniform(0.01, 5.0, (inputs, 1))
  return jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32)


@_jit_group
def _round_trip(w, group):
  q = quant.quantize_blocks(w, group)
  return q, quant.dequantize_blocks(q)


@settings(max_examples=40, deadline=None)
@given(_shapes)
def test_blocks_round_each_entry_to_half_its_block_scale(shape):
  """Mutation caught: `_round` truncating (jnp.floor for jnp.round)."""
  _, inputs, outputs, group, seed = shape
  _, w = _data(1, inputs, outputs, seed)
  q, deq = _round_trip(w, group)
  k = quant.block_size(inputs, group)
  assert q.q.dtype == jnp.int8 and q.scale.shape == (inputs // k, outputs)
  scale = np.repeat(np.asarray(q.scale), k, axis=0)
  err = np.abs(np.asarray(deq) - np.asarray(w))
  assert np.all(err <= scale / 2 * (1 + 1e-5))
  # The largest entry of each block and column is exactly +-127 steps.
  qmax = np.abs(np.asarray(q.q, np.int32)).reshape(inputs // k, k, outputs).max(1)
  assert np.all(qmax == 127)


@_jit_group
def _dense_and_bound(x, w, group):
  q = quant.quantize_blocks(w, group)
  rows, inputs = x.shape
  return (
    quant.dense(x, q),
    quant.dense(x.reshape(rows, 1, inputs), q),
    quant.matmul_error_bound(x, w, group),
    x @ w,
  )


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(_shapes)
def test_int8_matmul_is_within_its_worst_case_bound_of_the_float_product(shape):
  rows, inputs, outputs, group, seed = shape
  x, w = _data(rows, inputs, outputs, seed)
  got, got3, bound, exact = _dense_and_bound(x, w, group)
  err = jnp.abs(got - exact)
  assert got.shape == (rows, outputs) and got.dtype == jnp.float32
  np.testing.assert_array_less(err, bound * (1 + 1e-4) + 1e-4)
  # Leading dims are rows too.
  np.testing.assert_allclose(got3[:, 0], got, rtol=1e-6, atol=1e-5)


@_jit_group
def _both_layouts(x, w, group):
  io, oik = (quant.quantize_blocks(w, group, layout) for layout in quant.LAYER_LAYOUTS)
  oik2 = quant.quantize_blocks(2 * w, group, "oik")
  both = quant.concatenate_outputs([oik, oik2])
  deq = quant.dequantize_blocks(oik), quant.dequantize_blocks(io)
  dense = quant.dense(x, oik), quant.dense(x, io)
  return io, oik, deq, dense, quant.dense(x, both), quant.dense(x, oik2)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(_shapes)
def test_both_layer_layouts_hold_the_same_int8_values_and_give_the_same_products(shape):
  """ "oik" stores each block transposed and puts the weights on the left of the dot: the
  same int32 products, so the same outputs as "io" up to float summation order."""
  rows, inputs, outputs, group, seed = shape
  x, w = _data(rows, inputs, outputs, seed)
  io, oik, (deq_oik, deq_io), (dense_oik, want), dense_both, dense_oik2 = _both_layouts(x, w, group)
  G, k = inputs // quant.block_size(inputs, group), quant.block_size(inputs, group)
  assert oik.q.shape == (G, outputs, k) and oik.layout == "oik"
  np.testing.assert_array_equal(
    np.swapaxes(np.asarray(oik.q), -1, -2), np.asarray(io.q).reshape(G, k, outputs)
  )
  np.testing.assert_array_equal(oik.scale, io.scale)
  np.testing.assert_array_equal(deq_oik, deq_io)
  np.testing.assert_allclose(dense_oik, want, rtol=1e-6, atol=1e-5 * float(jnp.abs(want).max()))
  # Side by side (the decode layout's q+k+v): the concatenation of the products.
  np.testing.assert_allclose(dense_both, jnp.concatenate([dense_oik, dense_oik2], -1), rtol=1e-6)


_error_bound = _jit_group(quant.matmul_error_bound)


@settings(max_examples=15, deadline=None)
@given(_shapes)
def test_error_bound_equals_its_entrywise_sum_written_out(shape):
  """The bound against a loop over (row, output, block, input) of the per-product worst
  case |x_i| s_w / 2 + |w_i| s_x / 2 + s_x s_w / 4 (a wrong block size, a dropped term or
  a wrong half shows here; the bound test above only checks it is not too small).
  Mutation caught: the s_x s_w term's k / 4 written k / 8."""
  rows, inputs, outputs, group, seed = shape
  x, w = (np.asarray(a, np.float64) for a in _data(rows, inputs, outputs, seed))
  k = quant.block_size(inputs, group)
  want = np.zeros((rows, outputs))
  for n in range(rows):
    for o in range(outputs):
      for g in range(inputs // k):
        xs, ws = x[n, g * k : (g + 1) * k], w[g * k : (g + 1) * k, o]
        s_x, s_w = np.abs(xs).max() / 127, np.abs(ws).max() / 127
        want[n, o] += sum(
          abs(a) * s_w / 2 + abs(b) * s_x / 2 + s_x * s_w / 4 for a, b in zip(xs, ws)
        )
  got = _error_bound(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32), group=group)
  np.testing.assert_allclose(got, want, rtol=1e-4)


@jax.jit
def _output_projection(h, e_DxV):
  unembed = quant.quantize_rows(e_DxV.T)
  bound = quant.matmul_error_bound(h, e_DxV, group=h.shape[1])
  return unembed, quant.vocab_major(unembed, h), quant.dequantize_rows(unembed), bound, h @ e_DxV


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(_shapes)
def test_output_projection_is_within_the_one_block_bound(shape):
  rows, inputs, vocab, _, seed = shape
  h, e_DxV = _data(rows, inputs, vocab, seed)
  unembed, got, deq, bound, exact = _output_projection(h, e_DxV)  # got: [V, B]
  np.testing.assert_allclose(deq, e_DxV.T, atol=float(unembed.scale.max()) / 2 + 1e-6)
  np.testing.assert_array_less(jnp.abs(got.T - exact), bound * (1 + 1e-4) + 1e-4)


@jax.jit
def _both_operand_orders(h, e_DxV):
  unembed = quant.quantize_rows(e_DxV.T)
  rows = h.shape[0]
  chunks = [quant.vocab_major(unembed, h[i : i + 4]) for i in range(0, rows, 4)]
  others = [quant.vocab_major(quant.quantize_rows(e_DxV.T, t), h) for t in (0, 64)]
  bound = quant.matmul_error_bound(h, e_DxV, group=64)
  return (
    unembed,
    quant.vocab_major(unembed, h),
    jnp.concatenate(chunks, 1),
    others,
    bound,
    h @ e_DxV,
  )


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(st.sampled_from([9, 13, 20]), st.integers(0, 2**16))
def test_output_projection_gives_the_same_logits_in_both_operand_orders(rows, seed):
  """Above `activations_left_max_rows` rows the weights go on the left of the int8 dot;
  the same rows in chunks of at most that many take the other order, and a threshold of
  0 (weights always on the left) or of more rows gives the same logits."""
  h, e_DxV = _data(rows, 64, 7, seed)
  unembed, logits, chunked, others, bound, exact = _both_operand_orders(h, e_DxV)
  assert unembed.activations_left_max_rows == 8 and unembed.layout == "rows"
  np.testing.assert_allclose(logits, chunked, rtol=1e-6)
  for other in others:
    np.testing.assert_allclose(other, logits, rtol=1e-6)
  np.testing.assert_array_less(jnp.abs(logits.T - exact), bound * (1 + 1e-4) + 1e-4)


@jax.jit
def _rows_in_one_pass(w_VxD):
  """The output rows as one expression (the form before the two passes)."""
  m = jnp.max(jnp.abs(w_VxD.astype(jnp.float32)), axis=-1, keepdims=True)
  scale = jnp.where(m > 0, m / 127.0, 1.0)
  q = jnp.clip(jnp.round(w_VxD.astype(jnp.float32) / scale), -127, 127).astype(jnp.int8)
  return q, scale[:, 0]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_output_rows_equal_the_one_pass_rows_bit_for_bit(dtype):
  """`quantize_rows` (scales and rounding in two passes) gives the one-pass expression's
  int8 rows and scales exactly, for float32 and bfloat16 rows of very different sizes
  and a zero row (scale 1); and they are absmax / 127 and w / scale rounded (NumPy).
  Mutation caught: the scales taken from the rows' bfloat16 rounding
  (`quant_rows_scale_from_bfloat16`)."""
  rng = np.random.default_rng(7)
  w = rng.standard_normal((96, 40)) * rng.uniform(1e-3, 50.0, (96, 1))
  w[5] = 0.0
  w_in = jnp.asarray(w, dtype)
  got = jax.jit(quant.quantize_rows)(w_in)
  q, scale = _rows_in_one_pass(w_in)
  np.testing.assert_array_equal(np.asarray(got.scale), np.asarray(scale))
  np.testing.assert_array_equal(np.asarray(got.q), np.asarray(q))
  w32 = np.asarray(w_in.astype(jnp.float32), np.float64)
  m = np.abs(w32).max(axis=1)
  np.testing.assert_allclose(got.scale, np.where(m > 0, m / 127, 1.0), rtol=1e-6)
  assert np.abs(w32 / np.asarray(got.scale, np.float64)[:, None] - got.q).max() <= 0.5 + 1e-5


def test_output_rows_of_a_bfloat16_matrix_make_no_float32_copy_of_it():
  """XLA:CPU's temporaries for `quantize_rows` of a bfloat16 [V, D] stay under a tenth
  of its float32 widening (Gemma 3 270M: 0.63 GiB at every weight sync before). Mutation
  caught: the optimization barrier between the scales and the rounding dropped
  (`quant_rows_widened_once`)."""
  V, D = 8192, 64
  compiled = jax.jit(quant.quantize_rows).lower(jax.ShapeDtypeStruct((V, D), jnp.bfloat16))
  stats = compiled.compile().memory_analysis()
  if stats is None:
    pytest.skip(f"no memory analysis on {jax.default_backend()}")
  assert stats.temp_size_in_bytes < V * D * 4 / 10, stats.temp_size_in_bytes


def test_blocks_beat_one_scale_per_column_when_rows_differ_in_size():
  """The reason for blocks: an input channel 100x larger than the rest."""
  x, w = _data(4, 64, 16, 0)
  x = x.at[:, 3].mul(100.0)
  exact = x @ w
  blocked = jnp.abs(quant.dense(x, quant.quantize_blocks(w, 8)) - exact).mean()
  whole = jnp.abs(quant.dense(x, quant.quantize_blocks(w, 64)) - exact).mean()
  assert blocked < 0.5 * whole, (blocked, whole)


def test_unknown_layouts_are_refused():
  with pytest.raises(ValueError, match="layout='ik'"):
    quant.quantize_blocks(jnp.ones((8, 4)), 8, "ik")
  with pytest.raises(ValueError, match="Int8Paths.layer_layout='ik'"):
    quant.Int8Paths("ik", 8)
  with pytest.raises(ValueError, match="activations_left_max_rows=-1"):
    quant.Int8Paths("io", -1)


def test_zero_blocks_stay_zero():
  w = jnp.zeros((32, 4)).at[16:, 1].set(1.0)
  for layout in quant.LAYER_LAYOUTS:
    q = quant.quantize_blocks(w, 16, layout)
    np.testing.assert_array_equal(quant.dequantize_blocks(q), w)
    np.testing.assert_array_equal(quant.dense(jnp.zeros((2, 32)), q), jnp.zeros((2, 4)))


def _tiny():
  config = families.get_config("tiny")
  return config, decoder.init_params(jax.random.key(0), config)


@pytest.mark.slow
@pytest.mark.parametrize("layout", quant.LAYER_LAYOUTS)
def test_the_sampler_copy_keeps_float_lookup_and_norms_and_unstacks_with_its_scales(layout):
  config, params = _tiny()
  q = quant.quantize_for_sampling(params, group=16, paths=quant.Int8Paths(layout, 0))
  assert q["unembed"].activations_left_max_rows == 0
  assert q["embed"] is params["embed"] and q["final_norm"] is params["final_norm"]
  assert isinstance(q["unembed"], quant.Int8Weight) and q["unembed"].q.shape == (
    config.vocab_size,
    config.embed_dim,
  )
  for name, w in params["layers"].items():
    if w.ndim == 3:
      assert isinstance(q["layers"][name], quant.Int8Weight), name
      assert q["layers"][name].layout == layout, name
    else:
      assert q["layers"][name] is w, name
  # The decode layout concatenates q/k/v and gate/up: values and scales alike.
  unstacked_then_float = quant.float_view(decoder.unstack_layers(q))
  float_then_unstacked = decoder.unstack_layers(quant.float_view(q))
  assert "unembed" not in unstacked_then_float
  for a, b in zip(unstacked_then_float["layers"], float_then_unstacked["layers"]):
    for name in b:
      np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  for name, w in params["layers"].items():
    if w.ndim == 3:
      deq = quant.float_view(q)["layers"][name]
      np.testing.assert_array_less(jnp.abs(deq - w), 0.02 * jnp.abs(w).max() + 1e-6)


@pytest.mark.slow
def test_int8_sampler_decodes_with_int8_matmuls_after_a_float_prefill():
  """The prefill (and so the first token) reads the dequantized weights: bitwise what the
  float sampler gives on `float_view`; the decode steps run int8 x int8 matmuls, with
  quantized activations: a small, nonzero step away from that float run."""
  config, params = _tiny()
  params = jax.tree.map(lambda w: w * 8 if w.ndim >= 2 else w, params)  # wider margins
  sc = sampling.SamplingConfig(temperature=0.0, max_new_tokens=8, stop_ids=(), prompt_bucket=8)
  tokens, lengths = sampling.pad_prompts([[5, 6, 7], [9, 10, 11, 12, 13]], sc)
  run = lambda p: sampling.sample(
    p, tokens, lengths, jax.random.key(0), model_config=config, config=sc
  )
  q = quant.quantize_for_sampling(params, group=16)
  deq, int8 = run(quant.float_view(q)), run(q)
  np.testing.assert_array_equal(deq.tokens[:, 0], int8.tokens[:, 0])
  np.testing.assert_array_equal(deq.logprobs[:, 0], int8.logprobs[:, 0])
  same = np.asarray(deq.tokens == int8.tokens).all(1)
  gap = np.abs(np.asarray(deq.logprobs - int8.logprobs))[same][:, 1:]
  assert same.any() and 0 < gap.max() < 0.1, (same, gap)
  # The machine's choice of dot layouts changes speed, not the samples.
  for paths in (quant.Int8Paths("oik", 0), quant.Int8Paths("io", 64)):
    other = run(quant.quantize_for_sampling(params, group=16, paths=paths))
    np.testing.assert_array_equal(other.tokens, int8.tokens)
    np.testing.assert_allclose(other.logprobs, int8.logprobs, atol=1e-5)
