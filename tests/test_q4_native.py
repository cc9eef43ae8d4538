"""rlpost.models.q4_native: the native 4-bit matmul against slow obvious references."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlpost import sampling
from rlpost.models import attention, decoder, q4_native, quant4
from rlpost.recipes import blocks, common
from tests import test_quant4

pytestmark = pytest.mark.skipif(
  not q4_native.available()[0], reason=f"no native library: {q4_native.available()[1]}"
)
FORMATS = ("nf4", "nf4_dq", "q4_0", "q4_1", "q4_k")


def _packed(fmt: str, O: int, I: int, seed: int) -> quant4.Packed4:
  """Random codes and scales in `fmt` (the NF4 ones quantised from random weights)."""
  if fmt.startswith("nf4"):
    w = jax.random.normal(jax.random.key(seed), (I, O))
    return quant4.quantize_nf4(w, double=fmt == "nf4_dq")
  return test_quant4._random_packed(fmt, O, I, seed)


def _quantized_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """x [N, I] float32 -> (q int64 [N, I / 32, 32], d float32 [N, I / 32]): round(x / d),
  d = max |x| / 127 per 32 inputs (q 0 where d is)."""
  xg = x.reshape(x.shape[0], -1, 32)
  d = (np.abs(xg).max(-1) / np.float32(127)).astype(np.float32)
  safe = np.where(d == 0, np.float32(1), d)[..., None]
  return np.where(d[..., None] == 0, 0, np.rint(xg / safe)).astype(np.int64), d


def _reference(x: np.ndarray, native: q4_native.NativeQ4) -> np.ndarray:
  """The kernel's arithmetic, slowly: integer sums of table values times int8 activations
  per group of 32, scaled in float64."""
  codes = np.asarray(native.codes)
  O, I, h = codes.shape[0], 2 * codes.shape[1], native.half
  t = q4_native.table(native.fmt).astype(np.int64)
  v = np.zeros((O, I // (2 * h), 2, h), np.int64)
  v[:, :, 0] = t[codes & 15].reshape(O, -1, h)
  v[:, :, 1] = t[codes >> 4].reshape(O, -1, h)
  q, d = _quantized_rows(x)
  sums = np.einsum("ogi,ngi->nog", v.reshape(O, I // 32, 32), q)
  factor = np.asarray(native.scale)[None] * d[:, None]  # float32, as the kernel rounds it
  dsum = (d * q.sum(-1).astype(np.float32)).astype(np.float64)
  shift = np.asarray(native.shift, np.float64)
  return (sums * factor.astype(np.float64)).sum(-1) + (shift[None] * dsum[:, None]).sum(-1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_matmul_equals_the_int8_activation_reference(fmt):
  """Rows 1, 3 and 13 (the kernel's row blocks 8, 4, 2, 1) through the library equal the
  slow reference of its arithmetic within float32 rounding, and x @ dequantize(w) within
  int8 activations' rounding (mean error under 1.5%); 20 rows go through XLA's dot on
  `halves`, which are quant4's values bit for bit for the GGUF formats and within half a
  127th of the absmax (and a float16 rounding) for NF4. Inputs 576 = 4.5 chunks of 128: a partial last chunk.
  Mutations caught: the kernel reading half 32's high nibbles with the low groups' scale
  (`hi(half == 32 ? ... : lo)` -> `lo`), `from_packed` giving q4_0 a shift of -7 d."""
  I = 512 if fmt == "q4_k" else 576
  O = 200  # not a multiple of the 64-output chunks
  w = _packed(fmt, O, I, 1)
  native = q4_native.from_packed(w)
  nf4 = fmt.startswith("nf4")
  for want, got in zip(quant4.halves(w), q4_native.halves(native)):
    if nf4:  # half a 127th of the absmax, and the float16 scale's rounding
      absmax = np.repeat(np.asarray(native.scale, np.float32), 16, axis=-1) * 127
      bound = absmax * (0.5 / 127 + 2.0**-11)
      assert np.all(np.abs(np.asarray(got) - np.asarray(want)) <= bound)
    else:
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  W = np.asarray(quant4.dequantize(w), np.float64)
  for rows in (1, 3, 13, 20):
    x = np.random.default_rng(rows).normal(size=(rows, I)).astype(np.float32)
    got = np.asarray(jax.jit(q4_native.dense)(jnp.asarray(x), native))
    exact = x.astype(np.float64) @ W
    if rows <= q4_native.MAX_ROWS:
      want = _reference(x, native)
      np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
      assert np.abs(got - exact).mean() < 0.015 * np.abs(exact).mean()
    else:
      lo, hi = (np.asarray(h, np.float64) for h in q4_native.halves(native))
      runs = lambda a: a.reshape(O, -1, native.half)
      W_native = np.stack([runs(lo), runs(hi)], axis=2).reshape(O, I).T
      want = x.astype(np.float64) @ W_native
      np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


def _rows_reference(x: np.ndarray, w: q4_native.NativeRows) -> np.ndarray:
  q, d = _quantized_rows(x)
  wq = np.asarray(w.q, np.int64)
  sums = np.einsum("ogi,ngi->nog", wq.reshape(wq.shape[0], -1, 32), q)
  return (sums * d[:, None].astype(np.float64)).sum(-1) * np.asarray(w.scale, np.float64)


def test_rows_matmul_equals_the_reference_and_rows_round_trip():
  """int8 rows with one scale each (the output projection, a GGUF's other blocks): the
  kernel equals the slow reference within float32 rounding (64 inputs a chunk: 576 ends
  in half a chunk); `rows_from_dense` puts every weight within half a step of its row's
  scale, and the largest of each row at +-127. Mutation caught: the rows' activation
  scales spread over the wrong groups (rows spread `1, ..., 0` -> all 0)."""
  V, D = 300, 576
  w = jax.random.normal(jax.random.key(0), (D, V)) * jnp.linspace(0.1, 3.0, V)[None, :]
  rows = q4_native.rows_from_dense(w)
  deq = np.asarray(rows.q, np.float32) * np.asarray(rows.scale)[:, None]
  assert np.all(np.abs(deq - np.asarray(w).T) <= np.asarray(rows.scale)[:, None] * 0.5001)
  np.testing.assert_array_equal(np.abs(np.asarray(rows.q)).max(-1), 127)
  for n in (1, 3, 9):
    x = np.random.default_rng(n).normal(size=(n, D)).astype(np.float32)
    want = _rows_reference(x, rows)
    got = np.asarray(q4_native.rows_matmul(jnp.asarray(x), rows))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    dense = np.asarray(q4_native.rows_dense(jnp.asarray(x), rows))
    np.testing.assert_array_equal(dense, got)


@pytest.mark.slow
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64", "skylake-avx512"])
def test_other_builds_equal_the_reference(march):
  """The kernels built for AVX2 alone (x86-64-v3: what an AMD Zen 3 compiles), plain
  x86-64 (the C++ loops) and AVX-512 without VNNI (maddubs + madd: Skylake), on the
  formats with both run lengths and NF4's signed table, and the int8 rows: equal to the
  slow references within float32 rounding, whatever this machine's own build uses.
  Mutation caught: AVX2 spreading a run's high nibbles with the low group's factor."""
  flags = open("/proc/cpuinfo").read()
  need = {"x86-64-v3": "avx2", "x86-64": "sse2", "skylake-avx512": "avx512bw"}[march]
  if need not in flags:
    pytest.skip(f"needs a CPU with {need}")
  ok, why = q4_native.available(march)
  assert ok, why
  for fmt, rows, inputs in (("q4_k", 1, 256), ("nf4", 5, 320), ("q4_1", 11, 288)):
    native = q4_native.from_packed(_packed(fmt, 72, inputs, 3))
    x = np.random.default_rng(rows).normal(size=(rows, 2 * native.codes.shape[1]))
    x = x.astype(np.float32)
    want = _reference(x, native)
    got = np.asarray(q4_native.matmul(jnp.asarray(x), native, march))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
  w = q4_native.rows_from_dense(jax.random.normal(jax.random.key(1), (96, 40)))
  x = np.random.default_rng(0).normal(size=(3, 96)).astype(np.float32)
  want = _rows_reference(x, w)
  got = np.asarray(q4_native.rows_matmul(jnp.asarray(x), w, march))
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_threads_and_leading_axes_change_nothing(monkeypatch):
  """Outputs handed out one at a time to the threads give the same bits as one chunk
  for all; x with leading axes equals it flattened; a stack converts as its slices."""
  stack = quant4.Packed4(
    jnp.stack([_packed("q4_k", 96, 256, s).codes for s in (1, 2)]),
    jax.tree.map(lambda *a: jnp.stack(a), *[_packed("q4_k", 96, 256, s).scales for s in (1, 2)]),
    "q4_k",
  )
  native = q4_native.from_packed(stack)
  one = jax.tree.map(lambda a: a[1], native)
  sliced = q4_native.from_packed(jax.tree.map(lambda a: a[1], stack))
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(sliced)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  x = jax.random.normal(jax.random.key(0), (2, 3, 256))
  whole = np.asarray(q4_native.dense(x, one))
  monkeypatch.setattr(q4_native, "CHUNK", 1)
  np.testing.assert_array_equal(np.asarray(q4_native.dense(x, one)), whole)
  flat = q4_native.matmul(x.reshape(6, 256), one)
  np.testing.assert_array_equal(np.asarray(flat).reshape(2, 3, 96), whole)


def test_concatenate_outputs_and_refusals():
  """Side by side equals the parts' values side by side; different formats, runs or
  inputs are refused, and a matrix whose inputs 32 does not divide too."""
  a, b = (
    q4_native.from_packed(_packed("q4_1", 8, 256, 1)),
    q4_native.from_packed(_packed("q4_1", 16, 256, 2)),
  )
  cat = q4_native.concatenate_outputs([a, b])
  for part, (ha, hb) in zip(q4_native.halves(cat), zip(q4_native.halves(a), q4_native.halves(b))):
    np.testing.assert_array_equal(np.asarray(part), np.concatenate([ha, hb], axis=-2))
  with pytest.raises(ValueError, match="differ in format"):
    q4_native.concatenate_outputs([a, q4_native.from_packed(_packed("q4_k", 8, 256, 3))])
  odd = quant4.Packed4(jnp.zeros((4, 24), jnp.uint8), {"d": jnp.ones((4, 3), jnp.float16)}, "q4_0")
  with pytest.raises(ValueError, match="inputs 48 are not a multiple of 32"):
    q4_native.from_packed(odd)


def _xla_int8_activations(x_NxI):
  """The kernels' activation rounding in XLA: (q [N, G, 32] float32 integers, d [N, G])."""
  xg = x_NxI.reshape(x_NxI.shape[0], -1, 32)
  d = jnp.max(jnp.abs(xg), axis=-1) / jnp.float32(127)
  q = jnp.where(d[..., None] == 0, 0.0, jnp.round(xg / jnp.where(d == 0, 1.0, d)[..., None]))
  return q, d


def _xla_matmul(x_NxI, w, march="native"):
  """`q4_native.matmul`'s arithmetic in XLA (integer group sums exact in float32)."""
  q, d = _xla_int8_activations(x_NxI.astype(jnp.float32))
  t = jnp.asarray(q4_native.table(w.fmt), jnp.float32)
  O = w.codes.shape[0]
  runs = lambda c: t[c].reshape(O, -1, w.half)
  v = jnp.stack([runs(w.codes & 15), runs(w.codes >> 4)], axis=2).reshape(O, -1, 32)
  sums = jnp.einsum("ngi,ogi->nog", q, v)
  dsum = d * q.sum(-1)
  return (sums * (w.scale[None] * d[:, None])).sum(-1) + (w.shift[None] * dsum[:, None]).sum(-1)


def _xla_rows_matmul(x_NxD, w, march="native"):
  """`q4_native.rows_matmul`'s arithmetic in XLA."""
  q, d = _xla_int8_activations(x_NxD.astype(jnp.float32))
  v = w.q.astype(jnp.float32).reshape(w.q.shape[0], -1, 32)
  return (jnp.einsum("ngi,ogi->nog", q, v) * d[:, None]).sum(-1) * w.scale[None]


@pytest.mark.slow
def test_sampler_reads_the_native_layout_through_the_kernels(monkeypatch):
  """The sampler over `for_decode`'s layout (q/k/v and gate/up fused, int8 output rows,
  steps of up to 16 rows in the kernels, attention in the library) samples what it
  samples with the kernels' arithmetic and attention written in XLA (within float
  rounding), and the greedy tokens of the Packed4 copy (logprobs within int8
  activations' rounding). Mutations caught: `for_decode` leaving the output projection
  as quant's int8 copy (per-token activations); the native layout's decode steps not
  reading the cache through the library."""
  q = quant4.for_sampling(test_quant4._tiny64_params(1))
  native = q4_native.for_decode(q)
  fused = decoder.unstack_layers(native)["layers"][0]
  assert isinstance(fused["gate+up"], q4_native.NativeQ4) and fused["gate+up"].shape == (64, 256)
  assert isinstance(native["unembed"], q4_native.NativeRows)
  sc = sampling.SamplingConfig(temperature=0.0, max_new_tokens=6, stop_ids=(), prompt_bucket=8)
  tokens = jax.random.randint(jax.random.key(2), (2, 8), 3, test_quant4.TINY64.vocab_size)
  run = lambda p: sampling.sample(
    p, tokens, jnp.array([8, 5]), jax.random.key(0), model_config=test_quant4.TINY64, config=sc
  )
  traced = []
  kernel = attention.decode_native
  monkeypatch.setattr(attention, "decode_native", lambda *a: traced.append(1) or kernel(*a))
  a, b = run(native), run(q)
  assert traced, "the native layout's decode steps compute attention in the library"
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=0.05)
  monkeypatch.setattr(q4_native, "matmul", _xla_matmul)
  monkeypatch.setattr(q4_native, "rows_matmul", _xla_rows_matmul)
  monkeypatch.setattr(decoder, "_native_layers", lambda layers: False)  # XLA's attention
  jax.clear_caches()  # retrace: the patched functions are read at trace time
  c = run(native)
  np.testing.assert_array_equal(a.tokens, c.tokens)
  np.testing.assert_allclose(a.logprobs, c.logprobs, atol=2e-5)


def test_for_decode_lays_float_matrices_out_as_int8_rows():
  """A GGUF's blocks in neither 4-bit format (float stacks [L, I, O]) become int8 rows
  [L, O, I] (the NumPy rounding of each output row), norms stay as they are, Packed4
  stacks become NativeQ4; `rows_dense` over a float stack's layer equals the rows'
  float64 product within int8 activations' rounding."""
  params = quant4.for_sampling(test_quant4._tiny64_params(1))
  w = jax.random.normal(jax.random.key(3), (2, 64, 96))
  params = {**params, "layers": {**params["layers"], "v": w}}
  out = q4_native.for_decode(params)["layers"]
  assert isinstance(out["v"], q4_native.NativeRows) and out["v"].q.shape == (2, 96, 64)
  assert isinstance(out["o"], q4_native.NativeQ4)
  norm = params["layers"]["attn_norm"]
  np.testing.assert_array_equal(np.asarray(out["attn_norm"]), np.asarray(norm))
  w_np = np.swapaxes(np.asarray(w), -1, -2)
  scale = np.abs(w_np).max(-1) / np.float32(127)
  got_scale = np.asarray(out["v"].scale)
  np.testing.assert_allclose(got_scale, scale, rtol=3e-7)  # XLA may multiply by 1 / 127
  np.testing.assert_array_equal(np.asarray(out["v"].q), np.rint(w_np / got_scale[..., None]))
  x = np.random.default_rng(0).normal(size=(3, 64)).astype(np.float32)
  layer = jax.tree.map(lambda a: a[1], out["v"])
  got = np.asarray(q4_native.rows_dense(jnp.asarray(x), layer))
  exact = x.astype(np.float64) @ np.asarray(w[1], np.float64)
  assert np.abs(got - exact).mean() < 0.015 * np.abs(exact).mean()


def test_int4_matmul_setting_resolved_recorded_and_refused(tmp_path, monkeypatch):
  """ "auto" becomes native where the library builds and is recorded; a resumed run keeps
  the recorded choice; a typo names the field; "native" without the library names the fix."""
  cfg = ml_collections.ConfigDict({"sampling": {"weights": "int4", "int4_matmul": "auto"}})
  assert common.with_int4_matmul(cfg, str(tmp_path)).sampling.int4_matmul == "native"
  (tmp_path / "config.json").write_text(json.dumps({"sampling": {"int4_matmul": "xla"}}))
  assert common.with_int4_matmul(cfg, str(tmp_path)).sampling.int4_matmul == "xla"
  with pytest.raises(Exception, match="int4_matmul"):
    blocks.SamplingBlock(weights="int4", int4_matmul="fast")
  monkeypatch.setattr(q4_native, "available", lambda march="native": (False, "no compiler"))
  assert q4_native.resolve("auto")[0] == "xla"
  with pytest.raises(ValueError, match="set sampling.int4_matmul=xla"):
    q4_native.resolve("native")


def test_without_a_compiler_the_library_is_unavailable_with_the_fix(tmp_path):
  """A fresh cache and no compiler: `available()` says why and how to fix it, and "auto"
  falls back to XLA (a subprocess: `available` is cached per process)."""
  code = (
    "from rlpost.models import q4_native as q; print(q.available()[0], q.resolve('auto')[0]);"
    "print(q.available()[1])"
  )
  env = {**os.environ, "CXX": "/bin/false", "RLPOST_CACHE_DIR": str(tmp_path)}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  first, why = out.stdout.splitlines()[:2]
  assert first == "False xla" and "apt install g++" in why
