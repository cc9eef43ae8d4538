"""ORPO, SimPO and KTO against float64 NumPy transcriptions of the papers' equations.

Each transcription below is written from the paper's formula, not from the JAX code:
ORPO (Hong et al. 2024, arXiv 2403.07691, eqs. 6-8), SimPO (Meng et al. 2024, arXiv
2405.14734, eq. 6), KTO (Ethayarajh et al. 2024, arXiv 2402.01306, eq. 8 and its KL
estimate). Gradients are checked against central differences of the transcription.
"""

import functools

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np

from rlpost.supervised import losses

SETTINGS = hypothesis.settings(max_examples=25, deadline=None)
B = 6  # one batch shape: each loss compiles once


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _np_orpo(lw, ll, nw, nl, lam):
  """L_SFT + lam * L_OR: P(y|x) is the exp of the mean token log-likelihood, odds = P/(1-P),
  L_OR = -log sigmoid(log(odds_w / odds_l)); L_SFT the chosen answer's mean NLL."""
  pw, pl = np.exp(lw / nw), np.exp(ll / nl)
  ratio = np.log((pw / (1 - pw)) / (pl / (1 - pl)))
  return np.mean(-lw / nw) + lam * np.mean(-np.log(_sigmoid(ratio)))


def _np_simpo(lw, ll, nw, nl, beta, gamma, normalized=True):
  """-log sigmoid(beta/|y_w| log pi(y_w|x) - beta/|y_l| log pi(y_l|x) - gamma)."""
  if not normalized:
    nw, nl = np.ones_like(nw), np.ones_like(nl)
  return np.mean(-np.log(_sigmoid(beta * lw / nw - beta * ll / nl - gamma)))


def _np_kto(pol, ref, good, pol_kl, ref_kl, beta, lambda_d, lambda_u):
  """E[lambda_y - v(x, y)]: r = log(pi / pi_ref), z0 = max(0, batch mean of the mismatched
  pairs' log ratio), v = lambda_D sigma(beta (r - z0)) or lambda_U sigma(beta (z0 - r))."""
  z0 = max(0.0, float(np.mean(pol_kl - ref_kl)))
  r = pol - ref
  v = np.where(good, lambda_d * _sigmoid(beta * (r - z0)), lambda_u * _sigmoid(beta * (z0 - r)))
  return np.mean(np.where(good, lambda_d, lambda_u) - v)


def _pairs(seed):
  """Sequence logprobs (sums of 1-40 tokens' logprobs) and token counts of B pairs."""
  rng = np.random.default_rng(seed)
  nw, nl = rng.integers(1, 41, B).astype(np.float64), rng.integers(1, 41, B).astype(np.float64)
  lw, ll = -rng.exponential(1.5, B) * nw, -rng.exponential(1.5, B) * nl
  return lw, ll, nw, nl


def _numeric_grad(f, x, eps=1e-6):
  g = np.zeros_like(x)
  for i in range(x.size):
    up, down = x.copy(), x.copy()
    up[i] += eps
    down[i] -= eps
    g[i] = (f(up) - f(down)) / (2 * eps)
  return g


f32 = lambda x: jnp.asarray(x, jnp.float32)
_orpo = jax.jit(
  jax.value_and_grad(lambda w, l, nw, nl, lam: losses.orpo_loss(w, l, nw, nl, lam=lam)[0], (0, 1))
)
_simpo = jax.jit(
  jax.value_and_grad(
    lambda w, l, nw, nl, beta, gamma: losses.simpo_loss(w, l, nw, nl, beta=beta, gamma=gamma)[0],
    (0, 1),
  )
)
_kto = jax.jit(
  jax.value_and_grad(
    lambda p, r, g, pk, rk, beta, ld, lu: losses.kto_loss(
      p, r, g, pk, rk, beta=beta, lambda_d=ld, lambda_u=lu
    )[0],
    (0, 3),
  )
)


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**16), lam=st.floats(0.0, 2.0))
def test_orpo_loss_and_gradient_equal_the_papers_equation(seed, lam):
  """Mutation caught: the odds of the summed instead of the token-mean log-likelihood."""
  lw, ll, nw, nl = _pairs(seed)
  loss, (gw, gl) = _orpo(f32(lw), f32(ll), f32(nw), f32(nl), lam)
  np.testing.assert_allclose(loss, _np_orpo(lw, ll, nw, nl, lam), rtol=1e-5, atol=1e-6)
  want_w = _numeric_grad(lambda x: _np_orpo(x, ll, nw, nl, lam), lw)
  want_l = _numeric_grad(lambda x: _np_orpo(lw, x, nw, nl, lam), ll)
  np.testing.assert_allclose(gw, want_w, rtol=1e-3, atol=1e-6)
  np.testing.assert_allclose(gl, want_l, rtol=1e-3, atol=1e-6)


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**16), beta=st.floats(0.1, 10.0), gamma=st.floats(-2.0, 5.0))
def test_simpo_loss_and_gradient_equal_the_papers_equation(seed, beta, gamma):
  """Mutation caught: the target margin added instead of subtracted."""
  lw, ll, nw, nl = _pairs(seed)
  loss, (gw, gl) = _simpo(f32(lw), f32(ll), f32(nw), f32(nl), beta, gamma)
  np.testing.assert_allclose(loss, _np_simpo(lw, ll, nw, nl, beta, gamma), rtol=1e-5, atol=1e-6)
  want_w = _numeric_grad(lambda x: _np_simpo(x, ll, nw, nl, beta, gamma), lw)
  np.testing.assert_allclose(gw, want_w, rtol=1e-3, atol=1e-6)
  np.testing.assert_allclose(
    gl, _numeric_grad(lambda x: _np_simpo(lw, x, nw, nl, beta, gamma), ll), rtol=1e-3, atol=1e-6
  )


@SETTINGS
@hypothesis.given(
  seed=st.integers(0, 2**16),
  beta=st.floats(0.01, 2.0),
  lambdas=st.tuples(st.floats(0.1, 3.0), st.floats(0.1, 3.0)),
  kl_shift=st.floats(-3.0, 3.0),
)
def test_kto_loss_and_gradient_equal_the_papers_equation(seed, beta, lambdas, kl_shift):
  """Both labels, a positive and a clamped (negative) KL estimate; the reference point has
  no gradient. Mutations caught: z0 not clamped at 0; z0 without its stop-gradient."""
  rng = np.random.default_rng(seed)
  pol, ref = -rng.exponential(20.0, B), -rng.exponential(20.0, B)
  good = rng.random(B) < 0.5
  ref_kl = -rng.exponential(20.0, B)
  pol_kl = ref_kl + kl_shift + rng.normal(0.0, 0.5, B)
  args = (pol, ref, good, pol_kl, ref_kl, beta, *lambdas)
  loss, (g_pol, g_kl) = _kto(*(f32(a) if i < 5 else a for i, a in enumerate(args)))
  np.testing.assert_allclose(loss, _np_kto(*args), rtol=1e-5, atol=1e-6)
  want = _numeric_grad(lambda x: _np_kto(x, *args[1:]), pol)
  np.testing.assert_allclose(g_pol, want, rtol=1e-3, atol=1e-7)
  assert not np.any(np.asarray(g_kl))  # stop-gradient on the reference point


def test_limits_the_papers_state():
  """SimPO with gamma = 0 and no length normalisation is DPO against a reference that
  scores both responses alike; ORPO with lambda = 0 is SFT on the chosen answers (mean
  token NLL); swapping a pair negates ORPO's log odds ratio; KTO with all examples
  desirable is lambda_D (1 - mean sigmoid(beta (r - z0))), and with z0 = 0 a label flip
  with r -> -r and lambda_D <-> lambda_U leaves its loss unchanged."""
  lw, ll, nw, nl = map(f32, _pairs(3))
  simpo, _ = losses.simpo_loss(lw, ll, nw, nl, beta=0.3, gamma=0.0, length_normalized=False)
  zeros = jnp.zeros(B)
  dpo, _ = losses.dpo_loss(lw, ll, zeros, zeros, beta=0.3)
  np.testing.assert_allclose(simpo, dpo, rtol=1e-6)
  orpo, m = losses.orpo_loss(lw, ll, nw, nl, lam=0.0)
  np.testing.assert_allclose(orpo, -jnp.mean(lw / nw), rtol=1e-6)
  _, swapped = losses.orpo_loss(ll, lw, nl, nw)
  np.testing.assert_allclose(swapped["log_odds_ratio"], -m["log_odds_ratio"], rtol=1e-5)
  r = jnp.linspace(-2.0, 2.0, B)
  kl = jnp.full(B, 0.5)  # z0 = 0.5
  kto = functools.partial(losses.kto_loss, beta=0.7)
  loss, metrics = kto(r, zeros, jnp.ones(B, bool), kl, zeros, lambda_d=1.5, lambda_u=0.2)
  np.testing.assert_allclose(loss, 1.5 * (1 - jnp.mean(jax.nn.sigmoid(0.7 * (r - 0.5)))), 1e-6)
  assert float(metrics["kl"]) == 0.5 and float(metrics["desirable_fraction"]) == 1.0
  labels = jnp.arange(B) % 2 == 0
  neg_kl = jnp.full(B, -1.0)  # clamped: z0 = 0
  a, _ = kto(r, zeros, labels, neg_kl, zeros, lambda_d=1.5, lambda_u=0.2)
  b, _ = kto(-r, zeros, ~labels, neg_kl, zeros, lambda_d=0.2, lambda_u=1.5)
  np.testing.assert_allclose(a, b, rtol=1e-6)


def test_padding_reaches_the_losses_only_through_masked_sums_and_counts():
  """From per-token logprobs with junk (NaN, -inf) on padding: `sequence_logprob` and the
  mask's token counts give ORPO and SimPO their transcriptions' values."""
  rng = np.random.default_rng(0)
  T = 9
  logp = -rng.exponential(1.0, (2, B, T))
  mask = rng.random((2, B, T)) < 0.6
  mask[..., 0] = True
  junk = np.where(mask, logp, np.where(rng.random((2, B, T)) < 0.5, np.nan, -np.inf))
  sums = [losses.sequence_logprob(f32(junk[i]), jnp.asarray(mask[i])) for i in range(2)]
  counts = [jnp.asarray(mask[i].sum(-1)) for i in range(2)]
  lw, ll = ((logp[i] * mask[i]).sum(-1) for i in range(2))
  nw, nl = (mask[i].sum(-1).astype(np.float64) for i in range(2))
  got, _ = losses.orpo_loss(*sums, *counts, lam=0.5)
  np.testing.assert_allclose(got, _np_orpo(lw, ll, nw, nl, 0.5), rtol=1e-5)
  got, _ = losses.simpo_loss(*sums, *counts, beta=2.0, gamma=0.5)
  np.testing.assert_allclose(got, _np_simpo(lw, ll, nw, nl, 2.0, 0.5), rtol=1e-5)
