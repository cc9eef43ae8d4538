"""The model behind the endpoint and its one batched call.

`generate` decodes rows that share a temperature and top_p in ONE `sampling.sample` call.
Shapes are bucketed to powers of two (rows, prompt width, new-token cap), so a server
compiles a few programs, not one per request mix. Batching never changes a result: row r
draws its random numbers from `fold_in(key, row_id)` with `row_id` a function of the
request's seed and the choice's index alone (`row_id`), the prompt is left-padded
(positions start at 0 in every row), and a row asking for fewer tokens than its batch
companions is cut on the host (its first k tokens do not depend on the batch's limit).
"""

import dataclasses
import zlib

import jax
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
class Row:
  """One choice to sample: prompt ids, its token budget, its random identity (`row_id`),
  and how many alternatives per token to report (0: none)."""

  prompt: tuple[int, ...]
  max_tokens: int
  row_id: int
  top_logprobs: int = 0


@dataclasses.dataclass(frozen=True)
class RowOutput:
  """Sampled ids (the stop id included when the row stopped), their sampler logprobs,
  per token the `top_logprobs` most likely (id, logprob) pairs (or None), and whether
  the row ended on a stop id."""

  token_ids: list[int]
  logprobs: list[float]
  top: list[list[tuple[int, float]]] | None
  stopped: bool


def row_id(seed: int, index: int) -> int:
  """Choice `index` of a request with `seed` -> the sampler's row id (31 bits); the same
  pair gives the same id in any batch."""
  return zlib.crc32(f"{seed}/{index}".encode()) & 0x7FFFFFFF


def bucket(n: int, least: int) -> int:
  """The power of two >= max(n, least)."""
  return 1 << (max(n, least, 1) - 1).bit_length()


def sampling_config(engine: Engine, temperature: float, top_p: float, new_tokens: int):
  """The static sampler settings of a batch: stops at EOS and the turn close."""
  tok = engine.tokenizer
  return sampling.SamplingConfig(
    temperature=temperature,
    top_p=top_p if temperature > 0 else 1.0,
    stop_ids=(tok.eos_id, tok.end_of_turn_id),
    max_new_tokens=new_tokens,
    pad_id=tok.pad_id,
    prompt_bucket=MIN_PROMPT_BUCKET,
  )


def generate(engine: Engine, rows: list[Row], temperature: float, top_p: float):
  """Samples every row in one sampler call; returns [RowOutput] in `rows`' order."""
  if not rows:
    return []
  limit = max(r.max_tokens for r in rows)
  config = sampling_config(engine, temperature, top_p, bucket(limit, MIN_TOKEN_BUCKET))
  width = bucket(max(len(r.prompt) for r in rows), MIN_PROMPT_BUCKET)
  padded = rows + [rows[0]] * (bucket(len(rows), 1) - len(rows))
  tokens_BxP, lengths_B = sampling.pad_prompts([list(r.prompt) for r in padded], config, width)
  row_ids = jnp.asarray([r.row_id for r in padded], jnp.int32)
  out = sampling.sample(
    engine.params,
    tokens_BxP,
    lengths_B,
    jax.random.key(0),
    jnp.int32(limit),
    row_ids,
    model_config=engine.model_config,
    config=config,
  )
  top = _top(engine, rows, tokens_BxP, lengths_B, out, config)
  out = jax.device_get(out)
  return [_row_output(out, i, r, top, config) for i, r in enumerate(rows)]


def warm_up(engine: Engine, max_rows: int, max_prompt: int, temperature=0.0, top_p=1.0) -> int:
  """Compiles the sampler for every shape a batch of up to `max_rows` rows with prompts of
  up to `max_prompt` tokens and the default budget (`engine.max_tokens`) can take, at one
  temperature and top_p (static sampler settings: each pair is its own program). Returns
  the number of shapes."""
  shapes = 0
  for rows in _powers(1, bucket(max_rows, 1)):
    for width in _powers(MIN_PROMPT_BUCKET, bucket(max_prompt, MIN_PROMPT_BUCKET)):
      row = Row((engine.tokenizer.bos_id,) * width, engine.max_tokens, 0)
      generate(engine, [row] * rows, temperature, top_p)
      shapes += 1
  return shapes


def _powers(lo: int, hi: int):
  while lo <= hi:
    yield lo
    lo *= 2


def _top(engine, rows, tokens_BxP, lengths_B, out, config):
  """[rows, N, K] ids and logprobs of the most likely tokens, when a row asks for them."""
  k = max(r.top_logprobs for r in rows)
  if k == 0:
    return None
  temperature = config.temperature if config.temperature > 0 else 1.0
  ids, logp = scoring.top_logprobs(
    engine.params,
    tokens_BxP,
    lengths_B,
    out.tokens,
    out.mask,
    model_config=engine.model_config,
    temperature=temperature,
    k=scoring.MAX_TOP_LOGPROBS,
  )
  return np.asarray(ids), np.asarray(logp)


def _row_output(out, i: int, row: Row, top, config) -> RowOutput:
  n = min(int(out.lengths[i]), row.max_tokens)
  ids = out.tokens[i, :n].tolist()
  stopped = bool(n) and ids[-1] in config.stop_ids
  pairs = None
  if row.top_logprobs and top is not None:
    k = row.top_logprobs
    pairs = [
      [(int(a), float(b)) for a, b in zip(top[0][i, t, :k], top[1][i, t, :k])] for t in range(n)
    ]
  return RowOutput(ids, out.logprobs[i, :n].astype(float).tolist(), pairs, stopped)
