"""The PPO critic (rlpost.models.critic): alignment, causality, layouts, memory."""

import dataclasses

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.models import critic as critic_lib
from rlpost.models import decoder, families, policy
from rlpost.models import lora as lora_lib
from rlpost.rl.batch import RLBatch

CONFIG = families.get_config("tiny")
LORA = lora_lib.LoraConfig(rank=4, alpha=8.0)
FWD = policy.ForwardConfig(model=CONFIG)
P, T = 5, 6


def _batch(tokens):
  n, s = tokens.shape
  return RLBatch(
    tokens=jnp.asarray(tokens, jnp.int32),
    positions=jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (n, s)),
    valid=jnp.ones((n, s), bool),
    loss_mask=jnp.ones((n, T), jnp.float32),
    sampler_logp=jnp.zeros((n, T), jnp.float32),
  )


def _critic(mode, params, key):
  """A critic whose every part is non-zero (a fresh head and LoRA B are 0: nothing to see)."""
  layout = critic_lib.CriticLayout(mode, LORA if mode == "lora" else None)
  critic = critic_lib.init_critic(key, params, layout)
  leaves, tree = jax.tree.flatten(critic)
  keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
  noisy = [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return jax.tree.unflatten(tree, noisy), layout


@functools.partial(jax.jit, static_argnums=(0, 3))  # one program, not one per op
def _values(mode, params, critic, layout, batch):
  shared = policy.completion_hidden(params, None, batch, FWD) if mode == "shared" else None
  return critic_lib.values(critic, params, batch, layout, FWD, shared)


@pytest.mark.slow
@pytest.mark.parametrize("mode", critic_lib.MODES)
def test_value_of_token_t_sees_only_tokens_before_t(mode):
  """V(t) is read at the slot that predicts token t: tokens >= t cannot change it, t-1 does.

  Mutation caught: reading the hidden state at token t's own slot (`P : P + T`).
  """
  key = jax.random.key(0)
  params = decoder.init_params(key, CONFIG)
  critic, layout = _critic(mode, params, jax.random.key(1))
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, CONFIG.vocab_size, (1, P + T))
  base = np.asarray(_values(mode, params, critic, layout, _batch(tokens)))
  for t in range(T):
    later = tokens.copy()
    later[:, P + t :] = (later[:, P + t :] + 1) % CONFIG.vocab_size  # token t and after
    v = np.asarray(_values(mode, params, critic, layout, _batch(later)))
    np.testing.assert_allclose(v[:, : t + 1], base[:, : t + 1], rtol=1e-5, atol=1e-6)
    earlier = tokens.copy()
    earlier[:, P + t - 1] = (earlier[:, P + t - 1] + 7) % CONFIG.vocab_size  # token t-1
    v = np.asarray(_values(mode, params, critic, layout, _batch(earlier)))
    assert abs(v[0, t] - base[0, t]) > 1e-6, (mode, t)


@pytest.mark.slow
@pytest.mark.parametrize("mode", critic_lib.MODES)
def test_fresh_critic_predicts_zero_and_is_zero_off_the_loss_mask(mode):
  params = decoder.init_params(jax.random.key(0), CONFIG)
  layout = critic_lib.CriticLayout(mode, LORA if mode == "lora" else None)
  critic = critic_lib.init_critic(jax.random.key(1), params, layout)
  tokens = np.random.default_rng(1).integers(3, CONFIG.vocab_size, (2, P + T))
  batch = _batch(tokens)
  assert np.all(np.asarray(_values(mode, params, critic, layout, batch)) == 0.0)
  noisy, _ = _critic(mode, params, jax.random.key(2))
  mask = np.ones((2, T), np.float32)
  mask[0, 3:] = 0
  v = np.asarray(_values(mode, params, noisy, layout, dataclasses.replace(batch, loss_mask=mask)))
  assert np.all(v[mask == 0] == 0.0) and np.all(v[mask > 0] != 0.0)


def _nbytes(tree):
  return sum(x.size * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def test_lora_critic_holds_no_second_copy_of_the_base_weights():
  """On Gemma 3 270M shapes (no weights materialised): the lora critic adds < 10% of the base.

  Mutation caught: a lora critic that copies the trunk (as `full` does).
  """
  config = families.get_config("gemma3_270m")
  params = jax.eval_shape(lambda: decoder.init_params(jax.random.key(0), config))
  base = _nbytes(params)
  sizes = {}
  for mode in critic_lib.MODES:
    layout = critic_lib.CriticLayout(mode, lora_lib.LoraConfig(rank=32) if mode == "lora" else None)
    sizes[mode] = _nbytes(
      jax.eval_shape(lambda p, l=layout: critic_lib.init_critic(jax.random.key(0), p, l), params)
    )
  assert base > 1e9  # 268M float32 parameters
  assert sizes["lora"] < 0.1 * base, sizes
  assert sizes["shared"] == (config.embed_dim + 1) * 4
  assert sizes["full"] > base  # the layout that does copy the trunk


def test_bad_layout_names_the_field_and_the_choices():
  with pytest.raises(ValueError, match=r"mode='twin'.*lora, full, shared"):
    critic_lib.CriticLayout("twin")
  with pytest.raises(ValueError, match="LoraConfig"):
    critic_lib.CriticLayout("lora")


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
  st.integers(0, 2**16),
  st.floats(-3, 3),
  st.floats(0.01, 5),
  st.floats(0.05, 1.0),
  st.integers(0, 3),
)
def test_return_statistics_move_without_changing_a_value(
  seed, batch_mean, batch_std, decay, earlier
):
  """PopArt: after `with_return_stats` every value (head output x std + mean) is what it
  was, to float32 rounding, while the statistics become the first batch's own (count 0)
  or move towards the batch's with weight `decay` (the mixture's mean and variance, against
  a float64 transcription through mean squares); the loss's unit
  `value_scale` is their std. Mutation caught: the head's bias not rescaled."""
  rng = np.random.default_rng(seed)
  layout = critic_lib.CriticLayout("shared", normalize=True)
  critic = critic_lib.init_critic(jax.random.key(0), {"embed": jnp.zeros((5, 8))}, layout)
  critic["head"] = {
    "w": jnp.asarray(rng.normal(size=(8, 1)), jnp.float32),
    "b": jnp.float32(rng.normal()),
  }
  for _ in range(earlier):  # some batches seen before
    critic = critic_lib.with_return_stats(
      critic, np.float32(rng.normal()), np.float32(rng.uniform(0.1, 2)), np.float32(0.5)
    )
  hidden = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
  before = critic_lib.values_from_hidden(critic["head"], hidden, critic["stats"])
  stats = {k: float(v) for k, v in critic["stats"].items()}
  after_critic = critic_lib.with_return_stats(
    critic, np.float32(batch_mean), np.float32(batch_std), np.float32(decay)
  )
  after = critic_lib.values_from_hidden(after_critic["head"], hidden, after_critic["stats"])
  np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4 * (1 + abs(batch_mean)))
  weight = 1.0 if earlier == 0 else decay  # the mixture's mean and variance, in float64
  want_mean = (1 - weight) * stats["mean"] + weight * batch_mean
  want_sq = (1 - weight) * (stats["var"] + stats["mean"] ** 2) + weight * (
    batch_std**2 + batch_mean**2
  )
  want_var = want_sq - want_mean**2
  new = after_critic["stats"]
  np.testing.assert_allclose(new["mean"], want_mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new["var"], want_var, rtol=1e-4, atol=1e-6)
  assert float(new["count"]) == earlier + 1
  want_std = max(want_var, critic_lib.MIN_STD**2) ** 0.5
  np.testing.assert_allclose(critic_lib.value_scale(after_critic), want_std, rtol=1e-3)


def test_a_critic_without_statistics_reads_values_in_return_units():
  """No `normalize`: no "stats", the unit is 1 and values are the head's outputs."""
  critic = critic_lib.init_critic(
    jax.random.key(0), {"embed": jnp.zeros((5, 8))}, critic_lib.CriticLayout("shared")
  )
  assert "stats" not in critic and float(critic_lib.value_scale(critic)) == 1.0
