"""LoRA: unmerged forward == merged forward; sampler on merged weights == trainer on adapters."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlpost import sampling
from rlpost.models import policy
from rlpost.rl import batch as batch_lib
from rlpost.train import step as train
from rlpost.models import decoder
from rlpost.models import lora
from test_gemma3 import CONFIG, _random_params
from rlpost.ops.masks import causal_attention_mask

CFG = lora.LoraConfig(rank=4, alpha=8.0)


def _adapters(params, seed=0):
  """Adapters with non-zero B so that they change the model."""
  ad = lora.init_adapters(jax.random.key(seed), params, CFG)
  return jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(seed + 1), x.shape), ad)


def _forward_args(seed: int, length: int):
  """(tokens [2, length], positions, causal mask) for decoder.forward on random tokens."""
  tokens = jax.random.randint(jax.random.key(seed), (2, length), 0, CONFIG.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(length), (2, length))
  return tokens, positions, causal_attention_mask(jnp.ones((2, length), bool))


def test_fresh_adapters_change_nothing():
  params = _random_params()
  ad = lora.init_adapters(jax.random.key(0), params, CFG)
  merged = lora.merge(params, ad, CFG)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(merged)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_unmerged_forward_equals_merged_forward():
  params = _random_params()
  ad = _adapters(params)
  args = _forward_args(seed=2, length=12)
  unmerged, _ = decoder.forward(params, *args, config=CONFIG, adapters=ad, lora_scale=CFG.scale)
  merged, _ = decoder.forward(lora.merge(params, ad, CFG), *args, config=CONFIG)
  base, _ = decoder.forward(params, *args, config=CONFIG)
  np.testing.assert_allclose(unmerged, merged, atol=2e-4, rtol=1e-4)
  assert np.abs(np.asarray(unmerged - base)).max() > 0.1


@pytest.mark.slow
def test_sampling_merged_matches_trainer_logprobs_with_adapters():
  params = _random_params(3)
  ad = _adapters(params, 5)
  sc = sampling.SamplingConfig(temperature=0.8, max_new_tokens=10, prompt_bucket=8, stop_ids=(9,))
  tokens, lengths = sampling.pad_prompts([[2, 40, 41, 42], [2, 50]], sc)
  out = sampling.sample(
    lora.merge(params, ad, CFG),
    tokens,
    lengths,
    jax.random.key(0),
    model_config=CONFIG,
    config=sc,
    num_samples=2,
  )
  batch = batch_lib.to_device(batch_lib.from_samples(tokens, lengths, jax.device_get(out), 2))
  fwd = policy.ForwardConfig(CONFIG, lora=CFG, temperature=0.8)
  logp = policy.completion_logprobs_jit(params, ad, batch, fwd)
  np.testing.assert_allclose(np.asarray(logp), np.asarray(out.logprobs), atol=1e-4)


def test_merge_is_w_plus_alpha_over_rank_a_b():
  """Merged weight == W + (alpha / rank) A B in float64 NumPy, with alpha != rank.

  Mutation caught: the scale written as rank / alpha (0.5 instead of 2 here).
  """
  params = _random_params()
  ad = _adapters(params)
  assert CFG.scale == 8.0 / 4
  merged = lora.merge(params, ad, CFG)
  for name in lora.ALL_TARGETS:
    w = np.asarray(params["layers"][name], np.float64)
    a, b = (np.asarray(ad["layers"][name][k], np.float64) for k in ("a", "b"))
    np.testing.assert_allclose(
      merged["layers"][name], w + 2.0 * np.einsum("lir,lro->lio", a, b), rtol=1e-5, atol=1e-5
    )


def test_unmerged_forward_equals_numpy_merged_forward():
  """The trainer's unmerged forward uses the same alpha / rank scale as the NumPy merge."""
  params = _random_params(1)
  ad = _adapters(params, 2)
  layers = dict(params["layers"])
  for name, ab in ad["layers"].items():
    layers[name] = jnp.asarray(
      np.asarray(layers[name], np.float64)
      + (CFG.alpha / CFG.rank)
      * np.einsum("lir,lro->lio", np.asarray(ab["a"], np.float64), np.asarray(ab["b"], np.float64)),
      jnp.float32,
    )
  args = _forward_args(seed=3, length=10)
  unmerged, _ = decoder.forward(params, *args, config=CONFIG, adapters=ad, lora_scale=CFG.scale)
  merged, _ = decoder.forward({**params, "layers": layers}, *args, config=CONFIG)
  np.testing.assert_allclose(unmerged, merged, atol=2e-4, rtol=1e-4)


def _nll_loss(adapters, params, batch):
  """Next-token NLL of the LoRA-adapted model (full logits: the model is tiny)."""
  tokens = batch["tokens"]
  T = tokens.shape[1]
  logits, _ = decoder.forward(
    params,
    tokens,
    jnp.broadcast_to(jnp.arange(T), tokens.shape),
    causal_attention_mask(jnp.ones(tokens.shape, bool)),
    config=CONFIG,
    adapters=adapters,
    lora_scale=CFG.scale,
  )
  logp = jax.nn.log_softmax(logits[:, :-1], -1)
  nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()
  return nll, {}


@pytest.mark.slow
def test_lora_train_step_moves_adapters_only_and_lowers_the_loss():
  """A real LoRA train step: base weights bitwise unchanged, adapters move, loss falls."""
  params = _random_params()
  base = jax.tree.map(np.array, params)
  ad = lora.init_adapters(jax.random.key(0), params, CFG)
  opt = optax.adamw(1e-2)
  mesh = train.make_mesh(1)
  state = train.place(train.init_train_state(ad, opt, jax.random.key(1)), mesh)
  assert jax.tree.structure(state.opt_state[0].mu) == jax.tree.structure(ad)
  step = train.make_train_step(_nll_loss, opt, mesh, micro_batch_size=2)
  batch = {"tokens": jax.random.randint(jax.random.key(2), (2, 12), 0, CONFIG.vocab_size)}
  losses = []
  for _ in range(5):
    state, metrics = step(state, params, batch)
    losses.append(float(metrics["loss"]))
  jax.tree.map(np.testing.assert_array_equal, base, jax.device_get(params))
  for name, ab in state.trainable["layers"].items():
    assert float(jnp.abs(ab["b"]).max()) > 0, f"{name}: B never left zero (no gradient)"
  assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 5)])
def test_delta_value_and_gradients_equal_autodiff_of_the_formula(shape):
  """The custom-VJP adapter path: value and (x, a, b) gradients == autodiff of
  scale * (x @ a) @ b, for 2-D and [batch, seq, in] inputs."""
  kx, ka, kb, kg = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(kx, shape)
  a = jax.random.normal(ka, (5, 3))
  b = jax.random.normal(kb, (3, 6))
  g = jax.random.normal(kg, (*shape[:-1], 6))
  plain = lambda x, a, b: jnp.sum(jnp.tanh(1.7 * ((x @ a) @ b)) * g)
  custom = lambda x, a, b: jnp.sum(jnp.tanh(lora.delta(x, a, b, 1.7)) * g)
  np.testing.assert_allclose(lora.delta(x, a, b, 1.7), 1.7 * (x @ a) @ b, rtol=1e-6, atol=1e-6)
  want = jax.grad(plain, (0, 1, 2))(x, a, b)
  got = jax.jit(jax.grad(custom, (0, 1, 2)))(x, a, b)
  for w, o, name in zip(want, got, "xab"):
    np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5, err_msg=name)


def test_delta_in_bf16_rounds_the_matmul_inputs_and_keeps_float32_gradients():
  kx, ka, kb, kg = jax.random.split(jax.random.key(1), 4)
  x, a = jax.random.normal(kx, (6, 8)), jax.random.normal(ka, (8, 4))
  b, g = jax.random.normal(kb, (4, 5)), jax.random.normal(kg, (6, 5))
  r = lambda t: np.asarray(t.astype(jnp.bfloat16).astype(jnp.float32), np.float64)
  xa = r(x) @ r(a)
  np.testing.assert_allclose(
    lora.delta(x, a, b, 2.0, jnp.bfloat16), 2.0 * r(xa) @ r(b), rtol=1e-5, atol=1e-5
  )
  dx, da, db = jax.grad(lambda *t: jnp.sum(lora.delta(*t, 2.0, jnp.bfloat16) * g), (0, 1, 2))(
    x, a, b
  )
  assert {dx.dtype, da.dtype, db.dtype} == {jnp.dtype(jnp.float32)}
  gb = 2.0 * r(g) @ r(b).T  # the rule on rounded values, float64 here
  np.testing.assert_allclose(db, 2.0 * r(xa).T @ r(g), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(da, r(x).T @ r(gb), rtol=2e-2, atol=1e-2)
  np.testing.assert_allclose(dx, r(gb) @ r(a).T, rtol=2e-2, atol=1e-2)


@pytest.mark.slow
def test_adapter_gradients_agree_across_remat_policies():
  """The "dots" policy keeps only named activations: LoRA gradients through the whole
  model equal those with every activation kept (and with full recomputation)."""
  params = _random_params(2)
  ad = _adapters(params, 3)
  tokens, positions, mask = _forward_args(seed=4, length=10)

  def grads(remat):
    def loss(ad):
      logits, _ = decoder.forward(
        params,
        tokens,
        positions,
        mask,
        config=CONFIG,
        adapters=ad,
        lora_scale=CFG.scale,
        remat=remat,
      )
      return jnp.sum(jax.nn.log_softmax(logits)[..., 7])

    return jax.jit(jax.grad(loss))(ad)

  want = grads(None)
  for remat in ("dots", "full"):
    jax.tree.map(
      lambda w, g: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5), want, grads(remat)
    )


def test_dots_policy_keeps_only_the_named_activations(capsys):
  """Per layer and token, "dots" keeps the layer input, q, k, v, the o and down outputs, the MLP hidden,
  gated_gelu's two products and each adapter's `x @ a`; not the gate/up projections nor
  the base and adapter halves of a projection apart (that doubled the memory)."""
  params = _random_params(2)
  ad = _adapters(params, 3)
  tokens, positions, mask = _forward_args(seed=4, length=10)
  loss = lambda ad: decoder.forward(
    params, tokens, positions, mask, config=CONFIG, adapters=ad, lora_scale=CFG.scale, remat="dots"
  )[0].sum()
  jax.ad_checkpoint.print_saved_residuals(loss, ad)
  L, c = CONFIG.num_layers, CONFIG
  per_layer = re.findall(rf"f32\[{L},2,10,(\d+)\]", capsys.readouterr().out)
  qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  # + the layer's input (the scan keeps it to recompute the rest)
  want = qd + 2 * kd + 3 * c.embed_dim + 3 * c.mlp_dim + len(lora.ALL_TARGETS) * CFG.rank
  assert sum(map(int, per_layer)) == want, sorted(per_layer)


def test_bad_lora_config_raises():
  with pytest.raises(ValueError, match="lora.rank=0"):
    lora.LoraConfig(rank=0)
  with pytest.raises(ValueError, match="qkv"):
    lora.LoraConfig(targets=("qkv",))
