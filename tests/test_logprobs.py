"""Tests for rlpost.logprobs against slow, obvious numpy references."""

import functools

import chex
from hypothesis import given, settings, strategies as st
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.ops import logprobs

SETTINGS = settings(max_examples=30, deadline=None)
DIM = 8

_logprobs_jit = jax.jit(logprobs.token_logprobs, static_argnames=("chunk", "return_entropy"))


def _np_reference(hidden, embed, targets, mask, temperature):
  """float64 full-logits logp, entropy and softmax, masked positions 0."""
  logits = hidden.astype(np.float64) @ embed.astype(np.float64).T / temperature
  shift = logits.max(-1, keepdims=True)
  lse = shift[..., 0] + np.log(np.exp(logits - shift).sum(-1))
  probs = np.exp(logits - lse[..., None])
  batch, seq = targets.shape
  logp = np.zeros((batch, seq))
  entropy = np.zeros((batch, seq))
  for b in range(batch):
    for t in range(seq):
      if mask[b, t]:
        logp[b, t] = logits[b, t, targets[b, t]] - lse[b, t]
        entropy[b, t] = -np.sum(probs[b, t] * np.log(probs[b, t]))
  return logp, entropy, probs


def _np_logp_grads(hidden, embed, targets, mask, temperature, cot):
  """Analytic gradient of sum(cot * logp) w.r.t. hidden and embed (float64)."""
  _, _, probs = _np_reference(hidden, embed, targets, mask, temperature)
  vocab = embed.shape[0]
  onehot = np.eye(vocab)[np.where(mask, targets, 0)]
  weight = (cot * mask)[..., None]
  dlogits = weight * (onehot - probs) / temperature
  d_hidden = dlogits @ embed.astype(np.float64)
  d_embed = np.einsum("btv,btd->vd", dlogits, hidden.astype(np.float64))
  return d_hidden, d_embed


def _random_inputs(seed, batch, seq, vocab, ragged=True):
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=(batch, seq, DIM)).astype(np.float32)
  embed = rng.normal(size=(vocab, DIM)).astype(np.float32) * 0.7
  if ragged:
    mask = rng.random((batch, seq)) < 0.75
  else:
    mask = np.ones((batch, seq), bool)
  targets = rng.integers(0, vocab, size=(batch, seq))
  targets = np.where(mask, targets, -1).astype(np.int32)  # Pads out of range.
  return hidden, embed, targets, mask


shapes = st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 5, 8]), st.sampled_from([7, 32]))
chunks = st.sampled_from([1, 3, 4, 7, 16, 1000])


@pytest.mark.slow
@SETTINGS
@given(
  shape=shapes,
  chunk=chunks,
  seed=st.integers(0, 2**16),
  temperature=st.sampled_from([0.6, 1.0, 1.5]),
)
def test_matches_naive_full_logits(shape, chunk, seed, temperature):
  hidden, embed, targets, mask = _random_inputs(seed, *shape)
  logp, entropy = _logprobs_jit(
    hidden, embed, targets, mask, temperature=temperature, chunk=chunk, return_entropy=True
  )
  ref_logp, ref_entropy, _ = _np_reference(hidden, embed, targets, mask, temperature)
  assert logp.dtype == jnp.float32 and logp.shape == targets.shape
  np.testing.assert_allclose(logp, ref_logp, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
  assert np.all(np.asarray(logp)[~mask] == 0.0)


@pytest.mark.slow
@SETTINGS
@given(shape=shapes, chunk_a=chunks, chunk_b=chunks, seed=st.integers(0, 2**16))
def test_independent_of_chunk_size(shape, chunk_a, chunk_b, seed):
  hidden, embed, targets, mask = _random_inputs(seed, *shape)
  out_a = _logprobs_jit(hidden, embed, targets, mask, chunk=chunk_a, return_entropy=True)
  out_b = _logprobs_jit(hidden, embed, targets, mask, chunk=chunk_b, return_entropy=True)
  chex.assert_trees_all_close(out_a, out_b, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(seed=st.integers(0, 2**16), split=st.integers(1, 3), chunk=st.sampled_from([3, 5]))
def test_independent_of_microbatch_split(seed, split, chunk):
  hidden, embed, targets, mask = _random_inputs(seed, 4, 6, 11)
  full = _logprobs_jit(hidden, embed, targets, mask, chunk=chunk)
  parts = [
    _logprobs_jit(hidden[s], embed, targets[s], mask[s], chunk=chunk)
    for s in (slice(0, split), slice(split, None))
  ]
  np.testing.assert_allclose(full, np.concatenate(parts), atol=1e-5, rtol=1e-5)


@SETTINGS
@given(
  seed=st.integers(0, 2**16),
  extra_seq=st.sampled_from([1, 3, 9]),
  extra_rows=st.sampled_from([0, 2]),
  chunk=st.sampled_from([4, 6]),
)
def test_independent_of_padding_amount(seed, extra_seq, extra_rows, chunk):
  hidden, embed, targets, mask = _random_inputs(seed, 3, 5, 13)
  rng = np.random.default_rng(seed + 1)
  batch, seq = targets.shape
  big_shape = (batch + extra_rows, seq + extra_seq)
  # Garbage (but finite) hidden states and out-of-range targets in the padding.
  hidden_p = rng.normal(size=big_shape + (DIM,)).astype(np.float32) * 50
  hidden_p[:batch, :seq] = hidden
  targets_p = np.full(big_shape, 10**6, np.int32)
  targets_p[:batch, :seq] = targets
  mask_p = np.zeros(big_shape, bool)
  mask_p[:batch, :seq] = mask
  small = _logprobs_jit(hidden, embed, targets, mask, chunk=chunk, return_entropy=True)
  big = _logprobs_jit(hidden_p, embed, targets_p, mask_p, chunk=chunk, return_entropy=True)
  for s, b in zip(small, big):
    np.testing.assert_allclose(s, np.asarray(b)[:batch, :seq], atol=1e-5)
    assert np.all(np.asarray(b)[~mask_p] == 0.0)


@functools.partial(jax.jit, static_argnames=("chunk",))
def _logp_grads(hidden, embed, targets, mask, cot, temperature, chunk):
  def objective(h, e):
    return jnp.sum(
      cot * logprobs.token_logprobs(h, e, targets, mask, temperature=temperature, chunk=chunk)
    )

  return jax.grad(objective, argnums=(0, 1))(hidden, embed)


@pytest.mark.slow
@SETTINGS
@given(
  shape=shapes, chunk=chunks, seed=st.integers(0, 2**16), temperature=st.sampled_from([0.7, 1.0])
)
def test_gradient_matches_naive(shape, chunk, seed, temperature):
  hidden, embed, targets, mask = _random_inputs(seed, *shape)
  rng = np.random.default_rng(seed)
  cot = rng.normal(size=targets.shape).astype(np.float32)
  d_hidden, d_embed = _logp_grads(hidden, embed, targets, mask, cot, temperature, chunk)
  ref_hidden, ref_embed = _np_logp_grads(hidden, embed, targets, mask, temperature, cot)
  np.testing.assert_allclose(d_hidden, ref_hidden, atol=1e-5, rtol=1e-4)
  np.testing.assert_allclose(d_embed, ref_embed, atol=1e-5, rtol=1e-4)


def _naive_entropy_jax(hidden, embed, mask):
  logp_all = jax.nn.log_softmax(jnp.einsum("btd,vd->btv", hidden, embed), -1)
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return jnp.where(mask, entropy, 0.0)


def test_entropy_gradient_matches_naive():
  hidden, embed, targets, mask = _random_inputs(7, 3, 5, 17)
  cot = np.random.default_rng(1).normal(size=targets.shape).astype(np.float32)

  def chunked(h, e):
    _, ent = logprobs.token_logprobs(h, e, targets, mask, chunk=4, return_entropy=True)
    return jnp.sum(cot * ent)

  def naive(h, e):
    return jnp.sum(cot * _naive_entropy_jax(h, e, mask))

  got = jax.grad(chunked, argnums=(0, 1))(hidden, embed)
  want = jax.grad(naive, argnums=(0, 1))(hidden, embed)
  chex.assert_trees_all_close(got, want, atol=1e-5, rtol=1e-4)


def test_gradients_with_entropy_and_temperature_match_autodiff_of_full_logits():
  hidden, embed, targets, mask = _random_inputs(11, 2, 6, 23)
  rng = np.random.default_rng(2)
  cot_logp, cot_ent = (rng.normal(size=targets.shape).astype(np.float32) for _ in range(2))

  def chunked(h, e, temp):
    logp, ent = logprobs.token_logprobs(
      h, e, targets, mask, chunk=5, temperature=temp, return_entropy=True
    )
    return jnp.sum(cot_logp * logp) + jnp.sum(cot_ent * ent)

  def naive(h, e, temp):
    logp_all = jax.nn.log_softmax(jnp.einsum("btd,vd->btv", h, e) / temp, -1)
    logp = jnp.take_along_axis(logp_all, jnp.maximum(targets, 0)[..., None], -1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return jnp.sum(jnp.where(mask, cot_logp * logp, 0.0)) + jnp.sum(
      jnp.where(mask, cot_ent * ent, 0.0)
    )

  got = jax.grad(chunked, argnums=(0, 1, 2))(hidden, embed, 0.8)
  want = jax.grad(naive, argnums=(0, 1, 2))(hidden, embed, 0.8)
  chex.assert_trees_all_close(got, want, atol=1e-4, rtol=1e-4)


@functools.partial(jax.jit, static_argnames=("chunk",))
def _slots_value_and_grad(hidden, embed, targets, mask, slots, cot_logp, cot_ent, chunk):
  """(sum(cot_logp * logp) + sum(cot_ent * entropy), (logp, entropy)) at the slots, and its
  gradient w.r.t. hidden and embed (temperature 0.7); one program per shape."""

  def total(h, e):
    logp, ent = logprobs.token_logprobs_at_slots(
      h, e, targets, mask, slots, chunk=chunk, temperature=0.7, return_entropy=True
    )
    return jnp.sum(cot_logp * logp) + jnp.sum(cot_ent * ent), (logp, ent)

  return jax.value_and_grad(total, (0, 1), has_aux=True)(hidden, embed)


@SETTINGS
@given(
  seed=st.integers(0, 2**16), capacity=st.sampled_from([3, 5, 8]), chunk=st.sampled_from([2, 7])
)
def test_slots_match_full_logits_and_gradients(seed, capacity, chunk):
  """`token_logprobs_at_slots` (what a multi-turn batch's `loss_slots` select) gives the
  float64 reference's logp and entropy on the listed mask positions, 0 elsewhere (mask
  positions no slot lists included), and its gradients w.r.t. hidden and embed equal
  the reference's restricted to the listed positions.

  Mutation caught: scattering the results back in slot order without the slot indices
  (values land on the wrong positions), or gathering the targets unshifted by the slots.
  """
  hidden, embed, targets, mask = _random_inputs(seed, 3, 8, 11)
  rng = np.random.default_rng(seed + 1)
  slots = np.full((3, capacity), -1, np.int32)
  listed = np.zeros_like(mask)
  for row in range(3):
    on = rng.permutation(8)[: rng.integers(0, capacity + 1)]  # on or off the mask
    slots[row, : len(on)] = np.sort(on)
    listed[row, on] = True
  cot_logp, cot_ent = (rng.normal(size=targets.shape).astype(np.float32) for _ in range(2))
  (_, (logp, ent)), grads = _slots_value_and_grad(
    hidden, embed, targets, mask, slots, cot_logp, cot_ent, chunk=chunk
  )
  want_logp, want_ent, _ = _np_reference(hidden, embed, targets, mask & listed, 0.7)
  np.testing.assert_allclose(logp, want_logp, atol=2e-5)
  np.testing.assert_allclose(ent, want_ent, atol=2e-5)

  def naive(h, e):
    logp_all = jax.nn.log_softmax(jnp.einsum("btd,vd->btv", h, e) / 0.7, -1)
    lp = jnp.take_along_axis(logp_all, jnp.maximum(targets, 0)[..., None], -1)[..., 0]
    en = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    on = mask & listed
    return jnp.sum(jnp.where(on, cot_logp * lp + cot_ent * en, 0.0))

  chex.assert_trees_all_close(grads, jax.grad(naive, (0, 1))(hidden, embed), atol=1e-4, rtol=1e-4)


def test_bfloat16_inputs_accumulate_in_float32():
  hidden, embed, targets, mask = _random_inputs(3, 2, 8, 32)
  hidden_bf = jnp.asarray(hidden * 3, jnp.bfloat16)
  embed_bf = jnp.asarray(embed, jnp.bfloat16)
  logp = _logprobs_jit(hidden_bf, embed_bf, targets, mask, chunk=5)
  # Reference on the same bf16-rounded values in float64: only accumulation
  # error remains, far below bfloat16 resolution (~1e-2 relative).
  ref, _, _ = _np_reference(
    np.asarray(hidden_bf.astype(jnp.float32)),
    np.asarray(embed_bf.astype(jnp.float32)),
    targets,
    mask,
    1.0,
  )
  assert logp.dtype == jnp.float32
  np.testing.assert_allclose(logp, ref, atol=1e-4, rtol=1e-5)
  grads = jax.grad(
    lambda h, e: jnp.sum(logprobs.token_logprobs(h, e, targets, mask, chunk=5)), argnums=(0, 1)
  )(hidden_bf, embed_bf)
  assert grads[0].dtype == jnp.bfloat16 and grads[1].dtype == jnp.bfloat16
  # Values: the float64 analytic gradient on the same bf16-rounded inputs, to bfloat16
  # resolution of the result (mutation caught: a backward that drops or mis-scales a term).
  want = _np_logp_grads(
    np.asarray(hidden_bf.astype(jnp.float32)),
    np.asarray(embed_bf.astype(jnp.float32)),
    targets,
    mask,
    1.0,
    np.ones(targets.shape),
  )
  for got, ref in zip(grads, want):
    np.testing.assert_allclose(
      np.asarray(got.astype(jnp.float32)), ref, rtol=2e-2, atol=1e-2 * np.abs(ref).max()
    )


def _max_intermediate_size(jaxpr):
  """Largest number of elements of any value produced inside `jaxpr`."""
  biggest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      biggest = max(biggest, int(np.prod(var.aval.shape)))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      biggest = max(biggest, _max_intermediate_size(sub))
  return biggest


def test_full_logits_never_materialized():
  batch, seq, vocab, chunk = 4, 16, 64, 8
  hidden, embed, targets, mask = _random_inputs(0, batch, seq, vocab)

  def loss(h, e):
    logp, ent = logprobs.token_logprobs(h, e, targets, mask, chunk=chunk, return_entropy=True)
    return jnp.sum(logp) + jnp.sum(ent)

  grad_fn = jax.value_and_grad(loss, argnums=(0, 1))
  jaxpr = jax.make_jaxpr(grad_fn)(hidden, embed)
  biggest = _max_intermediate_size(jaxpr.jaxpr)
  assert biggest <= chunk * vocab < batch * seq * vocab, biggest


def test_empty_batch_and_zero_temperature():
  """An empty batch (0 rows, or 0 positions) gives [B, T] zeros, value and gradient, instead
  of a ZeroDivisionError; temperature 0 (logits / 0 -> NaN) fails naming the setting.

  Mutation caught: no empty-batch branch (`-(-0 // 0)`: ZeroDivisionError) and no
  temperature check (silent NaN logprobs).
  """
  embed = jnp.ones((7, 4))
  for b, t in ((0, 5), (2, 0)):
    hidden = jnp.ones((b, t, 4))
    targets, mask = jnp.zeros((b, t), jnp.int32), jnp.ones((b, t), bool)
    logp, entropy = logprobs.token_logprobs(hidden, embed, targets, mask, return_entropy=True)
    assert logp.shape == entropy.shape == (b, t) and logp.dtype == jnp.float32
    grad = jax.grad(lambda h: logprobs.token_logprobs(h, embed, targets, mask).sum())(hidden)
    assert grad.shape == (b, t, 4)
  with pytest.raises(ValueError, match="temperature=0.0.*must be > 0"):
    logprobs.token_logprobs(
      jnp.ones((1, 2, 4)),
      embed,
      jnp.zeros((1, 2), jnp.int32),
      jnp.ones((1, 2), bool),
      temperature=0.0,
    )
