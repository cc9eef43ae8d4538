"""RLBatch building: stop-string truncation and re-padding prompts of different buckets."""

import dataclasses

import pytest
import jax
import numpy as np

from rlpost import sampling
from rlpost.models import loading
from rlpost.models import policy
from rlpost.rl import batch as batch_lib
from rlpost.rl import objectives
from rlpost.text import tokenizer as tokenizer_lib
from conftest import require_gemma3
from test_gemma3 import CONFIG, _random_params

TOK = tokenizer_lib.byte_tokenizer()


def _text_batch(prompt: str, completions: list[str], T: int, tokenizer=TOK):
  """A hand-made RL batch: one encoded prompt, then each completion's tokens (right-padded)."""
  p = tokenizer.encode(prompt)
  rows = [tokenizer.encode(c, add_bos=False) for c in completions]
  tokens = np.zeros((len(rows), len(p) + T), np.int32)
  mask = np.zeros((len(rows), T), np.float32)
  for i, r in enumerate(rows):
    tokens[i, : len(p)] = p
    tokens[i, len(p) : len(p) + len(r)] = r
    mask[i, : len(r)] = 1
  valid = np.concatenate([np.ones((len(rows), len(p)), bool), mask > 0], 1)
  return batch_lib.RLBatch(
    tokens=tokens,
    valid=valid,
    loss_mask=mask,
    sampler_logp=np.zeros_like(mask),
    positions=np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape).copy(),
  )


def test_truncate_at_stop_strings_on_hand_made_batch():
  stops = ("</answer>", "\nQuestion:")
  batch = _text_batch(
    "Q", ["<answer>7</answer> and more", "no stop here", "3\nQuestion: next", "</answer>"], T=32
  )
  out = batch_lib.truncate_at_stop_strings(batch, TOK, stops)
  assert batch_lib.completion_texts(out, TOK) == [
    "<answer>7</answer>",
    "no stop here",
    "3\nQuestion:",
    "</answer>",
  ]
  P = batch.prompt_len
  np.testing.assert_array_equal(out.valid[:, P:], out.loss_mask > 0)
  np.testing.assert_array_equal(out.valid[:, :P], batch.valid[:, :P])
  assert batch_lib.truncate_at_stop_strings(batch, TOK, ()) is batch
  # A multi-byte stop string: per-token decoding of byte tokens would never see it.
  out = batch_lib.truncate_at_stop_strings(_text_batch("Q", ["x = 5 Ω then"], T=16), TOK, ("Ω",))
  assert batch_lib.completion_texts(out, TOK) == ["x = 5 Ω"]


def test_truncate_at_stop_strings_with_sentencepiece_spaces():
  """Stop strings with spaces match the decoded text (a per-token decode drops them)."""
  require_gemma3()
  tok = loading.load_gguf_tokenizer()
  batch = _text_batch("Q", ["so the answer is 7. Then more text"], T=24, tokenizer=tok)
  out = batch_lib.truncate_at_stop_strings(batch, tok, (" is 7.",))
  assert batch_lib.completion_texts(out, tok) == ["so the answer is 7."]


@pytest.mark.slow
def test_concat_batches_re_pads_prompts_and_completion_widths():
  """Rows whose prompts fell in different buckets (8 and 16 slots) are left-padded to 16,
  and rows of a narrower completion width (6 slots, against 9) get empty slots appended
  (not valid, off the loss mask, turn id -1); every row's completion logprobs are those
  of its own batch. Mutation caught: appended slots with turn id 0."""
  params = _random_params(2)
  sc = sampling.SamplingConfig(temperature=1.0, max_new_tokens=6, prompt_bucket=8, stop_ids=())
  batches = []
  for k, prompts in enumerate(([[2, 40, 41]], [[2] + list(range(50, 62)), [2, 70]])):
    tokens, lengths = sampling.pad_prompts(prompts, sc)
    out = sampling.sample(
      params, tokens, lengths, jax.random.key(k), model_config=CONFIG, config=sc, num_samples=2
    )
    b = batch_lib.from_samples(tokens, lengths, jax.device_get(out), 2)
    batches.append(dataclasses.replace(b, turn_ids=np.zeros(b.loss_mask.shape, np.int32)))
  assert [b.prompt_len for b in batches] == [8, 16]
  batches[0] = batch_lib.with_width(batches[0], 9, pad_id=0)  # a wider rollout's rows
  joined = batch_lib.concatenate(batches, pad_id=0)
  assert joined.tokens.shape == (6, 16 + 9)
  first = joined.tokens[:2]
  np.testing.assert_array_equal(first[:, :8], 0)  # the new slots are left padding
  assert not joined.valid[:2, :8].any() and (joined.positions[:2, :8] == 0).all()
  np.testing.assert_array_equal(first[:, 8:], batches[0].tokens)
  assert not joined.valid[2:, 16 + 6 :].any() and not joined.loss_mask[2:, 6:].any()
  np.testing.assert_array_equal(joined.tokens[2:, 16:22], batches[1].tokens[:, 16:])
  assert (joined.turn_ids[:, 6:] == -1).all() and (joined.turn_ids[:, :6] == 0).all()
  fwd = policy.ForwardConfig(CONFIG)
  logp = lambda b: np.asarray(
    policy.completion_logprobs_jit(params, None, batch_lib.to_device(b), fwd)
  )
  parts = [logp(batches[0]), batch_lib.pad_slots(logp(batches[1]), 9)]
  np.testing.assert_allclose(logp(joined), np.concatenate(parts), atol=1e-5)
  np.testing.assert_allclose(logp(joined), joined.sampler_logp, atol=1e-4)


def test_loss_slots_list_each_rows_loss_tokens_in_order():
  """`with_loss_slots`: the mask's slots ascending then -1; a row above the capacity is
  an error naming it; a capacity >= T leaves the batch as it was.

  Mutation caught: an unstable sort (slots out of order), padding with 0 instead of -1.
  """
  mask = np.zeros((3, 10), np.float32)
  mask[0, [1, 2, 7]] = 1
  mask[2, [0, 9]] = 1
  batch = batch_lib.RLBatch(
    tokens=np.zeros((3, 14), np.int32),
    positions=np.zeros((3, 14), np.int32),
    valid=np.ones((3, 14), bool),
    loss_mask=mask,
    sampler_logp=np.zeros((3, 10), np.float32),
  )
  slots = batch_lib.with_loss_slots(batch, 4).loss_slots
  np.testing.assert_array_equal(slots, [[1, 2, 7, -1], [-1, -1, -1, -1], [0, 9, -1, -1]])
  assert slots.dtype == np.int32
  assert batch_lib.with_loss_slots(batch, 10) is batch
  with pytest.raises(ValueError, match="row 0 has 3 loss tokens, above the loss_slots capacity 2"):
    batch_lib.with_loss_slots(batch, 2)


def _left_padded(contexts, P: int, T: int = 2):
  """A batch of these token lists left-padded to P context slots (positions from 0),
  then T completion slots holding 7, 8, ... (valid, on the loss mask)."""
  N = len(contexts)
  tokens = np.zeros((N, P + T), np.int32)
  positions = np.zeros((N, P + T), np.int32)
  valid = np.zeros((N, P + T), bool)
  for r, c in enumerate(contexts):
    tokens[r, P - len(c) : P] = c
    positions[r, P - len(c) : P] = np.arange(len(c))
    positions[r, P:] = len(c) + np.arange(T)
  tokens[:, P:] = 7 + np.arange(T)
  valid[:, P:] = True
  for r, c in enumerate(contexts):
    valid[r, P - len(c) : P] = True
  return batch_lib.RLBatch(
    tokens=tokens,
    positions=positions,
    valid=valid,
    loss_mask=np.ones((N, T), np.float32),
    sampler_logp=np.zeros((N, T), np.float32),
  )


def test_shared_prefix_moves_the_opening_every_context_shares_to_the_first_slots():
  """`with_shared_prefix`: K = the context tokens (with positions) every row opens with,
  below the shortest context, rounded down to PREFIX_BUCKET; each row's context becomes
  those K, its padding, the rest of it (completion slots untouched); with a gather
  (several processes), the least over processes and where their rows 0 agree.

  Mutations caught: rounding up; positions not compared; K not kept below the shortest
  context; the padding put before the prefix; the gathered rows 0 not compared."""
  assert batch_lib.PREFIX_BUCKET == 16
  rng = np.random.default_rng(0)
  opening = list(rng.integers(3, 200, size=37))
  tails = [list(rng.integers(3, 200, size=n)) for n in (5, 9, 2)]
  tails[1][0] = opening[0] + 1  # shares no more than the opening
  batch = _left_padded([opening + t for t in tails], P=50)
  out = batch_lib.with_shared_prefix(batch)
  assert out.shared_prefix == 32
  for r, t in enumerate(tails):
    pad = 50 - 37 - len(t)
    np.testing.assert_array_equal(out.tokens[r, :32], opening[:32])
    np.testing.assert_array_equal(out.positions[r, :32], np.arange(32))
    assert out.valid[r, :32].all() and not out.valid[r, 32 : 32 + pad].any()
    np.testing.assert_array_equal(out.tokens[r, 32 + pad : 50], opening[32:] + t)
    np.testing.assert_array_equal(out.positions[r, 32 + pad : 50], np.arange(32, 37 + len(t)))
    np.testing.assert_array_equal(out.tokens[r, 50:], batch.tokens[r, 50:])
  # a context of 32 tokens, all shared: K stays below it (slot P - 1 keeps its last token)
  short = batch_lib.with_shared_prefix(_left_padded([opening, opening[:32]], P=48))
  assert short.shared_prefix == 16 and short.tokens[1, 47] == opening[31]
  shifted = _left_padded([opening + t for t in tails], P=50)
  shifted.positions[1, :50] += 1  # the same tokens one position later: nothing shared
  assert batch_lib.with_shared_prefix(shifted).shared_prefix == 0
  assert batch_lib.with_shared_prefix(_left_padded([opening[:15]] * 2, P=16)).shared_prefix == 0

  # Two processes, each with rows agreeing on 37 tokens; their rows 0 differ at token 20.
  other = opening[:20] + [opening[20] + 1] + opening[21:]
  per_process = [
    _left_padded([opening + tails[0], opening + tails[2]], P=50),
    _left_padded([other + tails[1], other + tails[2]], P=50),
  ]
  sent = []  # each process's message: what shares.all_rows gathers
  for b in per_process:
    batch_lib.with_shared_prefix(b, lambda x: sent.append(x) or x)
  gathered = lambda x: np.concatenate(sent)
  ks = [batch_lib.with_shared_prefix(b, gathered).shared_prefix for b in per_process]
  assert ks == [16, 16]
  assert batch_lib.with_shared_prefix(per_process[0]).shared_prefix == 32  # alone: its own


@pytest.mark.slow
def test_a_batch_with_a_shared_prefix_reads_row_0s_prefix_and_trains_as_the_full_batch():
  """The trainer's passes read `shared_prefix` (`policy.completion_hidden`): the
  completion logprobs and the PPO loss's gradients of a batch whose contexts (of three
  lengths, left-padded) open alike equal those of the batch as it was before
  `with_shared_prefix` moved the opening; a batch that claims a prefix its rows do not
  share gets row 0's (so the setting is used, not ignored). Mutations caught:
  completion_hidden not passing the batch's prefix on; the padding moved before the
  prefix."""
  import chex
  from rlpost.models import critic as critic_lib

  params = _random_params(2)
  contexts = [TOK.encode("a shared instruction: " + t) for t in ("go", "then left", "up")]
  batch = _left_padded(contexts, P=40, T=4)
  shared = batch_lib.with_shared_prefix(batch)
  assert shared.shared_prefix == 16
  assert not np.array_equal(shared.tokens, batch.tokens)  # the openings moved
  fwd = policy.ForwardConfig(CONFIG)
  logp = lambda b: np.asarray(
    policy.completion_logprobs_jit(params, None, batch_lib.to_device(b), fwd)
  )
  np.testing.assert_allclose(logp(shared), logp(batch), atol=2e-5)
  liar = dataclasses.replace(shared, tokens=shared.tokens.copy(), shared_prefix=0)
  liar.tokens[1, 3] += 1  # row 1's context now differs at slot 3
  assert not np.allclose(logp(liar)[1], logp(batch)[1], atol=1e-3)
  np.testing.assert_allclose(
    logp(dataclasses.replace(liar, shared_prefix=16))[1], logp(batch)[1], atol=2e-5
  )

  layout = critic_lib.CriticLayout("full", None)
  trainable = {
    "policy": params,
    "critic": critic_lib.init_critic(jax.random.key(1), params, layout),
  }
  loss_fn = objectives.make_ppo_loss_fn(objectives.PPOConfig(beta=0.0), fwd, layout)
  grads = lambda b: jax.jit(jax.grad(lambda t: loss_fn(t, None, b)[0]))(trainable)
  scored = lambda b: batch_lib.to_device(
    dataclasses.replace(b, scores=np.asarray([1.0, -0.5, 0.25], np.float32))
  )
  chex.assert_trees_all_close(grads(scored(shared)), grads(scored(batch)), atol=1e-4, rtol=1e-4)
