"""Gemma 3 forward: agreement with a slow NumPy reference, KV-cache consistency, errors."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.models import decoder
from rlpost.models import families
from rlpost.models import quant
from rlpost.ops.masks import causal_attention_mask

CONFIG = families.get_config("tiny")


def _random_params(seed=0, config=CONFIG):
  """Random params with non-trivial norm weights and larger matrices."""
  params = decoder.init_params(jax.random.key(seed), config)
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
  leaves = [
    x * 20
    if x.ndim == 3 or x.shape[0] == config.vocab_size
    else 0.3 * jax.random.normal(k, x.shape)
    for x, k in zip(leaves, keys)
  ]
  return jax.tree.unflatten(treedef, leaves)


def _np_rms(x, w, eps):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * (1 + w)


def _np_rope(x, pos, base):
  half = x.shape[-1] // 2
  freq = base ** (-np.arange(half) * 2.0 / x.shape[-1])
  ang = pos * freq
  x1, x2 = x[..., :half], x[..., half:]
  return np.concatenate(
    [x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1
  )


def reference_logits(params, tokens, config, window=None):
  """Slow, obvious single-sequence forward in float64 with explicit loops."""
  c = config
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  T = len(tokens)
  window = c.sliding_window if window is None else window
  x = p["embed"][tokens] * math.sqrt(c.embed_dim)
  group = c.num_heads // c.num_kv_heads
  for i in range(c.num_layers):
    lp = {k: v[i] for k, v in p["layers"].items()}
    is_global = i % c.global_every == c.global_every - 1
    base = c.global_rope_base if is_global else c.local_rope_base
    h = _np_rms(x, lp["attn_norm"], c.rms_eps)
    q = (h @ lp["q"]).reshape(T, c.num_heads, c.head_dim)
    k = (h @ lp["k"]).reshape(T, c.num_kv_heads, c.head_dim)
    v = (h @ lp["v"]).reshape(T, c.num_kv_heads, c.head_dim)
    attn = np.zeros((T, c.num_heads, c.head_dim))
    for t in range(T):
      for n in range(c.num_heads):
        qt = _np_rope(_np_rms(q[t, n], lp["q_norm"], c.rms_eps), t, base)
        qt = qt * c.query_pre_attn_scalar**-0.5
        keys = [s for s in range(t + 1) if is_global or t - s < window]
        scores = np.array(
          [qt @ _np_rope(_np_rms(k[s, n // group], lp["k_norm"], c.rms_eps), s, base) for s in keys]
        )
        w = np.exp(scores - scores.max())
        w /= w.sum()
        attn[t, n] = sum(wi * v[s, n // group] for wi, s in zip(w, keys))
    x = x + _np_rms(attn.reshape(T, -1) @ lp["o"], lp["post_attn_norm"], c.rms_eps)
    h = _np_rms(x, lp["mlp_norm"], c.rms_eps)
    g = h @ lp["gate"]
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    x = x + _np_rms((gelu * (h @ lp["up"])) @ lp["down"], lp["post_mlp_norm"], c.rms_eps)
  return _np_rms(x, p["final_norm"], c.rms_eps) @ p["embed"].T


def _full_forward(params, tokens_1xT, config=CONFIG):
  T = tokens_1xT.shape[1]
  logits, _ = decoder.forward(
    params,
    tokens_1xT,
    jnp.arange(T)[None],
    causal_attention_mask(jnp.ones((1, T), bool)),
    config=config,
  )
  return logits


@pytest.mark.slow
def test_forward_matches_slow_reference_beyond_sliding_window():
  params = _random_params()
  T = 3 * CONFIG.sliding_window  # long enough for the window to matter
  tokens = np.random.default_rng(0).integers(0, CONFIG.vocab_size, T)
  got = np.asarray(_full_forward(params, jnp.asarray(tokens)[None])[0])
  want = reference_logits(params, tokens, CONFIG)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)
  # The window matters: without it the reference differs past the window.
  no_window = reference_logits(params, tokens, CONFIG, window=10**6)
  assert np.abs(no_window[CONFIG.sliding_window :] - want[CONFIG.sliding_window :]).max() > 1e-2
  np.testing.assert_allclose(
    no_window[: CONFIG.sliding_window], want[: CONFIG.sliding_window], atol=1e-9
  )


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["stacked", "unstacked"])
def test_cached_token_by_token_decoding_equals_full_forward(layout):
  params = _random_params(1)
  decode_params = params if layout == "stacked" else decoder.unstack_layers(params)
  T = 2 * CONFIG.sliding_window + 5
  tokens = jax.random.randint(jax.random.key(3), (2, T), 0, CONFIG.vocab_size)
  full = jax.vmap(lambda t: _full_forward(params, t[None])[0])(tokens)
  cache = decoder.init_cache(CONFIG, 2, T + 3)
  step = jax.jit(lambda p, tok, pos, m, c: decoder.forward(p, tok, pos, m, c, config=CONFIG))
  # Prefill 4 tokens at once, then one token at a time.
  prefix = 4
  slots = jnp.arange(T + 3)
  mask = jnp.broadcast_to((slots[None, :] <= jnp.arange(prefix)[:, None])[None], (2, prefix, T + 3))
  logits, cache = step(
    decode_params,
    tokens[:, :prefix],
    jnp.broadcast_to(jnp.arange(prefix), (2, prefix)),
    mask,
    cache,
  )
  outs = [logits]
  for t in range(prefix, T):
    mask = jnp.broadcast_to((slots <= t)[None, None], (2, 1, T + 3))
    logits, cache = step(decode_params, tokens[:, t : t + 1], jnp.full((2, 1), t), mask, cache)
    outs.append(logits)
  chex.assert_trees_all_close(jnp.concatenate(outs, 1), full, atol=2e-4, rtol=1e-4)
  assert int(cache["index"]) == T


def test_hidden_path_gives_logits_through_tied_embedding():
  params = _random_params(2)
  tokens = jax.random.randint(jax.random.key(0), (1, 7), 0, CONFIG.vocab_size)
  hidden, _ = decoder.forward(
    params,
    tokens,
    jnp.arange(7)[None],
    causal_attention_mask(jnp.ones((1, 7), bool)),
    config=CONFIG,
    return_hidden=True,
  )
  chex.assert_shape(hidden, (1, 7, CONFIG.embed_dim))
  chex.assert_trees_all_close(
    hidden @ params["embed"].T, _full_forward(params, tokens), atol=1e-4, rtol=1e-5
  )


def test_embed_rows_read_a_16_bit_tables_int8_copy_and_a_float32_table_itself():
  """With the sampler's int8 copy ("unembed", one scale a row) beside a bfloat16 table the
  rows are the copy's, dequantised as NumPy does (int8 value * float32 scale); beside a
  float32 table, or an untied model's, they are the table's own, bit for bit.

  Mutation caught: `embed_rows` reading the table whatever sits beside it (its condition
  `if True:`), and reading the copy for a float32 table (the dtype test dropped)."""
  table = (jax.random.normal(jax.random.key(3), (40, 16)) * 0.3).astype(jnp.bfloat16)
  tokens = jnp.array([[0, 39, 7], [7, 7, 12]])
  copy = quant.quantize_rows(table)
  rows = decoder.embed_rows({"embed": table, "unembed": copy}, tokens)
  q, scale = np.asarray(copy.q)[np.asarray(tokens)], np.asarray(copy.scale)[np.asarray(tokens)]
  np.testing.assert_array_equal(np.asarray(rows), q.astype(np.float32) * scale[..., None])
  assert not np.array_equal(np.asarray(rows), np.asarray(table[tokens], np.float32))
  wide = table.astype(jnp.float32)
  for params in (
    {"embed": wide, "unembed": quant.quantize_rows(wide)},
    {"embed": table, "output": table, "unembed": copy},
  ):
    own = np.asarray(params["embed"][tokens], np.float32)
    np.testing.assert_array_equal(np.asarray(decoder.embed_rows(params, tokens)), own)


def test_decode_loop_reading_a_bfloat16_tables_int8_copy_widens_no_table():
  """XLA:CPU gathers no bfloat16, so gathering a bfloat16 table's rows in a while loop
  widens the whole table to float32 and hoists that out of the loop; read through the int8
  copy, the loop's temporaries stay far below one float32 table (compiled, not run).

  Mutation caught: `embed_rows` reading the table whatever sits beside it (`if True:`)."""
  V, D = 8192, 256
  table = jax.ShapeDtypeStruct((V, D), jnp.bfloat16)
  copy = jax.eval_shape(quant.quantize_rows, table)

  def loop(table, copy, tokens_B):
    def body(carry):
      t, acc = carry
      rows = decoder.embed_rows({"embed": table, "unembed": copy}, (tokens_B + t)[:, None])
      return t + 1, acc + rows.sum((0, 1))

    return jax.lax.while_loop(lambda c: c[0] < 4, body, (0, jnp.zeros(D)))[1]

  compiled = jax.jit(loop).lower(table, copy, jnp.arange(8)).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < V * D * 4 // 8


def test_layer_pattern_and_presets():
  c = families.get_config("gemma3_270m")
  assert [i for i, g in enumerate(c.global_layers) if g] == [5, 11, 17]
  assert families.get_config("gemma3_270m", sliding_window=4).sliding_window == 4
  with pytest.raises(
    ValueError, match=r"Unknown model preset 'gemma9'.*gemma3_1b.*gemma3_270m.*tiny"
  ):
    families.get_config("gemma9")
  with pytest.raises(ValueError, match="num_kv_heads"):
    families.get_config("tiny", num_kv_heads=3)


def test_tokens_longer_than_cache_raise():
  params = _random_params()
  cache = decoder.init_cache(CONFIG, 1, 4)
  with pytest.raises(ValueError, match="do not fit in a KV cache of 4 slots"):
    decoder.forward(
      params,
      jnp.zeros((1, 5), jnp.int32),
      jnp.arange(5)[None],
      jnp.ones((1, 5, 4), bool),
      cache,
      config=CONFIG,
    )


@pytest.mark.slow
def test_unstacked_layout_with_unmerged_adapters_equals_stacked():
  """The decode layout (unrolled layers, fused q/k/v and gate/up) keeps LoRA paths exact."""
  from rlpost.models import lora as lora_lib

  params = _random_params(2)
  lcfg = lora_lib.LoraConfig(rank=4, alpha=8)
  adapters = lora_lib.init_adapters(jax.random.key(5), params, lcfg)
  adapters = jax.tree.map(lambda x: x + 0.1, adapters)  # B starts at zero: make it matter
  tokens = jax.random.randint(jax.random.key(6), (2, 6), 0, CONFIG.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((6, 8), bool)), (2, 6, 8))
  run = jax.jit(  # one program per layout, not one per op
    lambda p: decoder.forward(
      p,
      tokens,
      pos,
      mask,
      decoder.init_cache(CONFIG, 2, 8),
      config=CONFIG,
      adapters=adapters,
      lora_scale=lcfg.scale,
    )[0]
  )
  stacked, unstacked = run(params), run(decoder.unstack_layers(params))
  chex.assert_trees_all_close(unstacked, stacked, atol=1e-4, rtol=1e-5)
  assert "q+k+v" in decoder.unstack_layers(params)["layers"][0]


def test_decode_layout_unrolls_only_layers_worth_their_compile():
  """The sampler's layout by layer size (shapes only, nothing compiles): the tiny model's
  49 KB layers stay stacked, a layer of 270M's widths (24 MB) is unrolled with fused q/k/v,
  the threshold itself counts as large, and an unrolled tree comes back as it is.
  Mutations caught: the comparison flipped; bytes counted over all layers at once."""
  shapes = lambda config: jax.eval_shape(lambda: decoder.init_params(jax.random.key(0), config))
  layout = lambda params: jax.eval_shape(lambda p: decoder.decode_layout(p), params)["layers"]
  tiny = shapes(families.get_config("tiny", num_layers=32))
  assert isinstance(layout(tiny), dict)
  big = shapes(families.get_config("tiny", embed_dim=640, mlp_dim=2048, num_heads=4, head_dim=256))
  unrolled = layout(big)
  assert isinstance(unrolled, tuple) and "q+k+v" in unrolled[0]
  assert layout({**big, "layers": unrolled}) == unrolled
  layer_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tiny["layers"])) // 32
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(decoder, "UNROLL_MIN_LAYER_BYTES", layer_bytes)
    assert isinstance(layout(tiny), tuple)


@pytest.mark.optimized_codegen
def test_gated_gelu_gradient_equals_autodiff_of_the_formula():
  gate = 4 * jax.random.normal(jax.random.key(7), (3, 5, 64))
  up = jax.random.normal(jax.random.key(8), (3, 5, 64))
  cot = jax.random.normal(jax.random.key(9), (3, 5, 64))
  plain = lambda g, u: jnp.sum(jax.nn.gelu(g, approximate=True) * u * cot)
  custom = lambda g, u: jnp.sum(decoder.gated_gelu(g, u) * cot)
  chex.assert_trees_all_close(custom(gate, up), plain(gate, up), rtol=1e-6)
  chex.assert_trees_all_close(
    jax.grad(custom, (0, 1))(gate, up), jax.grad(plain, (0, 1))(gate, up), atol=1e-5, rtol=1e-5
  )
  # Under the "dots" remat policy inside jit, too.
  remat = jax.jit(
    jax.grad(
      jax.checkpoint(custom, policy=jax.checkpoint_policies.save_only_these_names("gated_gelu")),
      (0, 1),
    )
  )
  chex.assert_trees_all_close(
    remat(gate, up), jax.grad(plain, (0, 1))(gate, up), atol=1e-5, rtol=1e-5
  )


def test_gated_gelu_forward_under_grad_is_bitwise_the_primal():
  """The trainer's logprobs (under grad) and reference logprobs (no grad) must agree exactly."""
  gate = 3 * jax.random.normal(jax.random.key(10), (4, 256))
  up = jax.random.normal(jax.random.key(11), (4, 256))
  primal = jax.jit(decoder.gated_gelu)(gate, up)
  under_grad, _ = jax.jit(lambda g, u: jax.vjp(decoder.gated_gelu, g, u))(gate, up)
  np.testing.assert_array_equal(np.asarray(under_grad), np.asarray(primal))


@pytest.mark.slow
@pytest.mark.parametrize("remat", [None, "dots"])
def test_shared_prefix_computed_once_gives_the_full_forward_and_its_gradients(remat):
  """`shared_prefix=K`: row 0's first K slots computed once, the rest of every row
  attending them, gives the K = 0 hidden states at every slot that attends something
  and the same gradients (params and LoRA adapters), with left padding inside the
  prefix, a sliding window (8) shorter than the prefix (12), rows of different lengths.

  Mutations that fail here: the other slots not reading the prefix keys (`front` left
  out), the prefix's RoPE tables taken from the rest's slots, the rest's mask
  columns cut to its own slots, the broadcast prefix under stop_gradient."""
  from rlpost.models import lora as lora_lib

  params = _random_params(3)
  adapters = lora_lib.init_adapters(jax.random.key(4), params, lora_lib.LoraConfig(rank=4))
  adapters = jax.tree.map(lambda x: x + 0.05, adapters)
  B, S, K = 3, 24, 12
  tokens = jax.random.randint(jax.random.key(5), (B, S), 0, CONFIG.vocab_size)
  tokens = tokens.at[:, :K].set(tokens[0, :K])
  valid = jnp.ones((B, S), bool).at[:, :2].set(False).at[1, 19:].set(False)
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
  mask = causal_attention_mask(valid)

  def hidden(params, adapters, k):
    h, _ = decoder.forward(
      params,
      tokens,
      positions,
      mask,
      config=CONFIG,
      return_hidden=True,
      adapters=adapters,
      remat=remat,
      shared_prefix=k,
    )
    return h

  def loss(params, adapters, k):  # a nonlinear read of every slot that attends something
    return jnp.sum(jnp.sin(hidden(params, adapters, k)) * valid[..., None])

  run = jax.jit(hidden, static_argnums=2)
  chex.assert_trees_all_close(
    jnp.where(valid[..., None], run(params, adapters, K), 0),
    jnp.where(valid[..., None], run(params, adapters, 0), 0),
    atol=2e-4,
    rtol=1e-5,
  )
  grads = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
  chex.assert_trees_all_close(
    grads(params, adapters, K), grads(params, adapters, 0), atol=2e-3, rtol=1e-4
  )


def test_shared_prefix_out_of_range_or_with_a_cache_raises():
  params = _random_params()
  args = (params, jnp.zeros((2, 5), jnp.int32), jnp.zeros((2, 5), jnp.int32))
  with pytest.raises(ValueError, match=r"shared_prefix=5: must be in \[0, 5\)"):
    decoder.forward(*args, jnp.ones((2, 5, 5), bool), config=CONFIG, shared_prefix=5)
  with pytest.raises(ValueError, match="0 with a cache"):
    cache = decoder.init_cache(CONFIG, 2, 8)
    decoder.forward(*args, jnp.ones((2, 5, 8), bool), cache, config=CONFIG, shared_prefix=2)
