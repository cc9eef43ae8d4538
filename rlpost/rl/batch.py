"""The typed RL batch every RL family trains on, and building it from sampler output.

One row per sampled sequence (N rows; GRPO: N = B * G, prompt-major). The
sequence is S = P + T slots: a left-padded context of P slots, then T slots of
completion. Every loss, KL, entropy, whitening statistic and denominator uses
`loss_mask`, never `valid`: tokens that are valid context but must receive no
gradient (tool outputs, environment text inside a multi-turn completion) are
`valid` with `loss_mask = 0`.

Optional fields are None until a step fills them (`dataclasses.replace`); the
train step's compiled program depends on which are set, never on dict keys.
Host code holds NumPy arrays; `to_device` makes them jax arrays.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlpost import sampling


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RLBatch:
  """Rows of sampled sequences and what the losses need about them.

  tokens         [N, S] int32    left-padded context, then the completion slots
  positions      [N, S] int32    per-row RoPE positions (padding slots: 0)
  valid          [N, S] bool     real tokens: attention may read them
  loss_mask      [N, T] float32  1 on completion tokens that receive gradient
  sampler_logp   [N, T] float32  logprobs the sampler reported (0 off loss_mask)
  advantages     [N] or [N, T] float32   sequence- or token-level advantages
  scores         [N] or [N, T] float32  sequence rewards, or per-token rewards (per-turn
                                 rewards on each turn's last token); PPO's loss runs GAE
                                 itself from them when there are no values
  old_logp       [N, T] float32  logprobs of the policy that sampled (num_iterations > 1)
  ref_logp       [N, T] float32  reference-policy logprobs (KL term)
  values         [N, T] float32  critic values at sampling time (PPO)
  returns        [N, T] float32  value targets (PPO)
  token_rewards  [N, T] float32  per-token rewards before advantage estimation
  turn_ids       [N, T] int32    which turn of a multi-turn episode a slot belongs to
  policy_version [N] int32       optimizer step of the weights that sampled the row
  loss_slots     [N, C] int32    the completion slots that may be on loss_mask, ascending,
                                 -1 after the row's last (`with_loss_slots`); when set,
                                 logprobs project only these C <= T slots onto the
                                 vocabulary (a multi-turn row samples a few tokens per
                                 turn among many observation slots)
  shared_prefix  int (static)    K: every row's first K slots hold row 0's tokens,
                                 positions and `valid` (`with_shared_prefix`); the
                                 trainer's passes compute them once (`decoder.forward`)
  """

  tokens: jax.Array | np.ndarray
  positions: jax.Array | np.ndarray
  valid: jax.Array | np.ndarray
  loss_mask: jax.Array | np.ndarray
  sampler_logp: jax.Array | np.ndarray
  advantages: jax.Array | np.ndarray | None = None
  scores: jax.Array | np.ndarray | None = None
  old_logp: jax.Array | np.ndarray | None = None
  ref_logp: jax.Array | np.ndarray | None = None
  values: jax.Array | np.ndarray | None = None
  returns: jax.Array | np.ndarray | None = None
  token_rewards: jax.Array | np.ndarray | None = None
  turn_ids: jax.Array | np.ndarray | None = None
  policy_version: jax.Array | np.ndarray | None = None
  loss_slots: jax.Array | np.ndarray | None = None
  shared_prefix: int = dataclasses.field(default=0, metadata={"static": True})

  @property
  def completion_len(self) -> int:
    """T: completion slots (the width of `loss_mask`)."""
    return self.loss_mask.shape[1]

  @property
  def prompt_len(self) -> int:
    """P: context slots before the completion."""
    return self.tokens.shape[1] - self.loss_mask.shape[1]

  def check_shapes(self) -> None:
    """Asserts the documented shapes (call at module boundaries; free under jit)."""
    n, s = self.tokens.shape
    t = self.completion_len
    chex.assert_shape([self.positions, self.valid], (n, s))
    chex.assert_shape([self.loss_mask, self.sampler_logp], (n, t))
    for name in ("old_logp", "ref_logp", "values", "returns", "token_rewards", "turn_ids"):
      if getattr(self, name) is not None:
        chex.assert_shape(getattr(self, name), (n, t))
    if self.advantages is not None:
      chex.assert_shape(self.advantages, (n,) if self.advantages.ndim == 1 else (n, t))
    if self.scores is not None:
      chex.assert_shape(self.scores, (n,) if self.scores.ndim == 1 else (n, t))
    if self.policy_version is not None:
      chex.assert_shape(self.policy_version, (n,))
    if self.loss_slots is not None:
      chex.assert_shape(self.loss_slots, (n, None))
      if self.loss_slots.shape[1] > t:
        raise ValueError(f"loss_slots is {self.loss_slots.shape[1]} wide, above T={t}")
    if not 0 <= self.shared_prefix < s:
      raise ValueError(f"shared_prefix={self.shared_prefix} is outside [0, S={s})")


# `with_shared_prefix` rounds the prefix down to a multiple of this many slots (a run's
# batches then compile a few programs, not one per prefix length); shorter prefixes: 0.
PREFIX_BUCKET = 16


def with_shared_prefix(batch: RLBatch, gather=None) -> RLBatch:
  """The batch with the context tokens every row starts with moved to its first slots,
  and `shared_prefix` set to how many (host side, NumPy).

  K: the longest run of leading context tokens (with their positions) that every row's
  context opens with, below each row's context length (slot P - 1, which predicts the
  first completion token, stays the row's last context token), rounded down to
  PREFIX_BUCKET. E.g. the instruction every FrozenLake prompt starts with, whatever
  each prompt's length. Each row's context slots are reordered: those K tokens, then
  its padding, then the rest of its context. Positions and `valid` move with the tokens
  and attention reads slots in order, so every pass computes what it did before.

  gather: None with one process; else `rlpost.train.shares.all_rows`, so that every
  process sampling one batch sets the same K (one exchange of each process's K and row
  0's leading context tokens). Without it K is this process's alone.
  """
  P = batch.prompt_len
  tokens, positions = np.asarray(batch.tokens), np.asarray(batch.positions)
  valid = np.asarray(batch.valid)
  contexts = [
    np.stack([t[:P][ok[:P]], q[:P][ok[:P]]]) for t, q, ok in zip(tokens, positions, valid)
  ]
  shortest = min(c.shape[1] for c in contexts)
  k = min(_common_prefix(contexts), shortest - 1)
  if gather is not None:  # every process's K and row 0's context, in one exchange
    lead = np.zeros((2, P), np.int64)
    lead[:, : contexts[0].shape[1]] = contexts[0]
    shared_PxR = gather(np.concatenate([[k], lead.reshape(-1)])[None])
    firsts = list(shared_PxR[:, 1:].reshape(-1, 2, P)[:, :, : max(k, 0)])
    k = min(int(shared_PxR[:, 0].min()), _common_prefix(firsts))
  k = max(k, 0) // PREFIX_BUCKET * PREFIX_BUCKET
  if k == 0:
    return dataclasses.replace(batch, shared_prefix=0)
  order_NxP = np.stack([_prefix_first(ok[:P], k) for ok in valid])
  moved = lambda x: np.concatenate([np.take_along_axis(x[:, :P], order_NxP, 1), x[:, P:]], 1)
  return dataclasses.replace(
    batch,
    tokens=moved(tokens),
    positions=moved(positions),
    valid=moved(valid),
    shared_prefix=k,
  )


def _common_prefix(rows) -> int:
  """How many leading columns every [F, L_i] array agrees on."""
  n = min(r.shape[1] for r in rows)
  same = np.all(np.stack([r[:, :n] for r in rows]) == rows[0][None, :, :n], axis=(0, 1))
  return int(n if same.all() else np.argmin(same))


def _prefix_first(valid_P: np.ndarray, k: int) -> np.ndarray:
  """A context's slot order [P]: its first k valid slots, its invalid ones, the rest."""
  slots = np.flatnonzero(valid_P)
  return np.concatenate([slots[:k], np.flatnonzero(~valid_P), slots[k:]])


def with_loss_slots(batch: RLBatch, capacity: int) -> RLBatch:
  """The batch with `loss_slots` [N, capacity]: each row's loss_mask slots, ascending.

  Host side (NumPy). `capacity` is a bound known before sampling that every row
  respects (e.g. turns x tokens per turn), so every batch of a run, on every process,
  has the same shapes. At or above T the batch is returned unchanged (nothing to save).

  Raises:
    ValueError: a row has more loss tokens than `capacity` (naming the row).
  """
  T = batch.completion_len
  if capacity >= T:
    return batch
  mask_NxT = np.asarray(batch.loss_mask) > 0
  counts_N = mask_NxT.sum(axis=1)
  for row in np.flatnonzero(counts_N > capacity)[:1]:
    raise ValueError(
      f"row {row} has {counts_N[row]} loss tokens, above the loss_slots capacity "
      f"{capacity}; the capacity must bound every row's sampled tokens"
    )
  order_NxT = np.argsort(~mask_NxT, axis=1, kind="stable")[:, :capacity]
  slots_NxC = np.where(np.take_along_axis(mask_NxT, order_NxT, 1), order_NxT, -1)
  return dataclasses.replace(batch, loss_slots=slots_NxC.astype(np.int32))


def to_device(batch: RLBatch) -> RLBatch:
  return jax.tree.map(jnp.asarray, batch)


def select_rows(batch: RLBatch, rows) -> RLBatch:
  """The rows `rows` (a slice or index array) of every set field."""
  return jax.tree.map(lambda x: x[rows], batch)


def from_samples(tokens_BxP, lengths_B, out: sampling.SampleOutput, num_samples: int) -> RLBatch:
  """Joins left-padded prompts (repeated per sample) and the sampled completions.

  Every generated token (the stop token included) is valid and in the loss mask.
  """
  prompts_NxP = np.repeat(np.asarray(tokens_BxP), num_samples, axis=0)
  lengths_N = np.repeat(np.asarray(lengths_B), num_samples)
  _, P = prompts_NxP.shape
  T = out.tokens.shape[1]
  mask_NxT = np.asarray(out.mask)
  prompt_valid = np.arange(P)[None, :] >= (P - lengths_N)[:, None]
  prompt_pos = np.maximum(np.arange(P)[None, :] - (P - lengths_N)[:, None], 0)
  completion_pos = lengths_N[:, None] + np.arange(T)[None, :]
  return RLBatch(
    tokens=np.concatenate([prompts_NxP, np.asarray(out.tokens)], 1).astype(np.int32),
    positions=np.concatenate([prompt_pos, completion_pos], 1).astype(np.int32),
    valid=np.concatenate([prompt_valid, mask_NxT], 1),
    loss_mask=mask_NxT.astype(np.float32),
    sampler_logp=np.asarray(out.logprobs, np.float32),
  )


def _left_pad(batch: RLBatch, prompt_len: int, pad_id: int) -> RLBatch:
  """Re-pads the context part on the left to `prompt_len` slots."""
  extra = prompt_len - batch.prompt_len
  if extra == 0:
    return batch
  pad = lambda x, v: np.pad(x, ((0, 0), (extra, 0)), constant_values=v)
  return dataclasses.replace(
    batch,
    tokens=pad(batch.tokens, pad_id),
    positions=pad(batch.positions, 0),
    valid=pad(batch.valid, False),
  )


def pad_slots(x_NxT: np.ndarray, width: int, value=0) -> np.ndarray:
  """`x_NxT` with empty completion slots (`value`) appended up to `width` columns."""
  return np.pad(x_NxT, ((0, 0), (0, width - x_NxT.shape[1])), constant_values=value)


def with_width(batch: RLBatch, width: int, pad_id: int) -> RLBatch:
  """The batch with empty completion slots appended up to `width` (>= T): pad tokens,
  not valid, position 0, off the loss mask, turn id -1, every per-slot value 0. Nothing
  any loss or pass computes changes (they read `valid` and `loss_mask`)."""
  if width == batch.completion_len:
    return batch
  per_slot = {
    name: pad_slots(x, width, -1 if name == "turn_ids" else 0)
    for name in ("loss_mask", "sampler_logp", "advantages", "scores", "old_logp", "ref_logp")
    + ("values", "returns", "token_rewards", "turn_ids")
    if (x := getattr(batch, name)) is not None and x.ndim == 2
  }
  S = batch.prompt_len + width
  return dataclasses.replace(
    batch,
    tokens=pad_slots(batch.tokens, S, pad_id),
    positions=pad_slots(batch.positions, S, 0),
    valid=pad_slots(batch.valid, S, False),
    **per_slot,
  )


def concatenate(batches: list[RLBatch], pad_id: int) -> RLBatch:
  """Row-concatenates batches whose context lengths (left re-padding) and completion
  widths (empty slots appended) may differ."""
  prompt_len = max(b.prompt_len for b in batches)
  width = max(b.completion_len for b in batches)
  batches = [with_width(_left_pad(b, prompt_len, pad_id), width, pad_id) for b in batches]
  return jax.tree.map(lambda *xs: np.concatenate(xs), *batches)


def stop_length(tokens: list[int], tokenizer, stop_strings) -> int | None:
  """Fewest leading tokens whose decoded text contains a stop string (None: never).

  Decodes whole prefixes (decoding token by token would split multi-byte
  characters and drop SentencePiece's word-initial spaces); containment only
  grows with the prefix, so a binary search needs O(log n) decodes.
  """
  hit = lambda n: any(s in tokenizer.decode(tokens[:n]) for s in stop_strings)
  if not tokens or not hit(len(tokens)):
    return None
  lo, hi = 1, len(tokens)  # hit(hi) holds; find the smallest such n
  while lo < hi:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if hit(mid) else (mid + 1, hi)
  return lo


def truncate_at_stop_strings(batch: RLBatch, tokenizer, stop_strings) -> RLBatch:
  """Ends each completion at the token that completes any of `stop_strings` (host side).

  The sampler stops on token ids only; multi-token stops (e.g. a few-shot
  prompt's "</answer>") are applied here by shrinking `loss_mask` and `valid`,
  exactly as if generation had stopped there: the tokens after the stop become
  `pad_id` and their sampler logprobs 0.
  """
  if not stop_strings:
    return batch
  mask = batch.loss_mask.copy()
  P = batch.prompt_len
  for row in range(mask.shape[0]):
    n = int(mask[row].sum())
    end = stop_length([int(t) for t in batch.tokens[row, P : P + n]], tokenizer, stop_strings)
    if end is not None:
      mask[row, end:] = 0
  valid = batch.valid.copy()
  valid[:, P:] = mask > 0
  tokens = batch.tokens.copy()
  tokens[:, P:] = np.where(mask > 0, tokens[:, P:], tokenizer.pad_id)
  return dataclasses.replace(
    batch,
    tokens=tokens,
    loss_mask=mask,
    valid=valid,
    sampler_logp=np.where(mask > 0, batch.sampler_logp, 0.0).astype(np.float32),
  )


def completion_texts(batch: RLBatch, tokenizer) -> list[str]:
  """Decoded completion slots (valid tokens only: sampled text and any tool outputs)."""
  P = batch.prompt_len
  return [
    tokenizer.decode([int(t) for t, ok in zip(row, ok_row) if ok])
    for row, ok_row in zip(batch.tokens[:, P:], batch.valid[:, P:])
  ]
