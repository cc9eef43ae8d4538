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
