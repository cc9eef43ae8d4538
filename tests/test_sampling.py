"""Sampler properties on a random tiny model: logprob convention, padding, stops, sharing."""

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost import continuation, sampling
from rlpost.models import decoder
from test_gemma3 import CONFIG, _random_params
from rlpost.ops.masks import causal_attention_mask

PARAMS = _random_params(5)


def _sample(prompts, sc, key=0, **kw):
  tokens, lengths = sampling.pad_prompts(prompts, sc)
  return sampling.sample(
    PARAMS, tokens, lengths, jax.random.key(key), model_config=CONFIG, config=sc, **kw
  )


@jax.jit
def _causal_logits(tokens_1xT):
  """Logits [1, T, V] of one causal forward pass without a cache (one program per T)."""
  T = tokens_1xT.shape[1]
  mask = causal_attention_mask(jnp.ones((1, T), bool))
  return decoder.forward(PARAMS, tokens_1xT, jnp.arange(T)[None], mask, config=CONFIG)[0]


def _recomputed_logprobs(prompt, completion, n, temperature, top_k=None):
  """log-prob of each completion token from one full forward pass (slow path). The
  sequence is zero-padded at its end to 32 tokens: causal, so no logit below reads the
  padding, and every call runs the same program."""
  seq = list(prompt) + list(completion[:n])
  assert len(seq) <= 32
  logits = _causal_logits(jnp.asarray(seq + [0] * (32 - len(seq)), jnp.int32)[None])
  logits = logits[0, len(prompt) - 1 : len(seq) - 1] / temperature
  if top_k is not None:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  lp = jax.nn.log_softmax(logits, -1)
  return np.asarray(jnp.take_along_axis(lp, jnp.asarray(completion[:n])[:, None], -1)[:, 0])


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, None), (0.7, None), (1.3, 5)])
def test_sampler_logprobs_equal_full_forward_recomputation(temperature, top_k):
  sc = sampling.SamplingConfig(
    temperature=temperature, top_k=top_k, max_new_tokens=12, prompt_bucket=8, stop_ids=(7,)
  )
  prompts = [[2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [2, 30, 31]]
  out = _sample(prompts, sc, key=3)
  for b, prompt in enumerate(prompts):
    n = int(out.lengths[b])
    assert n >= 1
    got = np.asarray(out.logprobs[b, :n])
    want = _recomputed_logprobs(prompt, np.asarray(out.tokens[b]), n, temperature, top_k)
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.slow
def test_greedy_independent_of_padding_and_batch_companions():
  sc = sampling.SamplingConfig(temperature=0.0, max_new_tokens=16, prompt_bucket=4, stop_ids=())
  prompt = [2, 100, 101, 102, 103]
  alone = _sample([prompt], sc)
  companions = [[2] + list(range(40, 40 + n)) for n in (19, 2)]
  mixed = _sample([companions[0], prompt, companions[1]], sc)
  padded = _sample(
    [prompt],
    sampling.SamplingConfig(temperature=0.0, max_new_tokens=16, prompt_bucket=32, stop_ids=()),
  )
  np.testing.assert_array_equal(alone.tokens[0], mixed.tokens[1])
  np.testing.assert_array_equal(alone.tokens[0], padded.tokens[0])
  np.testing.assert_allclose(alone.logprobs[0], mixed.logprobs[1], atol=1e-5)


@pytest.mark.slow
def test_stops_lengths_and_max_new_tokens():
  sc = sampling.SamplingConfig(
    temperature=1.5, max_new_tokens=20, prompt_bucket=8, stop_ids=(3, 4, 5, 6, 7, 8, 9), pad_id=0
  )
  prompts = [[2, 11 + i, 12] for i in range(8)]
  out = _sample(prompts, sc, key=1, max_new_tokens=jnp.int32(13))
  tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
  assert mask.shape == (8, 20)
  assert not mask[:, 13:].any(), "wrote beyond the traced max_new_tokens"
  np.testing.assert_array_equal(out.lengths, mask.sum(1))
  stopped = 0
  for row, m in zip(tokens, mask):
    n = m.sum()
    assert m[:n].all() and not m[n:].any()  # mask is a prefix
    assert (row[n:] == 0).all()  # pad after the end
    stops = np.flatnonzero(np.isin(row[:n], sc.stop_ids))
    if n < 13:  # ended early: by a stop token, the last one
      assert list(stops) == [n - 1]
      stopped += 1
    else:
      assert len(stops) <= 1 and (len(stops) == 0 or stops[0] == n - 1)
  assert stopped > 0, "test needs some rows to stop early"


@pytest.mark.slow
def test_traced_max_new_tokens_does_not_recompile():
  sc = sampling.SamplingConfig(temperature=1.0, max_new_tokens=10, prompt_bucket=8, stop_ids=())
  _sample([[2, 5]], sc, max_new_tokens=jnp.int32(3))
  before = sampling.sample._cache_size()
  out = _sample([[2, 6]], sc, max_new_tokens=jnp.int32(7))
  assert sampling.sample._cache_size() == before
  assert int(out.lengths[0]) == 7


@pytest.mark.slow
def test_shared_prefill_equals_separately_prefilled_copies():
  sc = sampling.SamplingConfig(temperature=1.0, max_new_tokens=10, prompt_bucket=8, stop_ids=(9,))
  prompts = [[2, 50, 51, 52], [2, 60, 61, 62, 63, 64, 65, 66, 67, 68]]
  G = 3
  shared = _sample(prompts, sc, key=7, num_samples=G)
  copies = _sample([p for p in prompts for _ in range(G)], sc, key=7)
  chex.assert_trees_all_close(shared, copies, atol=1e-5)
  assert len({tuple(r) for r in np.asarray(shared.tokens[:G])}) > 1, "samples should differ"


@pytest.mark.slow
def test_same_key_same_output_different_key_different_output():
  sc = sampling.SamplingConfig(temperature=1.0, max_new_tokens=10, prompt_bucket=8, stop_ids=())
  a, b, c = (_sample([[2, 5, 6]], sc, key=k) for k in (1, 1, 2))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, c.tokens)


@pytest.mark.slow
def test_a_rows_sample_depends_on_its_row_id_not_its_batch_position():
  """Row r draws from fold_in(key, row_ids[r]): the rows of a batch split in two halves
  (as two processes would sample them) equal the whole batch's rows, and a row moved
  to another position keeps its sample when it keeps its id.

  Mutation caught: one key for the whole batch (a row's draws then depend on the
  batch's width and its position in it).
  """
  sc = sampling.SamplingConfig(temperature=1.0, max_new_tokens=10, prompt_bucket=8, stop_ids=())
  prompts = [[2, 50 + i, 51 + i] for i in range(4)]
  G = 2
  whole = _sample(prompts, sc, key=4, num_samples=G)
  halves = [
    _sample(prompts[h * 2 : h * 2 + 2], sc, key=4, num_samples=G, row_ids=jnp.arange(4) + 4 * h)
    for h in (0, 1)
  ]
  np.testing.assert_array_equal(np.concatenate([h.tokens for h in halves]), whole.tokens)
  np.testing.assert_allclose(
    np.concatenate([h.logprobs for h in halves]), whole.logprobs, atol=1e-5
  )
  ids_by_prompt = jnp.arange(4 * G).reshape(4, G)  # prompt-major rows: id b * G + g
  reversed_ = _sample(prompts[::-1], sc, key=4, num_samples=G, row_ids=ids_by_prompt[::-1].ravel())
  want = np.asarray(whole.tokens).reshape(4, G, -1)[::-1].reshape(4 * G, -1)
  np.testing.assert_array_equal(reversed_.tokens, want)
  assert len({tuple(r) for r in np.asarray(whole.tokens)}) > 4, "rows should differ"


@pytest.mark.slow
@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(st.sampled_from([2, 17, 300]), st.floats(0.2, 3.0), st.integers(0, 2**31 - 1))
def test_inverse_cdf_categorical_follows_softmax(vocab, scale, seed):
  """The two-level inverse-CDF sampler matches softmax probabilities (chi-square-ish bound)."""
  rng = np.random.default_rng(seed)
  logits = jnp.asarray(rng.normal(size=(1, vocab)) * scale, jnp.float32)
  logits = logits.at[0, rng.integers(vocab)].set(-jnp.inf)  # a zero-probability token
  n = 4000
  keys = jax.random.split(jax.random.key(seed), n)
  draws = np.asarray(_draws(keys, jnp.broadcast_to(logits, (n, vocab)).T))
  probs = np.asarray(jax.nn.softmax(logits[0]))
  counts = np.bincount(draws, minlength=vocab)
  assert counts[probs == 0].sum() == 0
  # Total-variation distance of the empirical distribution stays small.
  assert 0.5 * np.abs(counts / n - probs).sum() < 0.5 * np.sqrt(vocab / n) + 0.02


_draws = jax.jit(lambda keys, logits: sampling._categorical(keys, logits)[0])


def _np_nucleus(logits, temperature, top_p):
  """Float64 reference: softmax(logits / T) restricted to the smallest prefix (by
  descending probability) whose mass reaches top_p, renormalised."""
  probs = np.exp(logits / temperature - np.max(logits / temperature))
  probs /= probs.sum()
  order = np.argsort(-probs, kind="stable")
  mass_before = np.cumsum(probs[order]) - probs[order]
  keep = np.zeros_like(probs, bool)
  keep[order[mass_before < top_p]] = True
  nucleus = np.where(keep, probs, 0.0)
  return nucleus / nucleus.sum()


@pytest.mark.slow
@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(
  st.sampled_from([5, 40, 300]),
  st.floats(0.3, 0.95),
  st.floats(0.5, 1.5),
  st.integers(0, 2**31 - 1),
)
def test_top_p_samples_the_renormalised_nucleus(vocab, top_p, temperature, seed):
  """Nucleus sampling draws from the truncated, renormalised softmax and reports its logprobs.

  Mutation caught: the `top_p < 1` branch deleted (tokens outside the nucleus appear,
  and the logprobs are those of the untruncated distribution).
  """
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=vocab) * 2.0
  want = _np_nucleus(logits, temperature, top_p)
  hypothesis.assume(want.max() < 0.999)  # a one-token nucleus shows nothing
  n = 4000
  sc = sampling.SamplingConfig(temperature=temperature, top_p=top_p)
  tokens, logp = _select(
    jax.random.split(jax.random.key(seed), n),
    jnp.broadcast_to(jnp.asarray(logits, jnp.float32)[:, None], (vocab, n)),
    sc,
  )
  tokens, logp = np.asarray(tokens), np.asarray(logp)
  counts = np.bincount(tokens, minlength=vocab)
  assert counts[want == 0].sum() == 0, "sampled a token outside the nucleus"
  assert 0.5 * np.abs(counts / n - want).sum() < 0.5 * np.sqrt(vocab / n) + 0.02
  np.testing.assert_allclose(logp, np.log(want[tokens]), atol=1e-5)


_select = jax.jit(sampling.select_tokens, static_argnums=2)


def test_invalid_sampling_settings_raise():
  for bad in (-0.5, float("inf"), float("nan")):
    with pytest.raises(ValueError, match=f"temperature={bad} must be a finite number >= 0"):
      sampling.SamplingConfig(temperature=bad)
  with pytest.raises(ValueError, match="nucleus_candidates=0 must be >= 1"):
    sampling.SamplingConfig(nucleus_candidates=0)
  for bad in (0.0, 1.5):
    with pytest.raises(ValueError, match=f"top_p={bad} must be in"):
      sampling.SamplingConfig(top_p=bad)
  with pytest.raises(ValueError, match="top_k=0"):
    sampling.SamplingConfig(top_k=0)


def test_bad_sample_arguments_fail_naming_the_argument():
  """Arguments of the wrong shape or type fail at trace time naming the argument and the
  fix, not with a dynamic_update_slice / lax.top_k error from inside the decode loop, and
  num_samples=0 no longer returns an empty batch silently.

  Mutation caught: no `_check_sample_args` in `sample`, no whole-number check in
  SamplingConfig (top_k=2.5 failed inside lax.top_k).
  """
  sc = sampling.SamplingConfig(max_new_tokens=2, prompt_bucket=4)
  tokens, lengths = sampling.pad_prompts([[2, 10, 11]], sc)
  call = lambda t=tokens, n=lengths, **kw: sampling.sample(
    PARAMS, t, n, jax.random.key(0), model_config=CONFIG, config=sc, **kw
  )
  with pytest.raises(ValueError, match=r"row_ids has shape \(3,\), expected .* = \(2,\)"):
    call(row_ids=jnp.arange(3), num_samples=2)
  with pytest.raises(ValueError, match=r"lengths_B has shape \(2,\), expected \[B\] = \(1,\)"):
    call(n=jnp.asarray([3, 3], jnp.int32))
  with pytest.raises(ValueError, match="tokens_BxP must be .* integer token ids, got float32"):
    call(t=tokens.astype(jnp.float32))
  with pytest.raises(ValueError, match="num_samples=0 must be >= 1"):
    call(num_samples=0)
  for field in ("top_k", "max_new_tokens", "prompt_bucket"):
    with pytest.raises(ValueError, match=f"SamplingConfig.{field}=2.5 must be a whole number"):
      sampling.SamplingConfig(**{field: 2.5})


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_continued_turns_equal_sampling_the_whole_history_as_a_prompt(temperature):
  """Three turns: a sample of G=2 per prompt, then per row the first `kept` sampled
  tokens (fewer than sampled: a stop string, a budget) plus new tokens of another length
  per row continue the cache (`continuation.extend`); each turn's tokens equal `sample`'s
  on the whole history as one left-padded prompt, with the same key and row ids, and
  the logprobs within float rounding. Mutations caught: the kept tokens left out of the
  history (`kept_B` ignored), the new tokens' positions not following the history."""
  sc = sampling.SamplingConfig(
    temperature=temperature, max_new_tokens=6, stop_ids=(), prompt_bucket=8
  )
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(3, CONFIG.vocab_size, n)) for n in (3, 9)]
  tokens, lengths = sampling.pad_prompts(prompts, sc)
  ids = jnp.arange(4, dtype=jnp.int32) + 10
  start = lambda keep: continuation.start(
    PARAMS,
    tokens,
    lengths,
    jax.random.key(1),
    None,
    ids,
    model_config=CONFIG,
    config=sc,
    num_samples=2,
    keep_cache=keep,
  )
  out, state = start(True)
  plain, none = start(False)
  assert none is None  # no later turn: the plain sampler, bitwise the same turn
  chex.assert_trees_all_equal(plain, out)
  histories = [list(prompts[r // 2]) for r in range(4)]
  for turn in (1, 2):
    kept = rng.integers(1, 7, 4)
    new = [list(rng.integers(3, CONFIG.vocab_size, n)) for n in rng.integers(1, 5, 4)]
    for r in range(4):
      histories[r] += [int(t) for t in np.asarray(out.tokens)[r, : kept[r]]] + new[r]
    new_tokens, new_lengths = sampling.pad_prompts(new, sc)
    key = jax.random.key(1 + turn)
    # Turn 1 sizes its cache itself (grown past turn 0's P + N); turn 2 gets exactly what
    # it needs, and one slot less is refused.
    need = continuation.slots_needed(state, kept, new_tokens.shape[1], sc.max_new_tokens)
    if turn == 2:
      with pytest.raises(ValueError, match=f"cache_size={need - 1} slots cannot hold"):
        continuation.extend(
          PARAMS,
          state,
          kept,
          new_tokens,
          new_lengths,
          key,
          model_config=CONFIG,
          config=sc,
          cache_size=need - 1,
        )
    out, state = continuation.extend(
      PARAMS,
      state,
      jnp.asarray(kept, jnp.int32),
      new_tokens,
      new_lengths,
      key,
      None,
      ids,
      model_config=CONFIG,
      config=sc,
      cache_size=need if turn == 2 else None,
    )
    h_tokens, h_lengths = sampling.pad_prompts(histories, sc)
    want = sampling.sample(
      PARAMS, h_tokens, h_lengths, key, None, ids, model_config=CONFIG, config=sc
    )
    np.testing.assert_array_equal(out.tokens, want.tokens, err_msg=f"turn {turn}")
    np.testing.assert_allclose(out.logprobs, want.logprobs, atol=1e-5, err_msg=f"turn {turn}")
