"""Four-bit weights (rlpost.models.quant4): NF4's levels against the paper and against
the normal quantiles, NF4 round trips against a NumPy reference written here, double
quantisation, the two-dot matmul against the dequantised matrix."""

import dataclasses
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlpost import sampling
from rlpost.models import decoder, families, lora, quant4

# arXiv 2305.14314, Appendix E (the NF4 data type), as printed.
PAPER_NF4 = [
  -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
  -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
  0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
  0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]  # fmt: skip


def _nf4_from_quantiles() -> np.ndarray:
  """The paper's construction: quantiles of N(0, 1) at 9 evenly spaced probabilities from
  delta to 1/2 for the positive side (8 values and 0) and at 8 for the negative side (7
  values and 0), one zero dropped, normalised to [-1, 1]; delta = 1 - (1/32 + 1/30) / 2
  (bitsandbytes' offset 0.9677083)."""
  ppf = statistics.NormalDist().inv_cdf
  delta = 1 - (1 / 32 + 1 / 30) / 2
  pos = [ppf(p) for p in np.linspace(delta, 0.5, 9)[:-1]]
  neg = [-ppf(p) for p in np.linspace(delta, 0.5, 8)[:-1]]
  levels = np.sort(np.array(pos + [0.0] + neg))
  return levels / np.max(np.abs(levels))


def test_nf4_levels_are_the_papers_and_the_normal_quantiles():
  """Mutation caught: one level of `NF4_LEVELS` moved by 1e-6 (-0.091051...)."""
  np.testing.assert_array_equal(quant4.NF4_LEVELS, np.float32(PAPER_NF4))
  np.testing.assert_allclose(_nf4_from_quantiles(), PAPER_NF4, rtol=0, atol=1e-6)


def _np_nf4(w_IxO: np.ndarray, block: int = 64):
  """NumPy reference: per output column and block of inputs, absmax; each entry to the
  nearest level (argmin; first on ties). Returns (codes [I, O], absmax [I/block, O],
  dequantised [I, O])."""
  I, O = w_IxO.shape
  blocks = w_IxO.reshape(I // block, block, O)
  amax = np.abs(blocks).max(axis=1)
  amax = np.where(amax > 0, amax, np.float32(1))
  normed = blocks / amax[:, None, :]
  levels = np.float32(PAPER_NF4)
  codes = np.abs(normed[..., None] - levels).argmin(axis=-1)
  deq = levels[codes] * amax[:, None, :]
  return codes.reshape(I, O), amax, deq.reshape(I, O)


def _np_double(amax_OxG: np.ndarray) -> np.ndarray:
  """NumPy reference of the second level: mean removed, int8 per 256 flattened scales."""
  flat = amax_OxG.reshape(-1).astype(np.float64)
  mean = flat.mean()
  n = -(-flat.size // 256) * 256
  groups = np.pad(flat - mean, (0, n - flat.size)).reshape(-1, 256)
  s2 = np.abs(groups).max(axis=1) / 127
  s2 = np.where(s2 > 0, s2, 1.0)
  q = np.clip(np.round(groups / s2[:, None]), -127, 127)
  return ((q * s2[:, None]).reshape(-1)[: flat.size] + mean).reshape(amax_OxG.shape)


_SHAPES = [(64, 3), (128, 5), (192, 40), (640, 17)]


def _weights(shape, seed):
  rng = np.random.default_rng(seed)
  scale = rng.uniform(0.001, 3.0, (shape[0], 1))  # rows of very different size
  w = (rng.standard_normal(shape) * scale).astype(np.float32)
  w[:64, 0] = 0.0  # an all-zero block
  return w


_round_trip = jax.jit(lambda w: quant4.dequantize(quant4.quantize_nf4(w)))


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(_SHAPES), st.integers(0, 2**16))
def test_nf4_round_trip_matches_numpy_reference(shape, seed):
  """Mutations caught: the midpoints taken as the levels (`mids = NF4_LEVELS[1:]`), the
  nibbles swapped in `pack_codes` (`c[..., 1, :] | (c[..., 0, :] << 4)`), blocks of 32."""
  w = _weights(shape, seed)
  codes, amax, deq = _np_nf4(w)
  got = np.asarray(_round_trip(jnp.asarray(w)))
  mismatches = np.sum(got != deq)
  assert mismatches == 0, (mismatches, np.abs(got - deq).max())
  assert np.all(deq[:64, 0] == 0)


def test_nf4_codes_and_layout():
  """The stored nibbles are the reference's codes in the documented order (byte j of a
  64-input block: input j low, input j + 32 high), the scales [O, I / 64].
  Mutation caught: `_nf4_value` reading bit 3 for bit 0 (levels out of order)."""
  w = _weights((128, 6), 3)
  codes, amax, _ = _np_nf4(w)
  p = quant4.quantize_nf4(jnp.asarray(w))
  assert p.codes.dtype == jnp.uint8 and p.codes.shape == (6, 64) and p.shape == (128, 6)
  np.testing.assert_array_equal(np.asarray(p.scales["absmax"]), amax.T)
  b = np.asarray(p.codes).reshape(6, 2, 32)
  want = codes.T.reshape(6, 2, 2, 32)  # [O, block, low/high, j]
  np.testing.assert_array_equal(b & 15, want[:, :, 0])
  np.testing.assert_array_equal(b >> 4, want[:, :, 1])
  lo, hi = quant4.halves(p)
  np.testing.assert_array_equal(
    np.asarray(lo).reshape(6, 2, 32), quant4.NF4_LEVELS[want[:, :, 0]] * amax.T[..., None]
  )


@pytest.mark.parametrize("shape", [(640, 17), (64, 9)])
def test_double_quantised_scales_match_reference(shape):
  """The second level against `_np_double` (float64) within float32 rounding, and within
  its own bound (half an int8 step) of the first-level scales.
  Mutations caught: the mean not added back in `absmax`, scale2 = m / 255."""
  w = _weights(shape, 7)
  _, amax, _ = _np_nf4(w)
  p = quant4.quantize_nf4(jnp.asarray(w), double=True)
  assert p.fmt == "nf4_dq" and p.scales["q"].dtype == jnp.int8
  got = np.asarray(quant4.absmax(p))
  np.testing.assert_allclose(got, _np_double(amax.T), rtol=1e-6, atol=1e-6)
  step = np.repeat(np.asarray(p.scales["scale2"]), 256)[: amax.size].reshape(got.shape)
  assert np.all(np.abs(got - amax.T) <= step / 2 * (1 + 1e-4) + 1e-7)
  single = quant4.quantize_nf4(jnp.asarray(w))
  np.testing.assert_array_equal(np.asarray(p.codes), np.asarray(single.codes))
  np.testing.assert_array_equal(np.asarray(quant4.undouble(p).scales["absmax"]), got)


def _random_packed(fmt, O, I, seed):
  """A Packed4 of format `fmt` with random codes and finite random scales."""
  rng = np.random.default_rng(seed)
  codes = jnp.asarray(rng.integers(0, 256, (O, I // 2), dtype=np.uint8))
  f16 = lambda n: jnp.asarray(rng.uniform(-0.1, 0.1, (O, I // n)).astype(np.float16))
  u6 = lambda: jnp.asarray(rng.integers(0, 64, (O, I // 32), dtype=np.uint8))
  scales = {
    "nf4": lambda: {"absmax": jnp.asarray(rng.uniform(0, 1, (O, I // 64)), jnp.float32)},
    "q4_0": lambda: {"d": f16(32)},
    "q4_1": lambda: {"d": f16(32), "m": f16(32)},
    "q4_k": lambda: {"d": f16(256), "dmin": f16(256), "sc": u6(), "m": u6()},
  }[fmt]()
  return quant4.Packed4(codes, scales, fmt)


@pytest.mark.parametrize("fmt", ["nf4", "q4_0", "q4_1", "q4_k"])
def test_dense4_equals_the_product_with_the_dequantised_matrix(fmt):
  """Two dots over the nibble halves = x @ dequantize(w) within float32 rounding, for
  rows 1 and 5 and leading axes. Mutation caught: `split_inputs` giving the high-nibble
  inputs first (`runs[..., 1, :]` for the low half)."""
  w = _random_packed(fmt, 24, 512, 1)
  x = jax.random.normal(jax.random.key(2), (5, 512))
  want = x @ quant4.dequantize(w)
  got = jax.jit(quant4.dense4)(x, w)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.abs(want).max()))
  got3 = quant4.dense4(x[:2].reshape(2, 1, 512), w)
  np.testing.assert_allclose(
    got3[:, 0], want[:2], rtol=1e-5, atol=1e-5 * float(jnp.abs(want).max())
  )


def test_concatenate_outputs_and_errors():
  """[I, O1] and [I, O2] side by side equal the dequantised matrices side by side;
  mixed formats and a bad format name raise naming the fix."""
  a, b = _random_packed("q4_k", 8, 256, 1), _random_packed("q4_k", 16, 256, 2)
  cat = quant4.concatenate_outputs([a, b])
  np.testing.assert_array_equal(
    quant4.dequantize(cat), jnp.concatenate([quant4.dequantize(a), quant4.dequantize(b)], -1)
  )
  with pytest.raises(ValueError, match="formats differ"):
    quant4.concatenate_outputs([a, _random_packed("q4_0", 8, 256, 3)])
  with pytest.raises(ValueError, match="use one of"):
    quant4.Packed4(a.codes, a.scales, "q3")
  with pytest.raises(ValueError, match="input size 96 is not a multiple of the block 64"):
    quant4.quantize_nf4(jnp.ones((96, 4)))


# The tiny test model with inputs in multiples of 64 (NF4's block).
TINY64 = dataclasses.replace(families.get_config("tiny"), embed_dim=64, mlp_dim=128)


def _tiny64_params(seed=0):
  params = decoder.init_params(jax.random.key(seed), TINY64)
  scaled = {k: v * 5.0 if v.ndim == 3 else v for k, v in params["layers"].items()}
  return {**params, "layers": scaled}  # weights large enough that 4-bit rounding shows


@pytest.mark.slow
def test_four_bit_forward_equals_the_float_forward_on_the_dequantised_weights():
  """The decoder reading Packed4 layers (dense4) against the float32 forward on the same
  values (`dequantized`): logits within float rounding, while NF4 moves them visibly
  from the original float weights. Mutation caught: `_dense` ignoring Packed4 (it would
  fail on the pytree), `dense4` reading `halves(w)` swapped."""
  params = _tiny64_params()
  q = quant4.quantize_layers(params)
  assert all(isinstance(q["layers"][n], quant4.Packed4) for n in decoder.MATRICES)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, TINY64.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(12), (2, 12))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((12, 12), bool)), (2, 12, 12))
  fwd = jax.jit(lambda p: decoder.forward(p, tokens, positions, mask, config=TINY64)[0])
  got, want, orig = fwd(q), fwd(quant4.dequantized(q)), fwd(params)
  scale = float(jnp.abs(want).max())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
  assert float(jnp.abs(orig - want).max()) > 1e-3 * scale


@pytest.mark.slow
def test_sampler_reads_the_four_bit_copy():
  """`for_sampling`'s copy through the sampler (decode layout: q/k/v and gate/up fused as
  Packed4) samples the same greedy tokens with the same logprobs as the float32 copy
  of the same values with the same int8 output projection."""
  q = quant4.for_sampling(_tiny64_params(1))
  floats = {**quant4.dequantized(q), "unembed": q["unembed"]}
  fused = decoder.unstack_layers(q)["layers"][0]
  assert isinstance(fused["q+k+v"], quant4.Packed4) and fused["q+k+v"].shape == (64, 128)
  sc = sampling.SamplingConfig(temperature=0.0, max_new_tokens=6, stop_ids=(), prompt_bucket=8)
  tokens = jax.random.randint(jax.random.key(2), (2, 8), 3, TINY64.vocab_size)
  run = lambda p: sampling.sample(
    p, tokens, jnp.array([8, 5]), jax.random.key(0), model_config=TINY64, config=sc
  )
  a, b = run(decoder.unstack_layers(q)), run(decoder.unstack_layers(floats))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_four_bit_layers_take_blocks_of_32_where_64_does_not_divide():
  """The tiny model (width 32): its [32, O] matrices get one block of 32 per output
  (nibble runs of 16), its [64, O] ones blocks of 64; a width of 48 fails naming the
  matrix. Mutation caught: `half` returning 32 for every NF4 matrix."""
  params = decoder.init_params(jax.random.key(0), families.get_config("tiny"))
  q = quant4.quantize_layers(params)
  assert (
    q["layers"]["q"].scales["absmax"].shape == (4, 64, 1) and quant4.half(q["layers"]["q"]) == 16
  )
  assert q["layers"]["down"].scales["absmax"].shape == (4, 32, 1)
  codes, _, want = _np_nf4(np.asarray(params["layers"]["q"][1]), block=32)
  np.testing.assert_array_equal(np.asarray(quant4.dequantize(q["layers"]["q"]))[1], want)
  bad = {**params, "layers": {**params["layers"], "k": jnp.ones((4, 48, 8))}}
  with pytest.raises(
    ValueError, match="layer matrix 'k': 4-bit weights: 48 inputs are not a multiple of 32"
  ):
    quant4.quantize_layers(bad)


@pytest.mark.slow
def test_lora_gradients_through_a_four_bit_base_equal_the_dequantised_ones():
  """QLoRA: gradients w.r.t. the adapters (and the input) with the Packed4 base in the
  forward (dense4 and its backward) equal those with the dequantised float32 base, within
  float rounding; the adapters' merge into a 4-bit base comes out NF4 again.
  Mutation caught: `_dense4_bwd` merging the halves' gradients swapped."""
  config = dataclasses.replace(TINY64, num_layers=2)
  params = quant4.quantize_layers(decoder.init_params(jax.random.key(3), config))
  floats = quant4.dequantized(params)
  cfg = lora.LoraConfig(rank=4, alpha=8.0)
  adapters = lora.init_adapters(jax.random.key(4), floats, cfg)
  adapters = jax.tree.map(
    lambda a: a + 0.05 * jax.random.normal(jax.random.key(5), a.shape), adapters
  )
  tokens = jax.random.randint(jax.random.key(6), (2, 8), 0, config.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(8), (2, 8))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((8, 8), bool)), (2, 8, 8))
  weights = jax.random.normal(jax.random.key(7), (2, 8, config.vocab_size))

  def loss(ad, base):
    logits, _ = decoder.forward(
      base, tokens, positions, mask, config=config, adapters=ad, lora_scale=cfg.scale
    )
    return jnp.sum(logits * weights)

  grad = jax.jit(jax.grad(loss))
  got, want = grad(adapters, params), grad(adapters, floats)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(jnp.abs(w).max()))
  assert float(jnp.abs(want["layers"]["q"]["a"]).max()) > 0
  merged = lora.merged_weights(
    {"up": params["layers"]["up"]}, {"layers": {"up": adapters["layers"]["up"]}}, cfg
  )
  assert isinstance(merged["up"], quant4.Packed4)
  exact = lora.merged_weights(
    {"up": floats["layers"]["up"]}, {"layers": {"up": adapters["layers"]["up"]}}, cfg
  )
  np.testing.assert_array_equal(
    quant4.dequantize(merged["up"]), quant4.dequantize(quant4.quantize_nf4(exact["up"]))
  )


def test_native_prefill_dequantises_one_layer_at_a_time():
  """A prefill (more than MAX_ROWS rows) through a chain of unrolled NativeQ4 layers, as
  the sampler's decode layout runs it: each layer's float32 halves are made once its
  input exists, so the program's temporaries stay below three layers' halves (before:
  every layer's at once); the product is `dense`'s halves dot either way, and the tie
  (`q4_native.after`) is 0 for any input, NaN and inf included (compiled, small).

  Mutation caught: the halves made without the tie to x (`native_prefill_untied`)."""
  from rlpost.models import q4_native  # pylint: disable=g-import-not-at-top

  L, D, N = 8, 256, 64
  keys = jax.random.split(jax.random.key(8), L + 1)
  ws = [q4_native.from_packed(quant4.quantize_nf4(jax.random.normal(k, (D, D)))) for k in keys[1:]]
  x = jax.random.normal(keys[0], (N, D))

  def chain(x, ws):
    for w in ws:
      x = jnp.tanh(q4_native.dense(x, w))
    return x

  assert N > q4_native.MAX_ROWS
  compiled = jax.jit(chain).lower(x, ws).compile()
  halves_bytes = D * D * 4  # one layer's two [D, D / 2] float32 halves
  temp = compiled.memory_analysis().temp_size_in_bytes
  assert temp < 3 * halves_bytes, (temp, halves_bytes)
  want = x
  for w in ws:
    lo, hi = q4_native.halves(w)
    x_lo, x_hi = quant4.split_inputs(want, w.half)
    want = jnp.tanh(x_lo @ lo.T + x_hi @ hi.T)
  np.testing.assert_allclose(compiled(x, ws), want, rtol=1e-5, atol=1e-5)
  for v in (0.5, np.nan, np.inf, -np.inf):
    assert float(q4_native.after(jnp.full((2, 3), v, jnp.float32))) == 0.0


def test_frozen_base_keeps_the_embedding_in_the_trainer_matmul_dtype():
  """`frozen_base(params, "bfloat16")`: layer matrices NF4, embedding and untied output
  bfloat16, norms as they were; the bfloat16 output projection's logprobs are the same
  bits from it as from the float32 embedding (`ops.logprobs` rounds it to bfloat16
  anyway: the product the trainer reads is unchanged).
  Mutation caught: `frozen_base` leaving the embedding as loaded."""
  from rlpost.ops import logprobs  # pylint: disable=g-import-not-at-top

  params = _tiny64_params()
  params = {**params, "output": params["embed"] * 0.5}
  base = quant4.frozen_base(params, "bfloat16")
  assert all(isinstance(base["layers"][n], quant4.Packed4) for n in decoder.MATRICES)
  assert base["embed"].dtype == base["output"].dtype == jnp.bfloat16
  assert base["final_norm"].dtype == params["final_norm"].dtype
  np.testing.assert_array_equal(base["embed"], params["embed"].astype(jnp.bfloat16))
  hidden = jax.random.normal(jax.random.key(2), (2, 5, TINY64.embed_dim))
  targets = jax.random.randint(jax.random.key(3), (2, 5), 0, TINY64.vocab_size)
  mask = jnp.ones((2, 5), bool)
  logp = lambda e: logprobs.token_logprobs(hidden, e, targets, mask, compute_dtype="bfloat16")
  np.testing.assert_array_equal(logp(base["embed"]), logp(params["embed"]))
  assert quant4.frozen_base(params)["embed"].dtype == jnp.float32


@pytest.mark.parametrize("double", [False, True])
def test_requantized_stack_equals_the_whole_stack_formula_one_matrix_at_a_time(double):
  """Merging a delta into a stacked 4-bit base [L, I, O] gives NF4 of the whole stack's
  dequantised values plus the delta (the formula it replaces: the same codes, the scales
  within float rounding, double-quantised ones within one second-level step), while its
  compiled temporaries stay below that stack's float32 bytes (compiled, not run).

  Mutation caught: `requantized` quantising the whole stack at once (the `lax.map`
  replaced by `one((w, delta_IxO))`): the temporaries test fails."""
  L, I, O = 12, 256, 512
  keys = jax.random.split(jax.random.key(5), 2)
  w = quant4.quantize_nf4(jax.random.normal(keys[0], (L, I, O)), double)
  delta = 0.05 * jax.random.normal(keys[1], (L, I, O))
  got = jax.jit(quant4.requantized)(w, delta)
  want = quant4.quantize_nf4(quant4.dequantize(w) + delta, double)
  assert got.fmt == want.fmt
  np.testing.assert_array_equal(got.codes, want.codes)
  # a matrix's mean of its scales sums in another order than the stack's (1 ulp apart),
  # which can move a double-quantised scale by one second-level step
  step = float(jnp.max(want.scales["scale2"])) if double else 0.0
  np.testing.assert_allclose(quant4.absmax(got), quant4.absmax(want), rtol=1e-6, atol=1.01 * step)
  compiled = jax.jit(quant4.requantized).lower(w, delta).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < L * I * O * 4 // 2


@pytest.mark.parametrize("double", [False, True])
def test_lora_merge_into_a_4bit_stack_makes_each_layers_product_apart(double):
  """`lora.merged_weights` over a stacked 4-bit base [L, I, O]: NF4 of its dequantised
  values plus scale * A @ B (`quant4.requantized` of the whole stack's product: the same
  codes, the scales within rounding), while the merge program's temporaries stay below
  half that stack's float32 bytes: the [L, I, O] product is never whole (compiled, not
  run).

  Mutation caught: `lora_requantized` given the stack's whole product
  (`lora_requantized_whole_product`); `merged_weights` computing it before the 4-bit
  merge (`lora_merge_whole_delta`)."""
  L, I, O, R = 12, 256, 512, 8
  keys = jax.random.split(jax.random.key(6), 3)
  w = quant4.quantize_nf4(jax.random.normal(keys[0], (L, I, O)), double)
  ab = {
    "a": 0.3 * jax.random.normal(keys[1], (L, I, R)),
    "b": 0.3 * jax.random.normal(keys[2], (L, R, O)),
  }
  cfg = lora.LoraConfig(rank=R, alpha=16.0)
  merge = jax.jit(lambda w, ab: lora.merged_weights({"up": w}, {"layers": {"up": ab}}, cfg))
  got = merge(w, ab)["up"]
  delta = cfg.scale * jnp.einsum("lir,lro->lio", ab["a"], ab["b"])
  want = jax.jit(quant4.requantized)(w, delta)
  assert got.fmt == want.fmt
  np.testing.assert_array_equal(got.codes, want.codes)
  step = float(jnp.max(want.scales["scale2"])) if double else 0.0
  np.testing.assert_allclose(quant4.absmax(got), quant4.absmax(want), rtol=1e-6, atol=1.01 * step)
  compiled = merge.lower(w, ab).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < L * I * O * 4 // 2
