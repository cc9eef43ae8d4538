"""LoRA: unmerged forward == merged forward; sampler on merged weights == trainer on adapters."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlpost import rollout
from rlpost import sampling
from rlpost import train
from rlpost.models import gemma3
from rlpost.models import lora
from test_gemma3 import CONFIG, _random_params
from rlpost.logprobs import causal_attention_mask

CFG = lora.LoraConfig(rank=4, alpha=8.0)


def _adapters(params, seed=0):
  """Adapters with non-zero B so that they change the model."""
  ad = lora.init_adapters(jax.random.key(seed), params, CFG)
  return jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(seed + 1), x.shape),
                      ad)


def test_fresh_adapters_change_nothing():
  params = _random_params()
  ad = lora.init_adapters(jax.random.key(0), params, CFG)
  merged = lora.merge(params, ad, CFG)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(merged)):
    np.testing.assert_array_equal(a, b)


def test_unmerged_forward_equals_merged_forward():
  params = _random_params()
  ad = _adapters(params)
  tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, CONFIG.vocab_size)
  args = (tokens, jnp.broadcast_to(jnp.arange(12), (2, 12)),
          causal_attention_mask(jnp.ones((2, 12), bool)))
  unmerged, _ = gemma3.forward(params, *args, config=CONFIG, adapters=ad, lora_scale=CFG.scale)
  merged, _ = gemma3.forward(lora.merge(params, ad, CFG), *args, config=CONFIG)
  base, _ = gemma3.forward(params, *args, config=CONFIG)
  np.testing.assert_allclose(unmerged, merged, atol=2e-4, rtol=1e-4)
  assert np.abs(np.asarray(unmerged - base)).max() > 0.1


def test_sampling_merged_matches_trainer_logprobs_with_adapters():
  params = _random_params(3)
  ad = _adapters(params, 5)
  sc = sampling.SamplingConfig(temperature=0.8, max_new_tokens=10, prompt_bucket=8, stop_ids=(9,))
  tokens, lengths = sampling.pad_prompts([[2, 40, 41, 42], [2, 50]], sc)
  out = sampling.sample(lora.merge(params, ad, CFG), tokens, lengths, jax.random.key(0),
                        model_config=CONFIG, config=sc, num_samples=2)
  batch = rollout.rollout_batch(tokens, lengths, jax.device_get(out), 2)
  batch = jax.tree.map(jnp.asarray, batch)
  logp = rollout.completion_logprobs(params, batch, model_config=CONFIG, temperature=0.8,
                                     adapters=ad, lora_scale=CFG.scale)
  np.testing.assert_allclose(np.asarray(logp), np.asarray(out.logprobs), atol=1e-4)


def test_only_adapters_get_gradients_and_optimizer_state():
  params = _random_params()
  ad = lora.init_adapters(jax.random.key(0), params, CFG)
  opt = optax.adamw(1e-3)
  state = train.init_train_state(ad, opt, jax.random.key(1))
  assert jax.tree.structure(state.opt_state[0].mu) == jax.tree.structure(ad)
  tokens = jnp.zeros((1, 5), jnp.int32)

  def loss(adapters):
    logits, _ = gemma3.forward(params, tokens, jnp.arange(5)[None],
                               causal_attention_mask(jnp.ones((1, 5), bool)), config=CONFIG,
                               adapters=adapters, lora_scale=CFG.scale)
    return logits.sum()
  grads = jax.grad(loss)(ad)
  assert jax.tree.structure(grads) == jax.tree.structure(ad)
  assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


def test_bad_lora_config_raises():
  with pytest.raises(ValueError, match="lora.rank=0"):
    lora.LoraConfig(rank=0)
  with pytest.raises(ValueError, match="qkv"):
    lora.LoraConfig(targets=("qkv",))
