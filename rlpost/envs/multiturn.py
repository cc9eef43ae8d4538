"""Multi-turn rollouts, token in / token out: the only data source of agentic RL.

One episode per row. Each turn, every row still alive goes through ONE call
of the jitted sampler; its context is the row's first prompt followed by
everything since (sampled tokens and observation tokens, exactly as they were
produced: nothing is decoded and re-encoded, no chat template is re-applied).
Turn 0 is `continuation.start` (the single-turn sampler that also returns its
cache; for one-turn episodes, a prompt dataset's, the plain sampler without one); a
later turn continues the row's KV cache (`continuation.extend`): only the new
observation tokens are prefilled. The sampled text is decoded only to give it to the environment.

  reset -> first prompt ids -> [sample turn -> cut at a stop string / budget
  -> env.step (alive rows, concurrently) -> observation ids] x turns -> RLBatch

The training stream of a row is [first prompt | completion slots]: the prompt
is the context (left-padded, as in single-turn), the T completion slots hold the
turns and observations: T = `max_total_tokens` with `fixed_shapes`, else the slots the
batch's longest row uses (`batch_width`: empty trailing slots would cost every pass
that trains on the batch compute and change nothing it computes). `loss_mask` is 1 exactly on
sampled tokens; observation and scaffolding tokens are `valid` context with
`loss_mask` 0 (see `rlpost.text.scaffold`).

A turn ends at the end-of-turn (or EOS) token, at the token that completes one
of `env.stop_strings` or `TurnConfig.stop_strings` (kept whole, even when the tag ends inside it), at
`max_turn_tokens`, or where the row's completion slots run out. Every sampled
turn gets exactly one `env.step` call. An episode is truncated when it is not
done after `env.max_turns` turns or when its next observation (plus one
sampled token) does not fit in the slots.

Randomness: turn 0 samples the G rows of a task from one shared prefill with
`key` (exactly the single-turn sampler call); turn k > 0 uses
`fold_in(key, k)`.

Shapes of the later turns' sampler calls (each new shape is one compilation,
~1-5 s for a tiny model on CPU): with `fixed_shapes`, every later turn
samples all N rows (finished ones as discarded copies, adding no tokens) with
the new tokens padded to the whole completion window and a cache of one size:
one compilation, more compute per turn. Otherwise the alive rows are padded
to a power of two (finished rows stop costing compute), the new tokens to a
multiple of 16 and the cache to what the turn needs (`continuation.SLOT_BUCKET`):
less compute, more compilations.
"""

import dataclasses
import functools
from concurrent import futures
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from rlpost import continuation, errors, sampling
from rlpost.envs import protocol
from rlpost.text import scaffold
from rlpost.text import template_ids
from rlpost.text import template_turns
from rlpost.models import decoder
from rlpost.rl import batch as batch_lib


# A later turn's new tokens (observations) are padded to a multiple of this: they are
# few, and padding them to the prompt bucket multiplied a turn's prefill work.
_NEW_BUCKET = 16
# Without `fixed_shapes` a batch keeps the completion slots its longest row uses, rounded
# up to a multiple of this (each width is one compilation of the passes that train on it).
WIDTH_BUCKET = 64


@dataclasses.dataclass(frozen=True)
class TurnConfig:
  """Budgets and layout of a multi-turn rollout.

  template: the scaffold around observations ("chat" | "plain").
  max_turn_tokens: sampled tokens per turn at most (the sampler's static cap).
  max_total_tokens: completion slots T per row (turns + observations).
  max_prompt_tokens: the longest first prompt (reset's observation in its scaffold)
    a rollout accepts; a longer one is an error that names it, not a window sized to it.
  mask_truncated: put loss_mask = 0 on every token of a truncated episode.
  fixed_shapes: later turns sample every row over the whole window (module doc).
  stop_strings: texts that end a turn in addition to the environment's (e.g.
    "\n" when a base model answers after a cue in the plain scaffold).
  layout: the model's chat template and its variables (`template_turns.Layout`): the
    "template" scaffold's, which needs one (the recipe builds it with the model; the
    other scaffolds ignore it).
  keep_special: control-token texts written into the text the environment is given (a
    native tool format's markers, e.g. "[TOOL_CALLS]"); others are dropped when decoding.
  """

  template: str = "chat"
  max_turn_tokens: int = 32
  max_total_tokens: int = 256
  max_prompt_tokens: int = 2048
  mask_truncated: bool = False
  fixed_shapes: bool = False
  stop_strings: tuple[str, ...] = ()
  layout: template_turns.Layout | None = None
  keep_special: tuple[str, ...] = ()

  def __post_init__(self):
    if self.template not in scaffold.SCAFFOLDS:
      raise ValueError(f"TurnConfig.template={self.template!r}: use one of {scaffold.SCAFFOLDS}")
    object.__setattr__(self, "keep_special", tuple(self.keep_special))
    if self.max_turn_tokens < 1:
      raise ValueError(f"TurnConfig.max_turn_tokens={self.max_turn_tokens}: use >= 1 token")
    if isinstance(self.stop_strings, str) or not all(
      isinstance(t, str) and t for t in self.stop_strings
    ):
      raise ValueError(
        f"TurnConfig.stop_strings={self.stop_strings!r}: use a tuple of non-empty strings"
      )
    object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
    for name in ("max_total_tokens", "max_prompt_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"TurnConfig.{name}={getattr(self, name)}: use >= 1 token")


class Episode(NamedTuple):
  """What happened in one row (host side, for rewards, metrics and transcripts).

  first_observation: the text `reset` showed.
  reward: sum of the turns' rewards.
  turn_rewards: the reward of each turn.
  texts: each turn's decoded assistant text; observations: the text after it.
  infos: each turn's `info` dict.
  done: the environment ended the episode; truncated: the driver did.
  """

  task: Any
  seed: int
  first_observation: str
  reward: float
  turn_rewards: list
  texts: list
  observations: list
  infos: list
  done: bool
  truncated: bool


class Rollout(NamedTuple):
  """What a rollout returns (NumPy).

  batch: the RLBatch (no advantages).
  rewards: [N] float32, each episode's reward (the sum of its turns' rewards).
  turn_rewards: [N, T] float32, each turn's reward on that turn's last sampled
    token (`place_turn_rewards`), 0 elsewhere; rows sum to `rewards` unless
    `mask_truncated` masked the row.
  episodes: N Episodes.
  """

  batch: batch_lib.RLBatch
  rewards: np.ndarray
  turn_rewards: np.ndarray
  episodes: list


def place_turn_rewards(
  turn_rewards: list, turn_ids: np.ndarray, loss_mask: np.ndarray
) -> np.ndarray:
  """Each turn's reward on the last loss token of that turn: [N, T] float32.

  Args:
    turn_rewards: per row, the reward of each of its turns (turn k at index k).
    turn_ids: [N, T] int32, the turn each slot belongs to (-1: empty slot).
    loss_mask: [N, T], 1 on sampled tokens.

  A turn with no loss token (its row masked, e.g. by `mask_truncated`) puts
  its reward nowhere, as a masked row's sequence reward is nowhere.
  """
  out = np.zeros(loss_mask.shape, np.float32)
  for r, rewards in enumerate(turn_rewards):
    acted = np.flatnonzero(np.asarray(loss_mask[r]) > 0)
    for k, reward in enumerate(rewards):
      slots = acted[turn_ids[r, acted] == k]
      if slots.size:
        out[r, slots[-1]] += reward
  return out


def _label(env: protocol.Env, where: str) -> str:
  """The environment's name for an error, with the row and turn (`where`) when given."""
  return f"environment {env.name!r}" + (f" ({where})" if where else "")


def _not_utf8(text: str) -> str | None:
  """Why `text` cannot be encoded (a lone surrogate, e.g. from bytes decoded with
  errors='surrogateescape'), or None when it can."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    return (
      f"observation is not UTF-8 text: {text[e.start]!r} at index {e.start} (a lone "
      "surrogate; decode bytes with errors='replace')"
    )
  return None


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _reward_problem(reward) -> str | None:
  """Why a numeric reward cannot go into the float32 batch (None: it can)."""
  try:
    value = float(reward)
  except OverflowError:
    return "reward is an int too large for a float"
  if not np.isfinite(value):
    return f"reward is {value}, not finite"
  if abs(value) > FLOAT32_MAX:
    return f"reward is {value:.4g}, beyond float32 (|reward| <= {FLOAT32_MAX:.4g}), the batch's"
  return None


def checked_reset(env: protocol.Env, task, seed: int) -> tuple[Any, str]:
  """`env.reset(task, seed)` as (state, observation); a raising or malformed reset fails
  naming the env, the seed and the task."""
  try:
    first = env.reset(task, seed)
  except Exception as e:
    raise RuntimeError(
      f"environment {env.name!r}: reset(task, seed={seed}) raised {type(e).__name__}: {e} "
      f"(task {str(task)[:80]!r})"
    ) from e
  if not (isinstance(first, tuple) and len(first) == 2 and isinstance(first[1], str)):
    raise TypeError(
      f"environment {env.name!r}: reset(task, seed={seed}) must return (state, "
      f"observation text), got {type(first).__name__} {str(first)[:80]!r}"
    )
  problem = _not_utf8(first[1])
  if problem:
    raise ValueError(f"environment {env.name!r}: reset(task, seed={seed}): {problem}")
  return first


def checked_step(env: protocol.Env, state, text: str, where: str = "") -> protocol.Step:
  """`env.step(state, text)` as a `Step`; a raising or malformed step fails naming the env
  (and `where`: the row's seed and the turn, as the rollout passes them).

  The returned tuple must be (state, observation: str encodable as UTF-8, reward: a
  number finite in float32, done: bool, info: dict whose `protocol.INFO_FLAGS` are bools).
  """
  label = _label(env, where)
  try:
    result = env.step(state, text)
  except Exception as e:
    raise RuntimeError(
      f"{label}: step raised {type(e).__name__}: {e} (assistant text "
      f"{text[:120]!r}); an environment should return an observation for bad input"
    ) from e
  if not isinstance(result, tuple) or len(result) != 5:
    raise TypeError(
      f"{label}: step returned {type(result).__name__}; return "
      "Step(state, observation, reward, done, info) (rlpost.envs.protocol)"
    )
  step = protocol.Step(*result)
  problems = []
  if not isinstance(step.observation, str):
    problems.append(f"observation is {type(step.observation).__name__}, not str")
  elif _not_utf8(step.observation):
    problems.append(_not_utf8(step.observation))
  if isinstance(step.reward, (bool, np.timedelta64)) or not isinstance(
    step.reward, (int, float, np.integer, np.floating)
  ):
    problems.append(f"reward is {type(step.reward).__name__}, not a real number")
  elif _reward_problem(step.reward):
    problems.append(_reward_problem(step.reward))
  if not isinstance(step.done, (bool, np.bool_)):
    problems.append(f"done is {type(step.done).__name__}, not bool")
  if not isinstance(step.info, dict):
    problems.append(f"info is {type(step.info).__name__}, not dict")
  else:
    problems += [
      f"info[{key!r}] is {type(step.info[key]).__name__} {str(step.info[key])[:40]!r}, not bool"
      for key in protocol.INFO_FLAGS
      if key in step.info and not isinstance(step.info[key], (bool, np.bool_))
    ]
  if problems:
    raise TypeError(f"{label}: step returned a bad Step: {'; '.join(problems)}")
  return step


def step_rows(
  env: protocol.Env, states, texts, pool: futures.Executor | None, where: list[str] | None = None
):
  """`checked_step` on each (state, text), concurrently on `pool` (None: in turn); row order kept.

  where: per row, the label its errors carry (the rollout's: "seed 5, row 10, turn 2 of at
    most 4", turns counted from 1; None: none).
  """
  where = [""] * len(states) if where is None else where
  if pool is None:
    return [checked_step(env, s, t, w) for s, t, w in zip(states, texts, where)]
  return list(pool.map(functools.partial(checked_step, env), states, texts, where))


class _Turns(NamedTuple):
  """The sampler's state between turns: `cont` holds the KV cache of the rows `rows`
  (global row indices, in the cache's row order; padding rows repeat one)."""

  cont: continuation.Continuation
  rows: list[int]


class _Calls(NamedTuple):
  """What every sampler call of one rollout shares: the params (decode layout), static
  settings, each row's global id, and the widths of its shapes (module doc)."""

  params: Any
  model_config: Any
  sc: sampling.SamplingConfig
  turns: TurnConfig
  ids: list[int]  # row r's global id: its random numbers
  G: int
  longest: int  # the first prompts' width (the widest over processes)
  chunk: int  # later turns' new tokens are padded to at most this
  fixed_size: int | None  # the cache's slots with `fixed_shapes`
  one_call: bool  # one turn per episode: a single sampler call, no cache kept


@dataclasses.dataclass
class _Row:
  """One episode in flight: its environment state and its completion slots so far."""

  state: Any
  stream: list = dataclasses.field(default_factory=list)  # completion-slot token ids
  sampled: list = dataclasses.field(default_factory=list)  # 1 sampled by the model, 0 not
  logps: list = dataclasses.field(default_factory=list)
  turn_of: list = dataclasses.field(default_factory=list)  # the turn each token belongs to
  rewards: list = dataclasses.field(default_factory=list)  # per turn, as `env.step` gave them
  texts: list = dataclasses.field(default_factory=list)
  observations: list = dataclasses.field(default_factory=list)
  infos: list = dataclasses.field(default_factory=list)
  done: bool = False  # the environment ended the episode
  truncated: bool = False  # the driver did
  kept: int = 0  # tokens of its last turn in the stream
  new: list = dataclasses.field(default_factory=list)  # its last observation's ids
  messages: list = dataclasses.field(default_factory=list)  # the template scaffold's history

  def append(self, ids, sampled: int, logps, turn: int) -> None:
    self.stream += ids
    self.sampled += [sampled] * len(ids)
    self.logps += logps
    self.turn_of += [turn] * len(ids)


def _first_turn(calls: _Calls, prompts, key, limit):
  """Turn 0: the B first prompts, sampled G times each from one shared prefill (the
  single-turn sampler call; `limit` None when the cap is the turn cap). Returns
  (per row: (tokens, logprobs) up to its stop token, _Turns of all N rows)."""
  tokens, lengths = sampling.pad_prompts(prompts, calls.sc, calls.longest)
  ids, G = np.asarray(calls.ids, np.int32), calls.G
  split = sampling.row_sharding(calls.params, len(ids))
  if split is not None:  # each sampler device takes its block of rows
    if len(prompts) % split.mesh.size:  # prompts that do not split: one per row
      tokens, lengths, G = np.repeat(tokens, G, axis=0), np.repeat(lengths, G), 1
    tokens, lengths, ids = jax.device_put((tokens, lengths, ids), split)
  out, cont = continuation.start(
    calls.params,
    tokens,
    lengths,
    key,
    limit,
    ids,
    model_config=calls.model_config,
    config=calls.sc,
    num_samples=G,
    keep_cache=not calls.one_call,  # one-turn episodes (a prompt dataset): no later turn
  )
  out = jax.device_get(out)
  n = len(calls.ids)
  rows = [(out.tokens[i, : out.lengths[i]], out.logprobs[i, : out.lengths[i]]) for i in range(n)]
  return rows, _Turns(cont, list(range(n)))


def _next_turn(calls: _Calls, state: _Turns, rows: list[_Row], alive, key, limit):
  """A later turn: each alive row keeps `kept` tokens of its last turn, then its `new`
  observation tokens are prefilled into its cache and it samples on. The rows sampled
  are all N (`turns.fixed_shapes`: finished ones keep nothing and add nothing) or the
  alive ones padded to a power of two. Returns (per alive row: (tokens, logprobs)), the
  new _Turns)."""
  sc, live = calls.sc, set(alive)
  if calls.turns.fixed_shapes:
    pick, width, size = list(range(len(rows))), calls.chunk, calls.fixed_size
  else:
    pick = alive + [alive[0]] * ((1 << (len(alive) - 1).bit_length()) - len(alive))
    longest_new = max(len(rows[r].new) for r in alive)
    width, size = min(calls.chunk, -(-longest_new // _NEW_BUCKET) * _NEW_BUCKET), None
  where = {r: i for i, r in reversed(list(enumerate(state.rows)))}
  idx = [where[r] for r in pick]
  same = idx == list(range(len(state.rows)))
  cont = state.cont if same else continuation.take_rows(state.cont, idx)
  new = [rows[r].new if r in live else [] for r in pick]
  tokens = np.full((len(pick), width), sc.pad_id, np.int32)
  for i, t in enumerate(new):
    if t:
      tokens[i, width - len(t) :] = t
  kept = np.asarray([rows[r].kept if r in live else 0 for r in pick], np.int32)
  lengths, ids = (
    np.asarray([len(t) for t in new], np.int32),
    np.asarray([calls.ids[r] for r in pick], np.int32),
  )
  split = sampling.row_sharding(calls.params, len(pick))
  if split is not None:  # each sampler device takes its block of rows
    kept, tokens, lengths, ids = jax.device_put((kept, tokens, lengths, ids), split)
  out, cont = continuation.extend(
    calls.params,
    cont,
    kept,
    tokens,
    lengths,
    key,
    limit,
    ids,
    model_config=calls.model_config,
    config=sc,
    cache_size=size,
  )
  out = jax.device_get(out)
  first = {r: i for i, r in reversed(list(enumerate(pick)))}
  sampled = [
    (out.tokens[first[r], : out.lengths[first[r]]], out.logprobs[first[r], : out.lengths[first[r]]])
    for r in alive
  ]
  return sampled, _Turns(cont, pick)


def rollout(
  params,
  env: protocol.Env,
  tasks: list,
  seeds: list[int],
  key: jax.Array,
  *,
  tokenizer,
  model_config,
  sampling_config: sampling.SamplingConfig,
  turns: TurnConfig,
  num_generations: int = 1,
  pool: futures.Executor | None = None,
  first_row: int = 0,
  widest: Callable[[int], int] = int,
) -> Rollout:
  """Runs `num_generations` episodes of every (task, seed); rows are task-major.

  Args:
    params: sampler params (see `policy.sampling_params`).
    env: the environment (`rlpost.envs.protocol`).
    tasks, seeds: one environment task and seed per group of G rows.
    key: PRNG key of the rollout (module docstring).
    tokenizer: encodes observations, decodes turns.
    model_config: the model's static architecture.
    sampling_config: temperature, stop ids, pad id, prompt bucket; its
      `max_new_tokens` must equal `turns.max_turn_tokens`.
    turns: budgets and scaffold.
    num_generations: G episodes per task.
    pool: runs the `env.step` calls of a turn concurrently (None: sequentially).
    first_row: the global id of row 0 when these tasks are one process's block of
      a larger batch: each row's random numbers follow its global id, so the
      episodes do not depend on the process count.
    widest: a width on this process (its longest first prompt; its longest row) -> the
      widest over the processes sampling one batch (`rlpost.train.shares.
      max_over_processes`; one process: itself): every process pads its prompts, and
      sizes its completion slots (`batch_width`), to those. Called twice per rollout.
  """
  sc, G, T = sampling_config, num_generations, turns.max_total_tokens
  _check_rollout_args(sc, turns, tasks, seeds, env)
  firsts = [checked_reset(env, task, seed) for task, seed in zip(tasks, seeds)]
  prompts = [
    scaffold.prompt_ids(tokenizer, turns.template, obs, env.system, turns.layout, env.tools)
    for _, obs in firsts
  ]
  longest = widest(max(len(p) for p in prompts))
  if longest > turns.max_prompt_tokens:
    _refuse_long_prompt(env, prompts, seeds, turns.max_prompt_tokens, longest)
  rows = _new_rows(firsts, G, env, turns)
  keep = frozenset(tokenizer.special_tokens[t] for t in turns.keep_special)
  one_call = env.max_turns == 1
  calls = _make_calls(params, model_config, sc, turns, G, longest, first_row, len(rows), one_call)
  stops = tuple(env.stop_strings) + turns.stop_strings
  alive, turn, sampler = list(range(len(rows))), 0, None
  while alive:
    turn_key = key if turn == 0 else jax.random.fold_in(key, turn)
    limit = min(sc.max_new_tokens, max(T - len(rows[r].stream) for r in alive))
    if turn == 0:
      cap = None if limit == sc.max_new_tokens else limit
      sampled, sampler = _first_turn(calls, prompts, turn_key, cap)
    else:
      sampled, sampler = _next_turn(calls, sampler, rows, alive, turn_key, limit)
    texts = [
      _keep_turn(rows[r], toks, lps, turn, tokenizer, stops, T, keep)
      for r, (toks, lps) in zip(alive, sampled)
    ]
    where = [
      f"seed {seeds[r // G]}, row {first_row + r}, turn {turn + 1} of at most {env.max_turns}"
      for r in alive
    ]
    steps = step_rows(env, [rows[r].state for r in alive], texts, pool, where)
    alive = [
      r
      for r, text, step in zip(alive, texts, steps)
      if _take_step(rows[r], text, step, turn, env, tokenizer, turns, prompts[r // G])
    ]
    turn += 1
  return _finish(rows, env, tasks, seeds, firsts, prompts, G, turns, sc, longest, first_row, widest)


def _new_rows(firsts, G: int, env, turns: TurnConfig) -> list[_Row]:
  """G rows per (state, first observation); with the template scaffold each holds its
  conversation's messages (the prefix check's history)."""
  rows = [_Row(firsts[r // G][0]) for r in range(len(firsts) * G)]
  if turns.template == "template":
    for r, row in enumerate(rows):
      row.messages = template_turns.opening(firsts[r // G][1], env.system)
  return rows


def _make_calls(
  params, model_config, sc, turns: TurnConfig, G, longest, first_row, N, one_call: bool
) -> _Calls:
  # New tokens of a later turn are padded to at most `chunk`; with fixed_shapes the
  # cache holds what the longest history (the padded prompt + T) and one more turn need.
  T = turns.max_total_tokens
  chunk = -(-T // _NEW_BUCKET) * _NEW_BUCKET
  padded_prompt = -(-longest // sc.prompt_bucket) * sc.prompt_bucket
  fixed_size = padded_prompt + T + chunk + 1 + sc.max_new_tokens if turns.fixed_shapes else None
  if not one_call:  # once: each call would copy the layers again (one call lays them out itself)
    params = decoder.decode_layout_once(params)
  ids = [first_row + r for r in range(N)]
  return _Calls(params, model_config, sc, turns, ids, G, longest, chunk, fixed_size, one_call)


def _check_rollout_args(sc, turns: TurnConfig, tasks, seeds, env) -> None:
  if sc.max_new_tokens != turns.max_turn_tokens:
    raise ValueError(
      f"sampling_config.max_new_tokens={sc.max_new_tokens} must equal "
      f"turns.max_turn_tokens={turns.max_turn_tokens} (the per-turn cap)"
    )
  if len(tasks) != len(seeds) or not tasks:
    raise ValueError(
      f"need one seed per task and at least one task: {len(tasks)} tasks, {len(seeds)} seeds"
    )
  protocol.check_env(env)


def _keep_turn(row: _Row, toks, lps, turn: int, tokenizer, stops, T: int, keep) -> str:
  """Appends a turn's sampled tokens to `row` up to its stop (string or token) and the
  row's remaining slots; returns their text (what the environment is shown; control
  tokens dropped except the ids in `keep`)."""
  toks = [int(t) for t in toks]
  end = batch_lib.stop_length(toks, tokenizer, stops)
  n = min(len(toks) if end is None else end, T - len(row.stream))
  row.kept = n
  row.append(toks[:n], 1, [float(x) for x in lps[:n]], turn)
  return template_turns.decode_keeping(tokenizer, toks[:n], keep)


def _observation(row: _Row, text: str, step, closed: bool, env, tokenizer, turns, prompt):
  """The ids of the observation after a turn. The template scaffold renders the
  observation (a user message, or a native tool format's `tool` messages) and records
  in the turn's info whether re-rendering the row's conversation extends its tokens
  (`prefix_mismatch`, the rollout's `template/prefix_mismatch`)."""
  if turns.template != "template":
    return scaffold.observation_ids(tokenizer, turns.template, step.observation, closed)
  messages = list(step.info.get("tool_messages") or [])
  messages = messages or [{"role": "user", "content": step.observation}]
  obs = scaffold.observation_ids(
    tokenizer, turns.template, step.observation, closed, turns.layout, messages, env.tools
  )
  assistant = step.info.get("assistant_message") or {"role": "assistant", "content": text}
  row.messages += [assistant, *messages]
  again = template_turns.history_ids(turns.layout, tokenizer, row.messages, env.tools)
  row.infos[-1]["prefix_mismatch"] = template_ids.prefix_mismatch(prompt + row.stream + obs, again)
  return obs


def _take_step(row: _Row, text: str, step, turn: int, env, tokenizer, turns, prompt) -> bool:
  """Records `env.step`'s answer to `text` in `row` and appends the observation's ids;
  False when the episode is over (done, out of turns, or no room for the observation
  and one sampled token)."""
  max_turns = env.max_turns
  row.state = step.state
  row.rewards.append(float(step.reward))
  row.texts.append(text)
  row.observations.append(step.observation)
  row.infos.append(dict(step.info))
  if step.done:
    row.done = True
    return False
  closed = bool(row.stream) and row.sampled[-1] == 1 and row.stream[-1] == tokenizer.end_of_turn_id
  obs = _observation(row, text, step, closed, env, tokenizer, turns, prompt)
  if turn + 1 >= max_turns or len(row.stream) + len(obs) + 1 > turns.max_total_tokens:
    row.truncated = True
    return False
  row.append(obs, 0, [0.0] * len(obs), turn)
  row.new = obs
  return True


def batch_width(used: int, turns: TurnConfig, capacity: int, widest=int) -> int:
  """T, a batch's completion slots: `turns.max_total_tokens` with `fixed_shapes`; else
  `used` (this process's longest row; `widest`: the longest over the processes sampling
  the batch) rounded up to WIDTH_BUCKET, at most `max_total_tokens`. A loss-slot
  `capacity` below `max_total_tokens` is a floor (+ 1): every batch of a run then has
  `loss_slots` (`batch.with_loss_slots`), or none does."""
  T = turns.max_total_tokens
  if turns.fixed_shapes:
    return T
  floor = capacity + 1 if capacity < T else 1
  return min(T, -(-max(widest(used), floor) // WIDTH_BUCKET) * WIDTH_BUCKET)


def _finish(
  rows, env, tasks, seeds, firsts, prompts, G, turns, sc, longest, first_row, widest
) -> Rollout:
  """The Rollout of the finished rows: the RLBatch, rewards (checked finite in float32),
  turn rewards on their tokens, and the Episodes."""
  # a row samples at most max_turns x max_turn_tokens of its slots: only those are
  # projected onto the vocabulary (the bound comes from the config: same shapes on
  # every process and every iteration)
  capacity = env.max_turns * turns.max_turn_tokens
  T = batch_width(max(len(row.stream) for row in rows), turns, capacity, widest)
  batch = _stream_batch(prompts, G, rows, T, sc, longest)
  batch = batch_lib.with_loss_slots(batch, capacity)
  if turns.mask_truncated:
    keep = ~np.asarray([row.truncated for row in rows])[:, None]
    batch = dataclasses.replace(batch, loss_mask=batch.loss_mask * keep)
  episodes = [
    Episode(
      task=tasks[r // G],
      seed=seeds[r // G],
      first_observation=firsts[r // G][1],
      reward=float(sum(row.rewards)),
      turn_rewards=row.rewards,
      texts=row.texts,
      observations=row.observations,
      infos=row.infos,
      done=row.done,
      truncated=row.truncated,
    )
    for r, row in enumerate(rows)
  ]
  with np.errstate(over="ignore"):  # an overflow is reported below
    rewards = np.asarray([e.reward for e in episodes], np.float32)
  for r in np.flatnonzero(~np.isfinite(rewards)):
    raise ValueError(
      f"environment {env.name!r} (seed {seeds[r // G]}, row {first_row + r}): the turn "
      f"rewards {episodes[r].turn_rewards} sum to {episodes[r].reward:.4g}, beyond float32 "
      f"(|reward| <= {FLOAT32_MAX:.4g}); scale the environment's rewards down"
    )
  placed = place_turn_rewards([e.turn_rewards for e in episodes], batch.turn_ids, batch.loss_mask)
  return Rollout(batch, rewards, placed, episodes)


def _refuse_long_prompt(env, prompts, seeds, cap: int, longest: int):
  """Raises the error of a first prompt above `cap` tokens; every process raises it
  (`longest` is the widest over processes), the one holding the prompt names its seed."""
  mine = max(range(len(prompts)), key=lambda k: len(prompts[k]))
  which = (
    f"seed {seeds[mine]}'s first observation"
    if len(prompts[mine]) == longest
    else "a first observation on another process"
  )
  raise errors.ConfigError(
    f"environment {env.name!r}: {which} is {longest} tokens in its scaffold, above "
    f"TurnConfig.max_prompt_tokens={cap} (config.rollout.max_prompt_tokens); raise it "
    "(every turn's prefill covers the first prompt) or shorten what reset returns"
  )


def _stream_batch(prompts, G, rows: list[_Row], T, sc, longest) -> batch_lib.RLBatch:
  """The RLBatch of the rows: first prompts left-padded to the bucket of `longest`
  tokens, then T completion slots.

  turn_ids: the turn a slot's token belongs to (an observation: the turn it answers,
  whose sampled tokens it follows; the next turn reads it), -1 on empty slots.
  """
  N = len(rows)
  P = -(-longest // sc.prompt_bucket) * sc.prompt_bucket
  tokens = np.full((N, P + T), sc.pad_id, np.int32)
  valid = np.zeros((N, P + T), bool)
  positions = np.zeros((N, P + T), np.int32)
  loss_mask = np.zeros((N, T), np.float32)
  logp = np.zeros((N, T), np.float32)
  turn_ids = np.full((N, T), -1, np.int32)
  for r, row in enumerate(rows):
    prompt, n = prompts[r // G], len(row.stream)
    tokens[r, P - len(prompt) : P] = prompt
    valid[r, P - len(prompt) : P] = True
    positions[r, P - len(prompt) : P] = np.arange(len(prompt))
    positions[r, P:] = len(prompt) + np.arange(T)
    tokens[r, P : P + n] = row.stream
    valid[r, P : P + n] = True
    loss_mask[r, :n] = row.sampled
    logp[r, :n] = row.logps
    turn_ids[r, :n] = row.turn_of
  return batch_lib.RLBatch(
    tokens=tokens,
    positions=positions,
    valid=valid,
    loss_mask=loss_mask,
    sampler_logp=logp,
    turn_ids=turn_ids,
  )
