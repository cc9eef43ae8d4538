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
from rlpost.models import decoder, q4_native, quant4
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


@pytest.mark.parametrize("fmt", FORMATS)
def test_matmul_equals_the_float64_product_with_the_dequantised_matrix(fmt):
  """Rows 1, 3 and 13 (the kernel's row blocks 8, 4, 2, 1) through the library, 20 rows
  through XLA's dot: x @ dequantize(w) in float64 within float32 rounding; the kernel's
  dequantised values (`halves`) are quant4's bit for bit. Mutations caught: the kernel
  reading the low group's scale for the high nibbles (`g_hi = i_lo / kGroup`),
  `from_packed` giving q4_0 a shift of -7 d."""
  I, O = 512, 200  # O not a multiple of the 64-output chunks
  w = _packed(fmt, O, I, 1)
  native = q4_native.from_packed(w)
  for want, got in zip(quant4.halves(w), q4_native.halves(native)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  W = np.asarray(quant4.dequantize(w), np.float64)
  for rows in (1, 3, 13, 20):
    x = np.random.default_rng(rows).normal(size=(rows, I)).astype(np.float32)
    want = x.astype(np.float64) @ W
    got = np.asarray(jax.jit(q4_native.dense)(jnp.asarray(x), native))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


@pytest.mark.slow
@pytest.mark.skipif("avx2" not in open("/proc/cpuinfo").read(), reason="needs an AVX2 CPU")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])
def test_avx2_and_plain_builds_equal_the_reference(march):
  """The kernel built for AVX2 alone (x86-64-v3: what an AMD Zen 3 compiles) and for
  plain x86-64 (the C++ loop) on the formats with both run lengths: within float32
  rounding of the float64 product, whatever this machine's own build uses."""
  ok, why = q4_native.available(march)
  assert ok, why
  for fmt, rows in (("q4_k", 1), ("nf4", 5), ("q4_1", 11)):
    w = _packed(fmt, 72, 256, 3)
    x = np.random.default_rng(rows).normal(size=(rows, 256)).astype(np.float32)
    want = x.astype(np.float64) @ np.asarray(quant4.dequantize(w), np.float64)
    got = np.asarray(q4_native.matmul(jnp.asarray(x), q4_native.from_packed(w), march))
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


@pytest.mark.slow
def test_sampler_reads_the_native_layout_like_the_packed_one():
  """The sampler over `for_decode`'s layout (q/k/v and gate/up fused, decode steps in the
  kernel, the prefill through XLA) samples the greedy tokens of the Packed4 copy, with
  logprobs within float rounding."""
  q = quant4.for_sampling(test_quant4._tiny64_params(1))
  native = q4_native.for_decode(q)
  fused = decoder.unstack_layers(native)["layers"][0]
  assert isinstance(fused["gate+up"], q4_native.NativeQ4) and fused["gate+up"].shape == (64, 256)
  sc = sampling.SamplingConfig(temperature=0.0, max_new_tokens=6, stop_ids=(), prompt_bucket=8)
  tokens = jax.random.randint(jax.random.key(2), (2, 8), 3, test_quant4.TINY64.vocab_size)
  run = lambda p: sampling.sample(
    p, tokens, jnp.array([8, 5]), jax.random.key(0), model_config=test_quant4.TINY64, config=sc
  )
  a, b = run(native), run(q)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


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
