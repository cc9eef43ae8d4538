"""SFT and DPO losses against NumPy references, gradient signs, and mask invariance."""

import math

import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.supervised import losses as sft_losses


def _np_log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


def _random_batch(seed, B=4, T=7):
  rng = np.random.default_rng(seed)
  logp = -rng.exponential(2.0, (B, T)).astype(np.float32)
  mask = rng.random((B, T)) < 0.5
  return logp, mask


class SFTLossTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_numpy_reference(self):
    logp, mask = _random_batch(0)
    loss, metrics = self.variant(sft_losses.sft_loss)(logp, mask)
    lp = logp.astype(np.float64)
    want = -sum(lp[b, t] for b in range(4) for t in range(7) if mask[b, t]) / mask.sum()
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    np.testing.assert_allclose(metrics["perplexity"], math.exp(want), rtol=1e-5)
    assert float(metrics["tokens"]) == mask.sum()
    np.testing.assert_allclose(
      sft_losses.sequence_logprob(logp, mask), (lp * mask).sum(-1), rtol=1e-6
    )

  def test_global_token_count_divisor(self):
    logp, mask = _random_batch(1)
    halves = [
      sft_losses.sft_loss(logp[i : i + 2], mask[i : i + 2], num_tokens=mask.sum())[0]
      for i in (0, 2)
    ]
    np.testing.assert_allclose(sum(halves), sft_losses.sft_loss(logp, mask)[0], rtol=1e-6)

  def test_all_masked_is_zero_not_nan(self):
    loss, metrics = sft_losses.sft_loss(jnp.full((2, 3), -jnp.inf), jnp.zeros((2, 3), bool))
    assert float(loss) == 0.0 and float(metrics["tokens"]) == 0.0


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(seed=st.integers(0, 10_000), junk=st.sampled_from([0.0, -1e30, -np.inf, np.nan]))
def test_masked_positions_change_neither_loss_nor_gradient(seed, junk):
  logp, mask = _random_batch(seed)
  grad_fn = jax.value_and_grad(lambda x: sft_losses.sft_loss(x, mask)[0])
  loss, grad = grad_fn(logp)
  loss2, grad2 = grad_fn(np.where(mask, logp, np.float32(junk)))
  np.testing.assert_array_equal(loss, loss2)
  np.testing.assert_array_equal(grad, grad2)
  assert not np.asarray(grad)[~mask].any()
  np.testing.assert_allclose(np.asarray(grad)[mask], -1.0 / max(mask.sum(), 1), rtol=1e-6)


@pytest.mark.parametrize("beta,ls", [(0.1, 0.0), (0.5, 0.2), (2.0, 0.45)])
def test_dpo_at_reference_is_log2_and_gradient_signs(beta, ls):
  rng = np.random.default_rng(0)
  chosen, rejected = rng.normal(-20, 5, (2, 6)).astype(np.float32)
  loss_fn = lambda pc, pr: sft_losses.dpo_loss(
    pc, pr, chosen, rejected, beta=beta, label_smoothing=ls
  )
  (loss, metrics), (g_chosen, g_rejected) = jax.value_and_grad(
    loss_fn, argnums=(0, 1), has_aux=True
  )(chosen, rejected)
  np.testing.assert_allclose(loss, math.log(2), rtol=1e-6)
  assert float(metrics["reward_margin"]) == 0.0 and float(metrics["reward_accuracy"]) == 0.0
  # Descent raises the chosen logprob and lowers the rejected one.
  assert (g_chosen < 0).all() and (g_rejected > 0).all()
  np.testing.assert_allclose(g_chosen, -beta * (1 - 2 * ls) / 2 / 6, rtol=1e-5)
  np.testing.assert_allclose(g_rejected, -g_chosen, rtol=1e-6)


@pytest.mark.parametrize("ls", [0.0, 0.1, 0.3])
def test_dpo_matches_numpy_reference(ls):
  rng = np.random.default_rng(3)
  pc, pr, rc, rr = rng.normal(-30, 10, (4, 16)).astype(np.float32)
  beta = 0.25
  loss, metrics = jax.jit(sft_losses.dpo_loss, static_argnames=("beta", "label_smoothing"))(
    pc, pr, rc, rr, beta=beta, label_smoothing=ls
  )
  f64 = lambda x: x.astype(np.float64)
  r_c, r_r = beta * (f64(pc) - f64(rc)), beta * (f64(pr) - f64(rr))
  m = r_c - r_r
  want = np.mean(-(1 - ls) * _np_log_sigmoid(m) - ls * _np_log_sigmoid(-m))
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(metrics["chosen_reward"], r_c.mean(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(metrics["rejected_reward"], r_r.mean(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(metrics["reward_margin"], m.mean(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(metrics["reward_accuracy"], np.mean(r_c > r_r))
  assert 0 < float(metrics["reward_accuracy"]) < 1


def test_dpo_from_token_logprobs_end_to_end():
  """Sequence logprobs from masked tokens feed DPO; masked junk does not matter."""
  logp, mask = _random_batch(5, B=4, T=9)
  seq = sft_losses.sequence_logprob(logp, mask)
  junk = np.where(mask, logp, -1e9).astype(np.float32)
  seq_junk = sft_losses.sequence_logprob(junk, mask)
  np.testing.assert_array_equal(seq, seq_junk)
  loss, _ = sft_losses.dpo_loss(seq[:2], seq[2:], seq[:2] + 1.0, seq[2:] - 1.0, beta=0.5)
  np.testing.assert_allclose(loss, -_np_log_sigmoid(-1.0), rtol=1e-6)


@pytest.mark.parametrize(
  "kwargs,needle",
  [
    ({"beta": 0.0}, "beta=0.0"),
    ({"label_smoothing": 0.5}, "label_smoothing=0.5"),
    ({"label_smoothing": -0.1}, "label_smoothing=-0.1"),
  ],
)
def test_dpo_bad_hyperparameters(kwargs, needle):
  x = jnp.zeros(3)
  with pytest.raises(ValueError, match=needle):
    sft_losses.dpo_loss(x, x, x, x, **kwargs)
