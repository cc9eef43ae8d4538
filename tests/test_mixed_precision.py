"""Mixed-precision training matmuls (`compute_dtype="bfloat16"`): exact rules, real bf16 dots."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.ops import logprobs
from rlpost.supervised import sft
from rlpost.models import decoder
from rlpost.models import families
from rlpost.models import policy

CONFIG = families.get_config("tiny")
BF16 = jnp.bfloat16


def _round_bf16(x):
  return np.asarray(jnp.asarray(x).astype(BF16).astype(jnp.float32), np.float64)


def test_mixed_dense_forward_and_backward_are_bf16_products_accumulated_exactly():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 5, 24)).astype(np.float32)
  w = rng.normal(size=(24, 40)).astype(np.float32)
  g = rng.normal(size=(3, 5, 40)).astype(np.float32)
  y, vjp = jax.vjp(lambda x, w: decoder._dense(x, w, "bfloat16"), x, w)
  dx, dw = vjp(jnp.asarray(g))
  xr, wr, gr = _round_bf16(x), _round_bf16(w), _round_bf16(g)
  # float64 products of the bf16-rounded operands: only float32 accumulation error remains.
  np.testing.assert_allclose(y, xr @ wr, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, gr @ wr.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dw, np.einsum("bti,bto->io", xr, gr), rtol=1e-5, atol=1e-5)
  assert y.dtype == dx.dtype == dw.dtype == jnp.float32  # float32 master weights


def test_mixed_dense_is_the_plain_matmul_when_nothing_is_cast():
  rng = np.random.default_rng(1)
  x, w = rng.normal(size=(4, 8)).astype(np.float32), rng.normal(size=(8, 6)).astype(np.float32)
  for cd in (None, "float32"):
    np.testing.assert_array_equal(decoder._dense(x, w, cd), jnp.matmul(x, w))


def _tiny_batch(seed=0, rows=2, seq=16):
  rng = np.random.default_rng(seed)
  examples = []
  for _ in range(rows):
    tokens = rng.integers(3, CONFIG.vocab_size, size=seq).astype(np.int32)
    examples.append((tokens, np.arange(seq) >= seq // 3))
  return sft.make_batch(examples, seq_len=seq, pad_id=0, micro_batch_size=rows, gather_bucket=8)


def _loss_and_grads(compute_dtype, params, batch, remat="dots"):
  loss_fn = sft.make_loss_fn(
    policy.ForwardConfig(
      CONFIG, compute_dtype=compute_dtype, remat=remat or "none", logprob_chunk=8
    )
  )
  return jax.jit(jax.value_and_grad(lambda p: loss_fn(p, None, batch)[0]))(params)


@pytest.mark.slow
@pytest.mark.parametrize("remat", [None, "dots"])
def test_bf16_compute_tracks_float32_loss_and_gradient(remat):
  params = decoder.init_params(jax.random.key(0), CONFIG)
  params = jax.tree.map(lambda x: x * 20 if x.ndim >= 2 else x, params)
  batch = _tiny_batch()
  loss32, grads32 = _loss_and_grads("float32", params, batch, remat)
  loss16, grads16 = _loss_and_grads("bfloat16", params, batch, remat)
  assert abs(float(loss16) - float(loss32)) < 2e-2 * abs(float(loss32))
  for (path, g32), g16 in zip(
    jax.tree_util.tree_leaves_with_path(grads32), jax.tree.leaves(grads16)
  ):
    name = jax.tree_util.keystr(path)
    assert g16.dtype == jnp.float32
    cos = float(jnp.vdot(g32, g16) / (jnp.linalg.norm(g32) * jnp.linalg.norm(g16) + 1e-30))
    assert cos > 0.99, (name, cos)
  # and it is not the float32 computation under another name
  assert float(loss16) != float(loss32)


def _dot_operand_dtypes(jaxpr, out):
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (_, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
      out.append((tuple(v.aval.dtype for v in eqn.invars), bool(lhs_batch)))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      _dot_operand_dtypes(sub, out)
  return out


def test_every_weight_matmul_of_a_bf16_train_step_runs_in_bf16():
  """Forward and backward: each dot without batch dims (every weight matmul and the
  output projection; attention's batched einsums stay float32) takes bf16 operands."""
  params = decoder.init_params(jax.random.key(0), CONFIG)
  batch = _tiny_batch()
  loss_fn = sft.make_loss_fn(
    policy.ForwardConfig(CONFIG, compute_dtype="bfloat16", remat="dots", logprob_chunk=8)
  )
  jaxpr = jax.make_jaxpr(jax.value_and_grad(lambda p: loss_fn(p, None, batch)[0]))(params)
  dots = _dot_operand_dtypes(jaxpr.jaxpr, [])
  weight_dots = [dtypes for dtypes, batched in dots if not batched]
  # 7 weight matmuls per layer forward + 2 backward each; projection 1 + 2.
  assert len(weight_dots) >= 3 * 7 + 3, len(weight_dots)
  assert all(dtypes == (jnp.dtype(BF16),) * 2 for dtypes in weight_dots), weight_dots
  batched = {dtypes for dtypes, b in dots if b}
  assert batched == {(jnp.dtype(jnp.float32),) * 2}, batched


def test_bf16_projection_gradient_matches_float64_rule_on_rounded_values():
  rng = np.random.default_rng(3)
  h = rng.normal(size=(1, 6, 16)).astype(np.float32)
  e = rng.normal(size=(40, 16)).astype(np.float32) * 0.5
  targets = rng.integers(0, 40, size=(1, 6)).astype(np.int32)
  mask = np.ones((1, 6), bool)
  cot = rng.normal(size=(1, 6)).astype(np.float32)

  def objective(h, e):
    return jnp.sum(
      cot * logprobs.token_logprobs(h, e, targets, mask, chunk=6, compute_dtype="bfloat16")
    )

  value, (dh, de) = jax.value_and_grad(objective, argnums=(0, 1))(h, e)
  hr, er = _round_bf16(h[0]), _round_bf16(e)
  z = hr @ er.T
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  logp = np.log(p[np.arange(6), targets[0]])
  np.testing.assert_allclose(value, np.sum(cot[0] * logp), rtol=1e-5)
  dz = _round_bf16(cot[0][:, None] * (np.eye(40)[targets[0]] - p))  # dz is rounded too
  np.testing.assert_allclose(dh[0], dz @ er, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(de, dz.T @ hr, rtol=1e-4, atol=1e-5)
