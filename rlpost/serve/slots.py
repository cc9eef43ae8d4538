"""The device side of continuous batching: a fixed set of row slots over one KV cache.

A pool holds R row slots (R a power of two) and one KV cache `[L, R, K, S, hd]`
(`decoder.init_cache`). Every decode step writes column `w = cache["index"]` of every
row (the write index is shared); what a row attends is its own `valid` mask `[R, S]`
and its positions are its own (`next_pos`), so rows of different lengths, admitted at
different steps, decode side by side. Per slot (`Slots`): the pending token (sampled,
not yet run through the model: the last token of a request never is), how many tokens
its request has emitted (`count`: token t of a row draws from
`fold_in(fold_in(key(0), row_id), t)`, exactly as `sampling.decode_loop`), its budget,
its random identity and whether it is done.

  admit(...)       prefill new rows' prompts (or a session's new suffix after the
                   history its slot keeps) into chosen slots, ending at a new write index;
                   samples each row's token 0
  step_chunk(...)  `steps` decode steps of the live rows (gathered into a bucket of B
                   rows, decoded in one jitted while loop, written back; a bucket of
                   every row is decoded in place)
  compact(...)     packs each row's history to the left and resizes S (stable order)

Column order within a row is its token order; the host (`pool.py`) keeps each row's
last column so an admission never writes over a history it keeps.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rlpost import sampling
from rlpost.models import decoder, quant


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Slots:
  """cache: k, v [L, R, K, S, hd], pos [R, S] int32, index [] int32 (w, shared);
  valid [R, S] bool; next_pos, token, count, budget, row_id [R] int32; done [R] bool."""

  cache: dict
  valid: jax.Array
  next_pos: jax.Array
  token: jax.Array
  count: jax.Array
  budget: jax.Array
  row_id: jax.Array
  done: jax.Array


def init(model_config: decoder.Config, rows: int, size: int, dtype) -> Slots:
  """An empty pool of `rows` slots and `size` columns (every slot done)."""
  zeros = lambda: jnp.zeros((rows,), jnp.int32)  # noqa: E731  (distinct buffers: donated)
  return Slots(
    cache=decoder.init_cache(model_config, rows, size, dtype),
    valid=jnp.zeros((rows, size), bool),
    next_pos=zeros(),
    token=zeros(),
    count=zeros(),
    budget=zeros(),
    row_id=zeros(),
    done=jnp.ones((rows,), bool),
  )


def _step_keys(row_id_B, count_B):
  """Token `count_B[r]` of row r: fold_in(fold_in(key(0), row_id), count)."""
  keys = sampling.row_keys(jax.random.key(0), row_id_B, row_id_B.shape[0])
  return jax.vmap(jax.random.fold_in)(keys, count_B)


@functools.partial(
  jax.jit, static_argnames=("model_config", "config", "steps"), donate_argnames=("slots",)
)
def step_chunk(
  params, slots: Slots, rows_B, *, model_config, config: sampling.SamplingConfig, steps: int
):
  """Up to `steps` decode steps of the slots `rows_B` ([B] int32, distinct; B < R: the
  live rows and done ones to fill a bucket), fewer when all of them are done. Only these
  rows are computed (gathered, decoded, written back). rows_B None: every slot, decoded
  in place (B = R, row b is slot b: no copy of the cache out and back).

  Returns (slots, tokens [B, steps] int32, logprobs [B, steps] float32, count [B] int32,
  done [B] bool); a row's tokens of this chunk are its first `count_after - count_before`."""
  params = decoder.decode_layout(params)
  if rows_B is None:
    slots, tokens, logprobs = _decode(params, slots, model_config, config, steps)
    return slots, tokens, logprobs, slots.count, slots.done
  c = slots.cache
  sub = Slots(
    cache={
      "k": c["k"][:, rows_B],
      "v": c["v"][:, rows_B],
      "pos": c["pos"][rows_B],
      "index": c["index"],
    },
    **{f: getattr(slots, f)[rows_B] for f in _ROW_FIELDS},
  )
  sub, tokens, logprobs = _decode(params, sub, model_config, config, steps)
  cache = {
    "k": c["k"].at[:, rows_B].set(sub.cache["k"]),
    "v": c["v"].at[:, rows_B].set(sub.cache["v"]),
    "pos": c["pos"].at[rows_B].set(sub.cache["pos"]),
    "index": sub.cache["index"],
  }
  rows = {f: getattr(slots, f).at[rows_B].set(getattr(sub, f)) for f in _ROW_FIELDS}
  return Slots(cache=cache, **rows), tokens, logprobs, sub.count, sub.done


_ROW_FIELDS = ("valid", "next_pos", "token", "count", "budget", "row_id", "done")


def _decode(params, slots: Slots, model_config, config, steps: int):
  """The decode loop of `step_chunk` over every row of `slots`."""
  R, S = slots.valid.shape
  col = jnp.arange(S)[None, :]
  stop_ids = jnp.asarray(config.stop_ids or (-1,), jnp.int32)

  def body(carry):
    t, s, tokens, logprobs = carry
    live = ~s.done
    here = col == s.cache["index"]
    hidden, cache = decoder.forward(
      params,
      s.token[:, None],
      s.next_pos[:, None],
      (s.valid | here)[:, None, :],
      s.cache,
      config=model_config,
      return_hidden=True,
    )
    logits = decoder.vocab_major_logits(params, hidden[:, 0])
    token, logp = sampling.select_tokens(_step_keys(s.row_id, s.count), logits, config)
    count = s.count + live
    done = s.done | (live & (jnp.isin(token, stop_ids) | (count >= s.budget)))
    s = dataclasses.replace(
      s,
      cache=cache,
      valid=s.valid | (here & live[:, None]),
      next_pos=s.next_pos + live,
      token=jnp.where(live, token, s.token),
      count=count,
      done=done,
    )
    tokens = tokens.at[:, t].set(jnp.where(live, token, config.pad_id))
    logprobs = logprobs.at[:, t].set(jnp.where(live, logp, 0.0))
    return t + 1, s, tokens, logprobs

  carry = (
    jnp.zeros((), jnp.int32),
    slots,
    jnp.full((R, steps), config.pad_id, jnp.int32),
    jnp.zeros((R, steps), jnp.float32),
  )
  cond = lambda c: (c[0] < steps) & ~jnp.all(c[1].done)  # noqa: E731
  _, slots, tokens, logprobs = jax.lax.while_loop(cond, body, carry)
  return slots, tokens, logprobs


@functools.partial(
  jax.jit, static_argnames=("model_config", "config", "fresh"), donate_argnames=("slots",)
)
def admit(
  params,
  slots: Slots,
  rows_A,
  tokens_AxM,
  lengths_A,
  keep_A,
  row_id_A,
  budget_A,
  end,
  *,
  model_config,
  config: sampling.SamplingConfig,
  fresh: bool,
):
  """Prefills A rows into slots `rows_A` and samples their token 0.

  Args:
    rows_A: [A] int32 slot indices (a repeated row repeats all of its inputs).
    tokens_AxM: [A, M] int32 new tokens, left-padded; lengths_A [A] int32 their counts.
    keep_A: [A] int32, how many history tokens of the slot stay (0: a fresh row); they
      are its first keep_A valid columns, positions 0 .. keep_A - 1.
    row_id_A, budget_A: [A] int32, each row's random identity and token budget (>= 1).
    end: [] int32, the new write index; the new tokens fill columns [end - M, end), after
      every kept history (the host's rule), and every row's next step writes at `end`.
    fresh: every keep_A is 0: the prompts are prefilled as `sampling.prefill` does (an
      M-column cache: the cost does not grow with the pool's columns), then copied in.

  Returns (slots, token0 [A] int32, logprob0 [A] float32)."""
  params = decoder.decode_layout(params)
  col = jnp.arange(slots.valid.shape[1])[None, :]
  kept = slots.valid[rows_A]
  kept = kept & (jnp.cumsum(kept, axis=1) <= keep_A[:, None])
  prefill = _prefill_fresh if fresh else _prefill_after
  logits, sub = prefill(
    params, slots.cache, rows_A, tokens_AxM, lengths_A, keep_A, kept, end, model_config
  )
  token, logp = sampling.select_tokens(
    _step_keys(row_id_A, jnp.zeros_like(row_id_A)), logits, config
  )
  stop_ids = jnp.asarray(config.stop_ids or (-1,), jnp.int32)
  c = slots.cache
  cache = {
    "k": c["k"].at[:, rows_A].set(sub["k"]),
    "v": c["v"].at[:, rows_A].set(sub["v"]),
    "pos": c["pos"].at[rows_A].set(sub["pos"]),
    "index": jnp.asarray(end, jnp.int32),
  }
  new_valid = kept | ((col >= (end - lengths_A)[:, None]) & (col < end))
  slots = Slots(
    cache=cache,
    valid=slots.valid.at[rows_A].set(new_valid),
    next_pos=slots.next_pos.at[rows_A].set(keep_A + lengths_A),
    token=slots.token.at[rows_A].set(token),
    count=slots.count.at[rows_A].set(1),
    budget=slots.budget.at[rows_A].set(budget_A),
    row_id=slots.row_id.at[rows_A].set(row_id_A),
    done=slots.done.at[rows_A].set(jnp.isin(token, stop_ids) | (budget_A <= 1)),
  )
  return slots, token, logp


def _prefill_fresh(params, cache, rows_A, tokens_AxM, lengths_A, keep_A, kept, end, config):
  """New prompts alone (`sampling.prefill`), their k/v copied to columns [end - M, end)
  of the slots' rows. Returns (last logits [V, A], the rows' cache {k, v, pos})."""
  del keep_A, kept
  M = tokens_AxM.shape[1]
  logits, block = sampling.prefill(params, tokens_AxM, lengths_A, model_config=config, cache_size=M)
  at = (0, 0, 0, end - M, 0)  # [L, rows, K, slots, H]
  return logits, {
    "k": jax.lax.dynamic_update_slice(cache["k"][:, rows_A], block["k"], at),
    "v": jax.lax.dynamic_update_slice(cache["v"][:, rows_A], block["v"], at),
    "pos": jax.lax.dynamic_update_slice(cache["pos"][rows_A], block["pos"], (0, end - M)),
  }


def _prefill_after(params, cache, rows_A, tokens_AxM, lengths_A, keep_A, kept, end, config):
  """New tokens after each row's kept history (attending it and each other, causally),
  written at columns [end - M, end). Returns (last logits [V, A], the rows' cache)."""
  params = quant.float_view(params)
  M = tokens_AxM.shape[1]
  col = jnp.arange(kept.shape[1])[None, :]
  pad_A = M - lengths_A
  first = end - M + pad_A  # the first new token's column
  query_col = (end - M + jnp.arange(M))[None, :]  # [1, M]
  mine = (col[:, None, :] >= first[:, None, None]) & (col[:, None, :] <= query_col[..., None])
  positions = jnp.maximum(keep_A[:, None] + jnp.arange(M)[None, :] - pad_A[:, None], 0)
  sub = {"k": cache["k"][:, rows_A], "v": cache["v"][:, rows_A], "pos": cache["pos"][rows_A]}
  hidden, sub = decoder.forward(
    params,
    tokens_AxM,
    positions,
    kept[:, None, :] | mine,
    {**sub, "index": end - M},
    config=config,
    return_hidden=True,
  )
  return decoder.vocab_major_logits(params, hidden[:, -1]), sub


@functools.partial(jax.jit, static_argnames=("size",))
def compact(slots: Slots, *, size: int) -> Slots:
  """Moves each row's valid columns, in order, to its first columns and resizes the pool
  to `size` columns (at least every row's history); the write index becomes the longest
  history."""
  S = slots.valid.shape[1]
  c = slots.cache
  valid, pos, k, v = slots.valid, c["pos"], c["k"], c["v"]
  if size > S:
    grow = size - S
    valid = jnp.pad(valid, ((0, 0), (0, grow)))
    pos = jnp.pad(pos, ((0, 0), (0, grow)), constant_values=-1)
    k = jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, grow), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, grow), (0, 0)))
  order = jnp.argsort(~valid, axis=1, stable=True)[:, :size]  # [R, size]
  take = lambda x: jnp.take_along_axis(x, order[None, :, None, :, None], axis=decoder.SLOT_AXIS)
  valid = jnp.take_along_axis(valid, order, axis=1)
  cache = {
    "k": take(k),
    "v": take(v),
    "pos": jnp.take_along_axis(pos, order, axis=1),
    "index": valid.sum(axis=1).max().astype(jnp.int32),
  }
  return dataclasses.replace(slots, cache=cache, valid=valid)


def cancel(slots: Slots, rows: list[int]) -> Slots:
  """The slots `rows` marked done (their next steps emit nothing)."""
  return dataclasses.replace(slots, done=slots.done.at[jnp.asarray(rows, jnp.int32)].set(True))
