"""The model behind the endpoint: what serves, a row's identity, shared helpers.

Batching never changes a result: a choice's token t draws its random numbers from
`fold_in(fold_in(key(0), row_id), t)` with `row_id` a function of the request's seed and
the choice's index alone (`row_id`), and its positions start at 0 whatever slot and
columns it gets (`slots.py`), so it equals `sampling.sample` on its prompt alone. Shapes
are bucketed to powers of two (slots, prefill width, cache columns), so a server compiles
a few programs, not one per request mix.
"""

import dataclasses
import zlib

import jax.numpy as jnp
import numpy as np

from rlpost import sampling
from rlpost.models import decoder
from rlpost.serve import scoring

MIN_PROMPT_BUCKET = 32
MIN_TOKEN_BUCKET = 16


@dataclasses.dataclass(frozen=True, eq=False)
class Engine:
  """What serves: params (a decoder pytree), its Config and Tokenizer, the name clients
  send as `model`, `context` (prompt + new tokens, at most), `max_tokens` (the cap and
  default of new tokens per choice), `chat` (how conversations become ids and completions
  tool calls: `chat.ChatSetup`; default the hand-written layout and the library syntax),
  `temperature`: None, or the one temperature every request samples at (top_p 1), whatever
  it asks: a training run's endpoint, whose trainer divides the logits by the run's)."""

  params: dict
  model_config: decoder.Config
  tokenizer: object
  name: str
  context: int
  max_tokens: int
  chat: object = None
  temperature: float | None = None

  def __post_init__(self):
    if self.max_tokens < 1 or self.context <= self.max_tokens:
      raise ValueError(
        f"Engine: max_tokens={self.max_tokens} must be >= 1 and below context={self.context}"
      )


@dataclasses.dataclass(frozen=True)
class RowOutput:
  """Sampled ids (the stop id included when the row stopped), their sampler logprobs,
  per token the `top_logprobs` most likely (id, logprob) pairs (or None), and whether
  the row ended on a stop id."""

  token_ids: list[int]
  logprobs: list[float]
  top: list[list[tuple[int, float]]] | None
  stopped: bool


def for_decoding(engine: Engine) -> Engine:
  """`engine` with its params in the sampler's decode layout (`decoder.decode_layout`),
  laid out once: the slot programs (`slots.admit`, `slots.step_chunk`) run one call per
  admission and per chunk, and each would copy the layer weights again (Gemma 3 270M: 0.13
  to 0.25 s a call). The embedding passes through outside the program (no copy); the
  layers are a second copy while the engine serves. Scoring (`top_alternatives`) keeps
  the stacked `engine`."""
  return dataclasses.replace(engine, params=decoder.decode_layout_once(engine.params))


def row_id(seed: int, index: int) -> int:
  """Choice `index` of a request with `seed` -> the sampler's row id (31 bits); the same
  pair gives the same id in any batch."""
  return zlib.crc32(f"{seed}/{index}".encode()) & 0x7FFFFFFF


def bucket(n: int, least: int) -> int:
  """The power of two >= max(n, least)."""
  return 1 << (max(n, least, 1) - 1).bit_length()


def sampling_config(engine: Engine, temperature: float, top_p: float, new_tokens: int):
  """The static sampler settings of a setting's rows: stops at EOS and the turn close."""
  tok = engine.tokenizer
  return sampling.SamplingConfig(
    temperature=temperature,
    top_p=top_p if temperature > 0 else 1.0,
    stop_ids=(tok.eos_id, tok.end_of_turn_id),
    max_new_tokens=new_tokens,
    pad_id=tok.pad_id,
    prompt_bucket=MIN_PROMPT_BUCKET,
  )


def powers(lo: int, hi: int):
  """lo, 2 lo, 4 lo, ... up to hi."""
  while lo <= hi:
    yield lo
    lo *= 2


def top_alternatives(engine: Engine, gen, ids: list[int], config) -> list | None:
  """Per sampled token of `ids` (after `gen.prompt_ids`), the `gen.top_logprobs` most
  likely (id, logprob) pairs (`scoring.top_logprobs`: a teacher-forced forward at the
  sampler's temperature, 1 for greedy); None without ids."""
  if not ids:
    return None
  width = bucket(len(gen.prompt_ids), MIN_PROMPT_BUCKET)
  prompt = np.full((1, width), config.pad_id, np.int32)
  prompt[0, width - len(gen.prompt_ids) :] = gen.prompt_ids
  n = bucket(len(ids), MIN_TOKEN_BUCKET)
  sampled = np.full((1, n), config.pad_id, np.int32)
  sampled[0, : len(ids)] = ids
  top_ids, logp = scoring.top_logprobs(
    engine.params,
    jnp.asarray(prompt),
    jnp.asarray([len(gen.prompt_ids)], jnp.int32),
    jnp.asarray(sampled),
    jnp.asarray(np.arange(n)[None, :] < len(ids)),
    model_config=engine.model_config,
    temperature=config.temperature if config.temperature > 0 else 1.0,
    k=scoring.MAX_TOP_LOGPROBS,
  )
  top_ids, logp = np.asarray(top_ids)[0], np.asarray(logp)[0]
  k = gen.top_logprobs
  return [
    [(int(a), float(b)) for a, b in zip(top_ids[t, :k], logp[t, :k])] for t in range(len(ids))
  ]
