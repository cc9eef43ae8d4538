"""Later turns continue the KV cache: a turn prefills only its new tokens, then samples on.

A multi-turn episode's context grows each turn by [the tokens kept of the last sample |
the observation]. `start` is `sampling.sample` that also returns its cache; `extend`
appends to that cache and samples the next turn, so no turn prefills the history again.
The result equals sampling the whole history as one left-padded prompt up to float
rounding: the same keys, values and positions, attended in another slot order (the same
key and row ids give the same tokens; test_sampling checks both, greedy and sampled).

Slots of one row in the cache (S slots, `Continuation.valid_BxS` marks its history):

  turn 0 (`start`):  [pad | prompt | sampled ...]                    S = P + N
  `extend`:          [pad | history | last kept token? + new | sampled ...]

`extend` first moves every row's history (prompt, kept tokens, observations) to end at
one slot, the longest row's history length, then writes the new tokens (left-padded to M)
and decodes N more. The last token a call emitted never went through the model (no later
token of that call read its keys), so when it is kept it is prefilled with the new ones.
Each call's cache has just the slots it needs (rounded up to `SLOT_BUCKET`; a decode
step reads every slot, so slack costs time), or a fixed count (`cache_size`) for shapes
that must not change between calls.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlpost import sampling
from rlpost.models import decoder
from rlpost.models import quant

SLOT_BUCKET = 32  # cache sizes of `extend` are multiples of this (one compilation each)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Continuation:
  """What a later turn needs to go on from a sample without prefilling its history again.

  cache: the KV cache after the last decode step (`decoder.init_cache`: k, v
    [L, rows, K, S, hd], pos [rows, S], index []).
  valid_BxS: bool [rows, S], the history slots a later token may attend (prompt,
    observations, the tokens kept of earlier turns; not the last call's tokens).
  gen_start: [] int32, the slot of the last call's first sampled token.
  gen_pos_B: [rows] int32, that token's position.
  tokens_BxN: int32, the last call's sampled tokens.
  written: [] int32, how many of them are in the cache (the same for every row).
  """

  cache: dict
  valid_BxS: jax.Array
  gen_start: jax.Array
  gen_pos_B: jax.Array
  tokens_BxN: jax.Array
  written: jax.Array


@functools.partial(jax.jit, static_argnames=("model_config", "config", "num_samples", "keep_cache"))
def start(
  params,
  tokens_BxP,
  lengths_B,
  key,
  max_new_tokens=None,
  row_ids=None,
  *,
  model_config: decoder.Config,
  config: sampling.SamplingConfig,
  num_samples: int = 1,
  keep_cache: bool = True,
) -> tuple[sampling.SampleOutput, Continuation | None]:
  """`sampling.sample` (same arguments, the same SampleOutput bitwise), also returning the
  Continuation a later turn extends. Returns (SampleOutput [B * G rows], Continuation);
  with `keep_cache=False` (no later turn) the plain sampler's program runs and the
  Continuation is None."""
  args = (params, tokens_BxP, lengths_B, key, max_new_tokens, row_ids)
  settings = {"model_config": model_config, "config": config, "num_samples": num_samples}
  if not keep_cache:
    return sampling.sample(*args, **settings), None
  out, cache, valid, lengths, written = sampling.sample_with_cache(*args, **settings)
  P = tokens_BxP.shape[1]
  return out, Continuation(cache, valid, jnp.asarray(P, jnp.int32), lengths, out.tokens, written)


def slots_needed(state: Continuation, kept_B, new_width: int, max_new_tokens: int) -> int:
  """The cache slots `extend` needs: the longest history after `kept_B` more tokens, the
  new tokens (`new_width` + 1: a kept last token goes with them) and max_new_tokens - 1
  sampled ones (the last token a call emits is not written)."""
  history = np.asarray(state.valid_BxS).sum(axis=1) + np.minimum(
    np.asarray(kept_B), int(state.written)
  )
  return int(history.max(initial=0)) + new_width + max_new_tokens


def extend(
  params,
  state: Continuation,
  kept_B,
  new_BxM,
  new_lengths_B,
  key,
  max_new_tokens=None,
  row_ids=None,
  *,
  model_config: decoder.Config,
  config: sampling.SamplingConfig,
  cache_size: int | None = None,
) -> tuple[sampling.SampleOutput, Continuation]:
  """Samples the next turn of every row of `state`.

  Args:
    params: model params pytree.
    state: the Continuation of the last `start` or `extend` call (or `take_rows` of it).
    kept_B: [rows] int32, how many of the last call's sampled tokens join the history
      (those up to a stop string or a budget; 0 for a row that is over).
    new_BxM: [rows, M] int32, the new tokens (an observation), left-padded.
    new_lengths_B: [rows] int32, their real counts.
    key, max_new_tokens, row_ids, model_config, config: as `sampling.sample`.
    cache_size: the slots of the new cache (static; >= `slots_needed`, else a
      ValueError); None: `slots_needed` rounded up to SLOT_BUCKET.

  Returns:
    (SampleOutput [rows], the Continuation after this turn).
  """
  M, N = new_BxM.shape[1], config.max_new_tokens
  need = slots_needed(state, kept_B, M, N)
  if cache_size is None:
    cache_size = -(-need // SLOT_BUCKET) * SLOT_BUCKET
  elif cache_size < need:
    raise ValueError(
      f"extend: cache_size={cache_size} slots cannot hold this turn: the longest history, "
      f"{M} + 1 new tokens and max_new_tokens={N} take {need}; pass cache_size >= {need} "
      "(or None to size it per call)"
    )
  return _extend(
    params,
    state,
    jnp.asarray(kept_B, jnp.int32),
    jnp.asarray(new_BxM, jnp.int32),
    jnp.asarray(new_lengths_B, jnp.int32),
    key,
    max_new_tokens,
    row_ids,
    model_config=model_config,
    config=config,
    cache_size=cache_size,
  )


def _with_last_token(state: Continuation, kept_B, new_BxM, new_lengths_B, pad_id: int):
  """The new tokens [rows, M + 1], with a kept token that is not in the cache (the last
  call's last) put before them. Returns (tokens, their real counts, kept tokens in cache)."""
  N = state.tokens_BxN.shape[1]
  in_cache = jnp.minimum(kept_B, state.written)
  missing = kept_B > in_cache
  last = jnp.take_along_axis(state.tokens_BxN, jnp.minimum(in_cache, N - 1)[:, None], 1)[:, 0]
  new_BxM = jnp.pad(new_BxM, ((0, 0), (1, 0)), constant_values=pad_id)
  before = (new_BxM.shape[1] - 1 - new_lengths_B)[:, None]  # the slot before the first new
  fill = jnp.where(missing, last, pad_id)[:, None]
  new_BxM = jnp.where(jnp.arange(new_BxM.shape[1])[None, :] == before, fill, new_BxM)
  return new_BxM, new_lengths_B + missing, in_cache


def _right_aligned(cache, valid_BxS, size: int):
  """The cache of `size` slots with each row's history (`valid_BxS`) moved to end at one
  slot, `index` = the longest history: a stable sort of each row's slots by validity
  puts its history last, a roll moves it before `index`. Returns (cache, valid [rows,
  size])."""
  S = valid_BxS.shape[1]
  index = jnp.max(valid_BxS.sum(axis=1)).astype(jnp.int32)
  perm = jnp.argsort(valid_BxS.astype(jnp.int32), axis=1, stable=True)
  perm = jnp.take_along_axis(perm, (jnp.arange(size)[None, :] + S - index) % S, axis=1)
  # Past `index` the roll wraps around to history slots again: not history there.
  valid = jnp.take_along_axis(valid_BxS, perm, axis=1) & (jnp.arange(size)[None, :] < index)
  cache = {
    "k": jnp.take_along_axis(cache["k"], perm[None, :, None, :, None], axis=decoder.SLOT_AXIS),
    "v": jnp.take_along_axis(cache["v"], perm[None, :, None, :, None], axis=decoder.SLOT_AXIS),
    "pos": jnp.take_along_axis(cache["pos"], perm, axis=1),
    "index": index,
  }
  return cache, valid


@functools.partial(jax.jit, static_argnames=("model_config", "config", "cache_size"))
def _extend(
  params,
  state,
  kept_B,
  new_BxM,
  new_lengths_B,
  key,
  max_new_tokens,
  row_ids,
  *,
  model_config,
  config,
  cache_size,
):
  N = config.max_new_tokens
  params = decoder.decode_layout(params)
  rows = kept_B.shape[0]
  new_BxM, new_lengths_B, in_cache = _with_last_token(
    state, kept_B, new_BxM, new_lengths_B, config.pad_id
  )
  S = state.valid_BxS.shape[1]
  slot = jnp.arange(S)[None, :]
  valid = state.valid_BxS | (
    (slot >= state.gen_start) & (slot < state.gen_start + in_cache[:, None])
  )
  next_pos = state.gen_pos_B + in_cache
  cache, valid = _right_aligned(state.cache, valid, cache_size)
  index, M = cache["index"], new_BxM.shape[1]
  slot = jnp.arange(cache_size)[None, :]
  pad_B = M - new_lengths_B
  j = jnp.arange(M)[None, :]
  positions = next_pos[:, None] + jnp.maximum(j - pad_B[:, None], 0)
  new_real = (slot >= index + pad_B[:, None]) & (slot < index + M)  # [rows, size]
  causal = slot[:, None, :] <= (index + j)[:, :, None]  # [1, M, size]
  mask = valid[:, None, :] | (new_real[:, None, :] & causal)
  hidden, cache = decoder.forward(
    quant.float_view(params),
    new_BxM,
    positions,
    mask,
    cache,
    config=model_config,
    return_hidden=True,
  )
  logits = decoder.vocab_major_logits(quant.float_view(params), hidden[:, -1])
  valid = valid | new_real
  next_pos = next_pos + new_lengths_B
  gen_start = cache["index"]
  out, cache, written = sampling.decode_loop(
    params,
    logits,
    cache,
    valid,
    next_pos,
    sampling.clip_limit(max_new_tokens, N),
    sampling.row_keys(key, row_ids, rows),
    model_config=model_config,
    config=config,
  )
  return out, Continuation(cache, valid, gen_start, next_pos, out.tokens, written)


def take_rows(state: Continuation, rows) -> Continuation:
  """The Continuation of `rows` ([R] int indices) of `state`, e.g. the episodes still alive."""
  rows = jnp.asarray(rows)
  cache = state.cache
  return Continuation(
    {
      "k": cache["k"][:, rows],
      "v": cache["v"][:, rows],
      "pos": cache["pos"][rows],
      "index": cache["index"],
    },
    state.valid_BxS[rows],
    state.gen_start,
    state.gen_pos_B[rows],
    state.tokens_BxN[rows],
    state.written,
  )
