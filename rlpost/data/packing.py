"""Batches of token examples: right padding, or packing several examples per row.

An example is `(tokens [n] int, loss_mask [n] bool)`; `loss_mask[t]` is True
when `tokens[t]` is a training target (predicted from the tokens before it in
its own example). A batch is a dict of numpy arrays:

  tokens       [B, T] int32   pad_id where there is no example
  loss_mask    [B, T] bool    False on padding and on each example's first token
  positions    [B, T] int32   0, 1, 2, ... within each example; 0 on padding
  segment_ids  [B, T] int32   1, 2, 3, ... per example within a row; 0 on padding

The first token of every example has nothing before it in its segment, so its
loss_mask is forced False. For next-token training shift by one: targets =
tokens[:, 1:] with mask loss_mask[:, 1:]; since a segment's first token is
never a target, no target is predicted across a segment boundary. Attend
with `segment_attention_mask(segment_ids)`.

Examples longer than `seq_len` raise ValueError (truncate when tokenizing,
e.g. `tokenize_sft(..., max_len=seq_len)`).
"""

from typing import Sequence

import numpy as np
from rlpost.ops.masks import segment_attention_mask  # noqa: F401  re-exported: the mask packed rows need

Example = tuple[Sequence[int], Sequence[bool]]
Batch = dict[str, np.ndarray]


def _as_arrays(examples: Sequence[Example], seq_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
  out = []
  for i, (tokens, mask) in enumerate(examples):
    tokens, mask = np.asarray(tokens, np.int32), np.asarray(mask, bool)
    if tokens.ndim != 1 or tokens.shape != mask.shape:
      raise ValueError(
        f"example {i}: tokens {tokens.shape} and loss_mask {mask.shape} must be 1-D of equal length"
      )
    if not 1 <= len(tokens) <= seq_len:
      raise ValueError(
        f"example {i} has {len(tokens)} tokens; need 1 <= length <= "
        f"seq_len={seq_len}: raise seq_len or truncate it when tokenizing "
        "(max_len=seq_len)"
      )
    out.append((tokens, mask))
  return out


def _empty(rows: int, seq_len: int, pad_id: int) -> Batch:
  return {
    "tokens": np.full((rows, seq_len), pad_id, np.int32),
    "loss_mask": np.zeros((rows, seq_len), bool),
    "positions": np.zeros((rows, seq_len), np.int32),
    "segment_ids": np.zeros((rows, seq_len), np.int32),
  }


def _place(batch: Batch, row: int, start: int, segment: int, example) -> None:
  tokens, mask = example
  end = start + len(tokens)
  batch["tokens"][row, start:end] = tokens
  batch["loss_mask"][row, start:end] = mask
  batch["loss_mask"][row, start] = False
  batch["positions"][row, start:end] = np.arange(len(tokens))
  batch["segment_ids"][row, start:end] = segment


def pad_batch(examples: Sequence[Example], seq_len: int, pad_id: int) -> Batch:
  """One example per row, right-padded to `seq_len` (module docstring for the dict)."""
  arrays = _as_arrays(examples, seq_len)
  batch = _empty(len(arrays), seq_len, pad_id)
  for row, example in enumerate(arrays):
    _place(batch, row, 0, 1, example)
  return batch


def pack_examples(
  examples: Sequence[Example], seq_len: int, pad_id: int, *, num_rows: int | None = None
) -> Batch:
  """Packs examples into rows of `seq_len` by first fit, in order.

  Each example goes into the first row with room for it (a new row when none
  has); within a row examples keep their order and get segment ids 1, 2, ...

  Args:
    examples: (tokens, loss_mask) pairs, each of length 1..seq_len.
    seq_len: row length T.
    pad_id: token id for unused slots.
    num_rows: None for as many rows as needed; an int for exactly that many
      rows (fixed shapes under jit), raising ValueError if they do not fit.

  Returns:
    The batch dict (module docstring), [B, T] arrays.
  """
  arrays = _as_arrays(examples, seq_len)
  used: list[int] = []
  placement = []
  for i, (tokens, _) in enumerate(arrays):
    row = next((r for r, n in enumerate(used) if n + len(tokens) <= seq_len), len(used))
    if row == len(used):
      used.append(0)
    placement.append((row, used[row]))
    used[row] += len(tokens)
  rows = len(used) if num_rows is None else num_rows
  if len(used) > rows:
    raise ValueError(
      f"{len(arrays)} examples ({sum(used)} tokens) need {len(used)} rows of "
      f"seq_len={seq_len}, more than num_rows={num_rows}; pass fewer examples "
      "or raise num_rows"
    )
  batch = _empty(rows, seq_len, pad_id)
  segments = [0] * len(used)
  for example, (row, start) in zip(arrays, placement):
    segments[row] += 1
    _place(batch, row, start, segments[row], example)
  return batch


def padding_efficiency(batch: Batch) -> float:
  """Fraction of slots holding real (non-pad) tokens."""
  return float(np.mean(np.asarray(batch["segment_ids"]) != 0))
