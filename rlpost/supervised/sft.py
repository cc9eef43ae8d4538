"""Supervised fine-tuning: next-token batches, and a loss that projects only loss tokens.

A batch (host numpy, from `make_batch`; every leaf has rows on axis 0, so the
train step can split it into micro-batches and devices) extends the packing
dict of `rlpost.data.packing` (tokens, loss_mask, positions, segment_ids [N, T])
with:

  targets       [N, T] int32    tokens[:, t + 1] (0 in the last column)
  target_mask   [N, T] bool     loss_mask[:, t + 1]: hidden state t predicts a trained token
  gather_index  [N, K] int32    per micro-batch of m rows, its m*K entries (rows
                                concatenated) are the flat indices into that
                                micro-batch's [m*T] positions where target_mask
                                is True, padded with 0
  gather_valid  [N, K] bool     which gather_index entries are real
  token_divisor [N] float32     (target tokens in the whole batch) / (micro-batches),
                                the same in every row

Only the gathered hidden states go through the [*, V] output projection
(`ops.logprobs.token_logprobs`, chunked, so [B, T, V] logits never exist): with half the
positions masked, the projection, its backward and the embedding gradient cost
half. m*K is the largest per-micro-batch target count rounded up to a multiple
of `gather_bucket` (then to a multiple of m), so shapes, and compilations, stay few.

Loss: each micro-batch contributes sum(-logp over its targets) / token_divisor;
the train step averages micro-batches, which gives exactly the token mean over
the whole batch whatever the micro-batch split, padding or packing.
"""

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.data import cursor as cursor_lib
from rlpost.data import packing
from rlpost.models import decoder
from rlpost.models import policy
from rlpost.ops import masks
from rlpost.supervised import losses as sft_losses

Batch = dict[str, np.ndarray]


def _gather_layout(target_mask: np.ndarray, micro_batch_size: int, bucket: int):
  """(gather_index, gather_valid) [N, K] for micro-batches of `micro_batch_size` rows."""
  rows, seq_len = target_mask.shape
  m = micro_batch_size
  micro = target_mask.reshape(rows // m, m * seq_len)
  most = max(int(micro.sum(axis=1).max()), 1)
  slots = -(-most // bucket) * bucket
  k = -(-slots // m)
  index = np.zeros((rows // m, m * k), np.int32)
  valid = np.zeros((rows // m, m * k), bool)
  for j, flat in enumerate(micro):
    hits = np.flatnonzero(flat)
    index[j, : len(hits)] = hits
    valid[j, : len(hits)] = True
  return index.reshape(rows, k), valid.reshape(rows, k)


def make_batch(
  examples: Sequence[packing.Example],
  *,
  seq_len: int,
  pad_id: int,
  micro_batch_size: int,
  pack: bool = False,
  num_rows: int | None = None,
  gather_bucket: int = 64,
) -> Batch:
  """Next-token training batch (module docstring) from (tokens, loss_mask) examples.

  Args:
    examples: (tokens [n] int, loss_mask [n] bool) pairs, n <= seq_len.
    seq_len: row length T.
    pad_id: token id of padding.
    micro_batch_size: rows per micro-batch; must divide the row count.
    pack: first-fit pack several examples per row (`packing.pack_examples`)
      instead of one example per right-padded row.
    num_rows: rows of a packed batch (None: as many as needed); an unpacked
      batch has one row per example.
    gather_bucket: the per-micro-batch gather size is a multiple of this.
  """
  if pack:
    batch = packing.pack_examples(examples, seq_len, pad_id, num_rows=num_rows)
  else:
    batch = packing.pad_batch(examples, seq_len, pad_id)
  rows = batch["tokens"].shape[0]
  if micro_batch_size < 1 or rows % micro_batch_size:
    raise ValueError(
      f"a batch of {rows} rows is not divisible by micro_batch_size="
      f"{micro_batch_size}; choose a batch size that is a multiple of it"
    )
  targets = np.zeros_like(batch["tokens"])
  targets[:, :-1] = batch["tokens"][:, 1:]
  target_mask = np.zeros_like(batch["loss_mask"])
  target_mask[:, :-1] = batch["loss_mask"][:, 1:]
  index, valid = _gather_layout(target_mask, micro_batch_size, gather_bucket)
  divisor = token_divisor(int(target_mask.sum()), rows // micro_batch_size)
  return {
    **batch,
    "targets": targets,
    "target_mask": target_mask,
    "gather_index": index,
    "gather_valid": valid,
    "token_divisor": np.full((rows,), divisor, np.float32),
  }


def token_divisor(target_tokens: float, num_micro_batches: int) -> float:
  """Each micro-batch's loss divisor: the batch's target tokens over its micro-batches
  (so the micro-batch losses average to the per-token mean of the whole batch)."""
  return max(target_tokens, 1) / num_micro_batches


def next_examples(
  cursor: cursor_lib.Cursor,
  lengths: Sequence[int],
  *,
  rows: int,
  seq_len: int,
  pack: bool,
  shuffle: bool = True,
):
  """Dataset indices of the next batch and the advanced cursor.

  Unpacked: the next `rows` indices. Packed: indices are taken in stream order
  while the next one still fits (first fit, as `pack_examples` places them)
  into `rows` rows of `seq_len`; the first that does not fit stays unconsumed.
  """
  n = len(lengths)
  if not pack:
    indices, cursor = cursor_lib.next_indices(cursor, n, rows, shuffle)
    return [int(i) for i in indices], cursor
  used, taken = [0] * rows, []
  while len(taken) < n:
    (index,), after = cursor_lib.next_indices(cursor, n, 1, shuffle)
    row = next((r for r in range(rows) if used[r] + lengths[index] <= seq_len), None)
    if row is None:
      break
    used[row] += lengths[index]
    taken.append(int(index))
    cursor = after
  return taken, cursor


def target_logprobs(params, adapters, micro_batch: Batch, fwd: policy.ForwardConfig) -> jax.Array:
  """logp [m, T] float32 of `targets` where `target_mask` (0 elsewhere) for m rows.

  `micro_batch` must be exactly one micro-batch: the m rows `make_batch` laid its
  `gather_index` out for (module docstring). Nothing in the shapes tells more rows
  apart, and they give wrong numbers (every gather lands in the first m rows); split
  a whole batch first, as `train.step` does.

  Runs the decoder on all tokens (segment attention mask, per-segment
  positions), then projects only the gathered hidden states onto the
  vocabulary, `fwd.logprob_chunk` tokens at a time.
  """
  mb = micro_batch
  mask = masks.segment_attention_mask(mb["segment_ids"])
  hidden = policy.hidden_states(params, adapters, mb["tokens"], mb["positions"], mask, fwd)
  m, t, d = hidden.shape
  index = mb["gather_index"].reshape(-1)
  valid = mb["gather_valid"].reshape(-1)
  embed = decoder.output_matrix(params)
  h_MxD = jnp.take(hidden.reshape(m * t, d), index, axis=0).astype(embed.dtype)
  targets_M = jnp.take(mb["targets"].reshape(-1), index)
  logp_M = policy.token_logprobs(h_MxD[None], embed, targets_M[None], valid[None], fwd)[0]
  dense = jnp.zeros((m * t,), jnp.float32).at[index].add(jnp.where(valid, logp_M, 0.0))
  return dense.reshape(m, t)


def make_loss_fn(fwd: policy.ForwardConfig):
  """`loss_fn(trainable, frozen, micro_batch) -> (loss, {})` for `train.step.make_train_step`.

  trainable/frozen: see `policy.policy_params`. The loss is this micro-batch's
  share of the batch's token-mean NLL (module docstring).
  """

  def loss_fn(trainable, frozen, micro_batch):
    params, adapters = policy.policy_params(trainable, frozen, fwd)
    logp = target_logprobs(params, adapters, micro_batch, fwd)
    loss, _ = sft_losses.sft_loss(
      logp, micro_batch["target_mask"], num_tokens=micro_batch["token_divisor"][0]
    )
    return loss, {}

  return loss_fn


def make_eval_fn(fwd: policy.ForwardConfig):
  """Jitted `eval_fn(trainable, frozen, batch) -> (nll_sum [], tokens [])` for one micro-batch."""
  fwd = fwd.without_remat()

  @jax.jit
  def eval_fn(trainable, frozen, batch):
    params, adapters = policy.policy_params(trainable, frozen, fwd)
    logp = target_logprobs(params, adapters, batch, fwd)
    mask = batch["target_mask"]
    return -jnp.sum(sft_losses.sequence_logprob(logp, mask)), jnp.sum(mask.astype(jnp.float32))

  return eval_fn


def evaluate(
  eval_fn,
  trainable,
  frozen,
  examples: Sequence[packing.Example],
  *,
  seq_len: int,
  pad_id: int,
  rows: int,
  gather_bucket: int = 64,
) -> dict[str, float]:
  """Token-mean NLL ("eval_loss") and its exp ("eval_perplexity") over `examples`.

  Examples go `rows` at a time (the last batch is padded with copies of the first
  example whose loss mask is cleared, so every call has the same shape).
  """
  filler = (examples[0][0], np.zeros(len(examples[0][0]), bool))
  nll, count = 0.0, 0.0
  for start in range(0, len(examples), rows):
    part = list(examples[start : start + rows])
    part += [filler] * (rows - len(part))
    batch = make_batch(
      part, seq_len=seq_len, pad_id=pad_id, micro_batch_size=rows, gather_bucket=gather_bucket
    )
    s, c = eval_fn(trainable, frozen, batch)
    nll, count = nll + float(s), count + float(c)
  loss = nll / max(count, 1.0)
  return {"eval_loss": loss, "eval_perplexity": float(np.exp(loss))}


def batch_stats(batch: Batch) -> dict[str, float]:
  """Host-side facts of a batch: padding efficiency, examples and target tokens."""
  seg = batch["segment_ids"]
  examples = int(sum(len(np.unique(r[r > 0])) for r in seg))
  return {
    "padding_efficiency": packing.padding_efficiency(batch),
    "examples": examples,
    "target_tokens": int(batch["target_mask"].sum()),
  }


def synthetic_records(num_records: int, seed: int) -> list[dict[str, str]]:
  """Tiny SFT set for the byte-level test model: prompt "a+b=", completion the sum."""
  rng = np.random.default_rng(seed)
  pairs = rng.integers(0, 50, size=(num_records, 2))
  return [{"prompt": f"{a}+{b}=", "completion": str(int(a + b))} for a, b in pairs]
