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
    objectives.completion_logprobs_jit(params, None, batch_lib.to_device(b), fwd)
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


def _rows(tokens_NxS, valid_NxS=None):
  """A batch of these context rows (positions counting valid slots), one completion slot."""
  tokens = np.asarray(tokens_NxS, np.int32)
  valid = np.ones(tokens.shape, bool) if valid_NxS is None else np.asarray(valid_NxS)
  N = tokens.shape[0]
  return batch_lib.RLBatch(
    tokens=tokens,
    positions=np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32),
    valid=valid,
    loss_mask=np.ones((N, 1), np.float32),
    sampler_logp=np.zeros((N, 1), np.float32),
  )


def test_shared_prefix_is_the_rows_common_leading_slots_rounded_down():
  """`with_shared_prefix`: the leading slots where tokens, positions and `valid` agree in
  every row, rounded down to PREFIX_BUCKET and kept below S; with a gather (several
  processes), the least over processes and where their rows 0 agree.

  Mutations caught: rounding up; `valid` (and with it positions) not compared; the
  gathered rows 0 not compared (only the processes' own K)."""
  assert batch_lib.PREFIX_BUCKET == 16
  rng = np.random.default_rng(0)
  base = rng.integers(3, 200, size=(1, 70))
  tokens = np.repeat(base, 3, axis=0)
  tokens[1, 37:] += 1
  assert batch_lib.with_shared_prefix(_rows(tokens)).shared_prefix == 32
  valid = np.ones(tokens.shape, bool)
  valid[2, 20] = False  # same tokens, a hole in one row: its positions shift too
  assert batch_lib.with_shared_prefix(_rows(tokens, valid)).shared_prefix == 16
  assert batch_lib.with_shared_prefix(_rows(tokens[:, :15])).shared_prefix == 0
  same = np.repeat(base, 2, axis=0)
  assert batch_lib.with_shared_prefix(_rows(same)).shared_prefix == 64  # < S = 70

  # Two processes, each with rows agreeing on 40 slots; their rows 0 differ at slot 20.
  other = same.copy()
  other[:, 20:] += 1
  per_process = [_rows(same[:, :]), _rows(other)]
  per_process[0].tokens[1, 40:] += 1
  per_process[1].tokens[1, 40:] += 1

  sent = []  # each process's message: what shares.all_rows gathers
  for b in per_process:
    batch_lib.with_shared_prefix(b, lambda x: sent.append(x) or x)
  gathered = lambda x: np.concatenate(sent)
  ks = [batch_lib.with_shared_prefix(b, gathered).shared_prefix for b in per_process]
  assert ks == [16, 16]
  assert batch_lib.with_shared_prefix(per_process[0]).shared_prefix == 32  # alone: its own


def test_a_batch_with_a_shared_prefix_reads_row_0s_prefix_and_trains_as_the_full_batch():
  """The trainer's passes read `shared_prefix` (`policy.completion_hidden`): the
  completion logprobs and the PPO loss's gradients of a batch whose rows share their
  prompt equal those without it; a batch that claims a prefix its rows do not share
  gets row 0's (so the setting is used, not ignored). Mutation caught: completion_hidden
  not passing the batch's prefix on."""
  from rlpost.models import critic as critic_lib

  params = _random_params(2)
  batch = _text_batch("shared context: ", ["ab", "cde", "f"], T=4)
  assert batch.prompt_len == 17
  shared = batch_lib.with_shared_prefix(batch)
  assert shared.shared_prefix == 16
  fwd = policy.ForwardConfig(CONFIG)
  logp = lambda b: np.asarray(
    objectives.completion_logprobs_jit(params, None, batch_lib.to_device(b), fwd)
  )
  np.testing.assert_allclose(logp(shared), logp(batch), atol=2e-5)
  liar = dataclasses.replace(batch, tokens=batch.tokens.copy())
  liar.tokens[1, 3] += 1  # row 1's prompt now differs at slot 3
  assert not np.allclose(logp(liar)[1], logp(batch)[1], atol=1e-3)
  np.testing.assert_allclose(
    logp(dataclasses.replace(liar, shared_prefix=16))[1], logp(batch)[1], atol=2e-5
  )

  layout = critic_lib.CriticLayout("full", None)
  trainable = {"actor": params, "critic": critic_lib.init_critic(jax.random.key(1), params, layout)}
  loss_fn = objectives.make_ppo_loss_fn(objectives.PPOConfig(beta=0.0), fwd, layout)
  grads = lambda b: jax.jit(jax.grad(lambda t: loss_fn(t, None, b)[0]))(trainable)
  scored = lambda b: batch_lib.to_device(
    dataclasses.replace(b, scores=np.asarray([1.0, -0.5, 0.25], np.float32))
  )
  import chex

  chex.assert_trees_all_close(grads(scored(shared)), grads(scored(batch)), atol=1e-4, rtol=1e-4)
