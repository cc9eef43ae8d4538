"""Jitted sampler: prefill, then the whole decode loop as one `lax.while_loop`.

Prompts are LEFT-padded to a bucketed length P; row b's real tokens sit in
slots [P - len_b, P) with positions 0..len_b-1, so the result does not depend
on the padding amount or on batch companions. The KV cache holds P + N slots
(N = `SamplingConfig.max_new_tokens`, static); a traced `max_new_tokens <= N`
chooses how many tokens to generate without recompiling.

Logprob convention (what the RL code relies on): `SampleOutput.logprobs[b, t]`
is the log-probability of the sampled token under the distribution it was
actually drawn from: softmax(logits / temperature) restricted to the top-k /
nucleus candidates and renormalised. With the RL defaults (top_k=None,
top_p=1) that is exactly `log_softmax(logits / temperature)[token]`, the
quantity the trainer recomputes. Greedy decoding (temperature 0) reports the
log-probability under the untempered full softmax.
"""

import dataclasses
import functools
import math
import numbers

import jax
import jax.numpy as jnp

from rlpost.models import decoder
from rlpost.models import quant

_NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Static sampling settings.

  temperature: 0 for greedy, else > 0.
  top_k: keep the k most likely tokens (None: no limit).
  top_p: nucleus mass in (0, 1]; 1 disables it. Below 1 the nucleus is chosen
    among the `nucleus_candidates` most likely tokens (one `lax.top_k`, no
    full-vocabulary sort), so it is capped at that many tokens.
  stop_ids: generation of a row ends after it emits any of these.
  max_new_tokens: cache capacity for new tokens (static upper bound).
  pad_id: written after a row stops.
  prompt_bucket: prompt lengths are padded up to a multiple of this.
  """

  temperature: float = 1.0
  top_k: int | None = None
  top_p: float = 1.0
  stop_ids: tuple[int, ...] = (1, 106)
  max_new_tokens: int = 64
  pad_id: int = 0
  prompt_bucket: int = 32
  nucleus_candidates: int = 1024

  def __post_init__(self):
    if not (math.isfinite(self.temperature) and self.temperature >= 0):
      raise ValueError(
        f"SamplingConfig.temperature={self.temperature} must be a finite number >= 0 "
        "(0 means greedy)"
      )
    if not 0 < self.top_p <= 1:
      raise ValueError(
        f"SamplingConfig.top_p={self.top_p} must be in (0, 1]; use 1.0 to disable nucleus sampling"
      )
    for name in ("top_k", "max_new_tokens", "prompt_bucket", "nucleus_candidates"):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(
          f"SamplingConfig.{name}={value!r} must be a whole number (a count of tokens)"
        )
    if self.top_k is not None and self.top_k < 1:
      raise ValueError(f"SamplingConfig.top_k={self.top_k} must be >= 1 or None")
    if self.max_new_tokens < 1:
      raise ValueError(f"SamplingConfig.max_new_tokens={self.max_new_tokens} must be >= 1")
    for name in ("prompt_bucket", "nucleus_candidates"):
      if getattr(self, name) < 1:
        raise ValueError(f"SamplingConfig.{name}={getattr(self, name)} must be >= 1")
    object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SampleOutput:
  """tokens, logprobs, mask: [rows, N] (int32, float32, bool); lengths: [rows] int32.

  Rows are prompt-major: row b * num_samples + g is sample g of prompt b.
  mask is True on generated tokens (the stop token included); tokens after a
  stop are `pad_id` and their logprobs 0.
  """

  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array
  lengths: jax.Array


def pad_prompts(prompts: list[list[int]], config: SamplingConfig, longest: int = 0):
  """Left-pads token lists to a bucketed length. Returns ([B, P] int32, [B] int32).

  longest: pad as if a prompt this long were in the batch too (several processes
  padding their own prompts to one agreed width).
  """
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("pad_prompts needs a non-empty list of non-empty token lists")
  longest = max(longest, *(len(p) for p in prompts))
  P = -(-longest // config.prompt_bucket) * config.prompt_bucket
  tokens = [[config.pad_id] * (P - len(p)) + list(p) for p in prompts]
  return jnp.asarray(tokens, jnp.int32), jnp.asarray([len(p) for p in prompts], jnp.int32)


def _categorical(keys_B: jax.Array, logits_VxB: jax.Array):
  """Exact sample from softmax(logits) over axis 0, by two-level inverse CDF.

  Much cheaper on CPU than Gumbel-max over a 262k vocabulary (one uniform per
  level instead of one random number per token): split the vocabulary into
  ~sqrt(V) blocks, pick a block by its mass, then a token inside it.
  Column b draws its uniforms from `keys_B[b]` alone.
  Returns (tokens [B] int32, logsumexp of the logits [B] float32), the latter
  from the same pass over the vocabulary.
  """
  V, B = logits_VxB.shape
  size = max(1, int(round(V**0.5)))
  nblocks = -(-V // size)
  logits = jnp.pad(
    logits_VxB.astype(jnp.float32), ((0, nblocks * size - V), (0, 0)), constant_values=_NEG_INF
  )
  top = jnp.max(logits, axis=0, keepdims=True)
  probs = jnp.exp(logits - top).reshape(nblocks, size, B)
  block_mass = probs.sum(1)
  k1, k2 = jnp.moveaxis(jax.vmap(jax.random.split)(keys_B), 1, 0)
  block = _inverse_cdf(k1, block_mass)
  inner = jnp.take_along_axis(probs, block[None, None, :], axis=0)[0]
  lse = top[0] + jnp.log(block_mass.sum(0))
  return block * size + _inverse_cdf(k2, inner), lse


def _inverse_cdf(keys_B: jax.Array, weights_KxB: jax.Array) -> jax.Array:
  """Per column b: index i with probability w[i, b] / sum_i w[i, b], never a zero-weight
  index; column b's uniform comes from `keys_B[b]`."""
  cdf = jnp.cumsum(weights_KxB, axis=0)
  u = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys_B)[None, :] * cdf[-1:]
  idx = jnp.sum(cdf <= u, axis=0)
  K = weights_KxB.shape[0]
  last_positive = K - 1 - jnp.argmax((weights_KxB > 0)[::-1], axis=0)
  return jnp.minimum(idx, last_positive).astype(jnp.int32)


def _take(x_VxB: jax.Array, index_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x_VxB, index_B[None, :], axis=0)[0]


def select_tokens(keys_B: jax.Array, logits_VxB: jax.Array, config: SamplingConfig):
  """Picks the next token of each row from VOCAB-MAJOR logits [V, B]; row b's
  randomness comes from its own key `keys_B[b]` (a [B] array of PRNG keys).

  (Vocab-major because `embed @ h.T` is much faster on XLA:CPU than `h @ embed.T`.)
  Returns (tokens [B] int32, logprobs [B] float32) following the module's convention.
  """
  logits = logits_VxB.astype(jnp.float32)
  if config.temperature == 0:
    token = jnp.argmax(logits, axis=0).astype(jnp.int32)
    return token, _take(logits, token) - jax.nn.logsumexp(logits, axis=0)
  scaled = logits / config.temperature
  if config.top_k is None and config.top_p >= 1:
    token, lse = _categorical(keys_B, scaled)
    return token, _take(scaled, token) - lse
  k = config.top_k if config.top_k is not None else config.nucleus_candidates
  vals, idx = jax.lax.top_k(scaled.T, min(k, scaled.shape[0]))  # [B, k], descending
  vals, idx = vals.T, idx.T
  if config.top_p < 1:
    probs = jnp.exp(vals - jax.nn.logsumexp(scaled, axis=0, keepdims=True))
    mass_before = jnp.cumsum(probs, axis=0) - probs
    vals = jnp.where(mass_before < config.top_p, vals, _NEG_INF)
  choice = _inverse_cdf(keys_B, jnp.exp(vals - vals[:1]))
  logp = _take(vals, choice) - jax.nn.logsumexp(vals, axis=0)
  return _take(idx, choice).astype(jnp.int32), logp


def prefill(params, tokens_BxP, lengths_B, *, model_config: decoder.Config, cache_size: int):
  """Runs the left-padded prompts into a fresh cache of `cache_size` slots.

  Returns (last-position logits, vocab-major [V, B] float32, cache).
  """
  B, P = tokens_BxP.shape
  pad_B = P - lengths_B
  slots = jnp.arange(P)[None, :]
  valid_BxP = slots >= pad_B[:, None]
  positions = jnp.maximum(slots - pad_B[:, None], 0)
  key_valid = jnp.pad(valid_BxP, ((0, 0), (0, cache_size - P)))
  causal = jnp.arange(cache_size)[None, :] <= jnp.arange(P)[:, None]
  mask = causal[None] & key_valid[:, None, :]
  params = quant.float_view(params)  # the int8 copy's prefill runs on dequantized weights
  cache = decoder.init_cache(model_config, B, cache_size, params["embed"].dtype)
  hidden, cache = decoder.forward(
    params, tokens_BxP, positions, mask, cache, config=model_config, return_hidden=True
  )
  return decoder.vocab_major_logits(params, hidden[:, -1]), cache


def row_sharding(params, rows: int) -> jax.sharding.NamedSharding | None:
  """How the sampler splits `rows` rows over the devices that hold its `params`: when
  every leaf is replicated on a mesh of several devices (a rollout mesh; a trainer mesh
  without fsdp), a sharding that gives each device its block of rows, to put the row
  inputs on (each device then samples its rows alone; per-row keys make the samples the
  same as on one device). None: one device, weights split over devices, or `rows` not
  a multiple of the device count (the rows then run whole on every device)."""
  leaves = jax.tree.leaves(params)
  first = getattr(leaves[0], "sharding", None) if leaves else None
  if not isinstance(first, jax.sharding.NamedSharding):
    return None
  devices = first.mesh.devices.reshape(-1)
  if len(devices) == 1 or rows % len(devices):
    return None
  if not all(getattr(x, "is_fully_replicated", False) for x in leaves):
    return None
  # rows over all of the mesh's axes at once (one mesh for every input of a program)
  axes = tuple(first.mesh.axis_names)
  return jax.sharding.NamedSharding(first.mesh, jax.sharding.PartitionSpec(axes))


def _repeat_rows(tree, n: int):
  """Repeats every row (axis 0; axis 1 of the stacked k/v caches) n times."""
  if n == 1:
    return tree
  cache_axes = {"k": 1, "v": 1, "pos": 0, "index": None}
  out = {}
  for name, value in tree.items():
    axis = cache_axes[name]
    out[name] = value if axis is None else jnp.repeat(value, n, axis=axis)
  return out


def row_keys(key, row_ids, rows: int):
  """[rows] PRNG keys: fold_in(key, row_ids[r]) (row_ids None: 0, 1, ...)."""
  row_ids = jnp.arange(rows, dtype=jnp.int32) if row_ids is None else row_ids
  return jax.vmap(jax.random.fold_in, (None, 0))(key, row_ids)


def decode_loop(
  params, logits, cache, valid_BxS, next_pos_B, limit, keys_B, *, model_config, config
):
  """The decode loop from logits [V, rows] of each row's next token.

  Token t of row b goes to slot cache["index"] + t at position next_pos_B[b] + t and
  attends the slots `valid_BxS` plus the tokens sampled before it. Returns
  (SampleOutput, the cache after the loop, how many tokens it holds of each row's).
  """
  N = config.max_new_tokens
  rows = valid_BxS.shape[0]
  start = cache["index"]
  slot_ids = jnp.arange(valid_BxS.shape[1])[None, :]
  stop_ids = jnp.asarray(config.stop_ids or (-1,), jnp.int32)

  def emit(t, done, logits, tokens, logprobs):
    """Samples token t of every row from `logits` and records it (pads after a stop)."""
    step_keys = jax.vmap(jax.random.fold_in, (0, None))(keys_B, t)
    token, logp = select_tokens(step_keys, logits, config)
    token = jnp.where(done, config.pad_id, token)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, t))
    logprobs = jax.lax.dynamic_update_slice(logprobs, jnp.where(done, 0.0, logp)[:, None], (0, t))
    return token, done | jnp.isin(token, stop_ids), tokens, logprobs

  # The loop emits tokens 0 .. limit-2, each followed by the forward that gives the
  # next logits; the last token is emitted after it (no forward would use its logits).
  def cond(carry):
    t, done = carry[0], carry[1]
    return (t + 1 < limit) & ~jnp.all(done)

  def body(carry):
    t, done, logits, cache, tokens, logprobs = carry
    token, done, tokens, logprobs = emit(t, done, logits, tokens, logprobs)
    mask = (valid_BxS | ((slot_ids >= start) & (slot_ids <= start + t)))[:, None, :]
    hidden, cache = decoder.forward(
      params,
      token[:, None],
      (next_pos_B + t)[:, None],
      mask,
      cache,
      config=model_config,
      return_hidden=True,
    )
    logits = decoder.vocab_major_logits(params, hidden[:, 0])
    return t + 1, done, logits, cache, tokens, logprobs

  carry = (
    jnp.zeros((), jnp.int32),
    jnp.zeros((rows,), bool),
    logits,
    cache,
    jnp.full((rows, N), config.pad_id, jnp.int32),
    jnp.zeros((rows, N), jnp.float32),
  )
  t_last, done, logits, cache, tokens, logprobs = jax.lax.while_loop(cond, body, carry)
  _, _, tokens, logprobs = emit(t_last, done, logits, tokens, logprobs)
  t_end = t_last + 1
  mask = _generated_mask(tokens, stop_ids, jnp.minimum(t_end, limit))
  out = SampleOutput(
    tokens=jnp.where(mask, tokens, config.pad_id),
    logprobs=jnp.where(mask, logprobs, 0.0),
    mask=mask,
    lengths=mask.sum(-1).astype(jnp.int32),
  )
  return out, cache, t_last


def clip_limit(max_new_tokens, N: int):
  """The traced token cap: max_new_tokens (None: N) clipped to [0, N]."""
  limit = jnp.asarray(N if max_new_tokens is None else max_new_tokens, jnp.int32)
  return jnp.clip(limit, 0, N)


def sample_with_cache(
  params, tokens_BxP, lengths_B, key, max_new_tokens, row_ids, *, model_config, config, num_samples
):
  """`sample`'s body (unjitted), also returning what a later turn continues from.

  Returns (SampleOutput, cache after the decode loop, valid_BxS bool [rows, P + N] (the
  prompt slots), lengths [rows] int32 (the prompt lengths: the first sampled token's
  position), written [] int32 (how many sampled tokens the cache holds)).
  """
  _check_sample_args(tokens_BxP, lengths_B, row_ids, num_samples)
  N = config.max_new_tokens
  B, P = tokens_BxP.shape
  params = decoder.decode_layout(params)  # large layers: sliced once, not at every step
  logits, cache = prefill(
    params, tokens_BxP, lengths_B, model_config=model_config, cache_size=P + N
  )
  logits = jnp.repeat(logits, num_samples, axis=1)
  cache = _repeat_rows(cache, num_samples)
  lengths = jnp.repeat(lengths_B, num_samples)
  rows = B * num_samples
  slot_ids = jnp.arange(P + N)[None, :]
  valid = (slot_ids >= (P - lengths)[:, None]) & (slot_ids < P)
  out, cache, written = decode_loop(
    params,
    logits,
    cache,
    valid,
    lengths,
    clip_limit(max_new_tokens, N),
    row_keys(key, row_ids, rows),
    model_config=model_config,
    config=config,
  )
  return out, cache, valid, lengths, written


@functools.partial(
  jax.jit, static_argnames=("model_config", "config", "num_samples"), donate_argnames=()
)
def sample(
  params,
  tokens_BxP,
  lengths_B,
  key,
  max_new_tokens=None,
  row_ids=None,
  *,
  model_config: decoder.Config,
  config: SamplingConfig,
  num_samples: int = 1,
) -> SampleOutput:
  """Samples `num_samples` completions per left-padded prompt.

  Args:
    params: model params pytree.
    tokens_BxP: [B, P] int32, left-padded prompts (see `pad_prompts`).
    lengths_B: [B] int32, real prompt lengths.
    key: PRNG key; the same key gives the same output.
    max_new_tokens: traced int32 scalar <= config.max_new_tokens (None: the cap).
    row_ids: [B * G] int32, each output row's identity in the global batch (None:
      0, 1, ...). Row r's random numbers come from fold_in(key, row_ids[r]) only,
      so its sample does not depend on its batch companions or on how the rows
      are split over processes.
    model_config, config: static architecture and sampling settings.
    num_samples: G completions per prompt; the prompt is prefilled once and
      its cache shared by the G samples.

  Returns:
    SampleOutput with B * G rows.
  """
  return sample_with_cache(
    params,
    tokens_BxP,
    lengths_B,
    key,
    max_new_tokens,
    row_ids,
    model_config=model_config,
    config=config,
    num_samples=num_samples,
  )[0]


def _check_sample_args(tokens_BxP, lengths_B, row_ids, num_samples: int) -> None:
  """Shapes and dtypes of `sample`'s arguments (checked when it is traced)."""
  if tokens_BxP.ndim != 2 or not jnp.issubdtype(tokens_BxP.dtype, jnp.integer):
    raise ValueError(
      f"sample: tokens_BxP must be [B, P] integer token ids, got {tokens_BxP.dtype} "
      f"{tokens_BxP.shape}; build them with pad_prompts"
    )
  if lengths_B.shape != tokens_BxP.shape[:1]:
    raise ValueError(
      f"sample: lengths_B has shape {lengths_B.shape}, expected [B] = ({tokens_BxP.shape[0]},): "
      "one real length per prompt row (pad_prompts returns both)"
    )
  if num_samples < 1:
    raise ValueError(f"sample: num_samples={num_samples} must be >= 1 completion per prompt")
  rows = tokens_BxP.shape[0] * num_samples
  if row_ids is not None and jnp.shape(row_ids) != (rows,):
    raise ValueError(
      f"sample: row_ids has shape {jnp.shape(row_ids)}, expected [B * num_samples] = ({rows},), "
      "one id per output row (or None for 0, 1, ...)"
    )


def _generated_mask(tokens_BxN, stop_ids, steps):
  """True up to and including each row's first stop token, within `steps` steps."""
  N = tokens_BxN.shape[1]
  is_stop = jnp.isin(tokens_BxN, stop_ids)
  stops_before = jnp.cumsum(is_stop, axis=-1) - is_stop
  return (stops_before == 0) & (jnp.arange(N)[None, :] < steps)
