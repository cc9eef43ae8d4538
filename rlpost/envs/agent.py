"""An agent is an environment: user code `run(client, task) -> reward` behind the endpoint.

`--config.env.name=agent --config.env.agent=mypkg.agent:run` (`rlpost.serve.agents`: a
plain function given an `openai.OpenAI`, or an `async def` given an `openai.AsyncOpenAI`;
requests name the model MODEL_NAME). Each rollout serves the sampler's weights of the
iteration on an in-process endpoint (127.0.0.1, a free port, the run's sampling
temperature whatever a request asks: the trainer divides the logits by it), plays G
episodes per task on threads, and lays each episode's recorded tokens out as RLBatch rows
(`rollout_of`): loss on the sampled tokens only, prompts, observations and tool results
masked, the sampler's logprobs kept.

Tasks (`tasks`): `jsonl`, one JSON value per line of `path`, handed to the agent as is
(drawn by the data cursor, shuffled each epoch); `arithmetic`, {"question", "answer"} of
two-digit sums, differences and products drawn from the seed; `frozenlake`, {"map",
"seed", "max_turns"}: a `size` x `size` map of `rlpost.envs.frozenlake` from the seed.

Split episodes. An agent that edits its history makes the session's tokens split into
segments (`sessions.segments`, counted as `agent/prefix_breaks`); each segment is a row
trained on its own sampled tokens with the episode's reward. Row k of the first B*G is
episode k's last segment; earlier segments follow in whole groups of G that mirror
their task's group: row g of such a group is episode g's earlier segment, or a row with
no loss tokens, and every row carries its episode's reward, so a group-relative
advantage (GRPO, RLOO, Dr. GRPO) of an earlier segment is its episode's. Blank groups
(no loss tokens) then pad the rows to a multiple of B*G, which the micro-batches divide.

Failed episodes (the agent raised, hung past `timeout_s`, or returned a non-finite
reward) keep their rows with loss_mask 0 and reward 0 (still in their group's baseline)
and count in `agent/errors`. Episode metrics (reward/mean, turns/mean) count every row,
a split episode once per segment; `agent/reward` is over episodes. One process only.
"""

import dataclasses
import json
import logging
import pathlib
from typing import NamedTuple

import jax
import numpy as np

from rlpost import errors

from rlpost.envs import frozenlake
from rlpost.envs import multiturn
from rlpost.envs import protocol
from rlpost.rl import batch as batch_lib
from rlpost.serve import agents
from rlpost.serve import chat
from rlpost.serve import engine as engine_lib
from rlpost.serve import scheduler
from rlpost.serve import server
from rlpost.serve import sessions

MODEL_NAME = "policy"
TASK_SOURCES = ("jsonl", "arithmetic", "frozenlake")
WIDTH_BUCKET = 64  # completion slots rounded up to a multiple (compilations of the passes)


@dataclasses.dataclass(frozen=True)
class AgentEnvConfig:
  """The `env` block of `env.name=agent`: agent (`module:function`), tasks (TASK_SOURCES),
  path (jsonl's file), size (frozenlake's map side), timeout_s (an episode's wall-clock
  limit), threads (episodes played at once)."""

  agent: str = ""
  tasks: str = "arithmetic"
  path: str = ""
  size: int = 2
  timeout_s: float = 300.0
  threads: int = 32

  def __post_init__(self):
    if self.tasks not in TASK_SOURCES:
      raise ValueError(f"tasks={self.tasks!r}: use one of {TASK_SOURCES}")
    if self.tasks == "jsonl" and not pathlib.Path(self.path).is_file():
      raise ValueError(f"path={self.path!r}: tasks=jsonl needs a file of one JSON task a line")
    if self.size < 2:
      raise ValueError(f"size={self.size}: a frozenlake map needs size >= 2")
    agents.AgentConfig(self.agent or "-:-", self.timeout_s, self.threads)  # checks both
    agents.load(self.agent)  # agent=...: names the reference and the fix


def arithmetic_task(seed: int) -> dict:
  """{"question", "answer"}: a two-digit +, - or * drawn from `seed`."""
  rng = np.random.default_rng(seed)
  a, b = (int(x) for x in rng.integers(10, 100, 2))
  op = "+-*"[int(rng.integers(3))]
  answer = {"+": a + b, "-": a - b, "*": a * b}[op]
  return {"question": f"What is {a} {op} {b}?", "answer": str(answer)}


def frozenlake_task(seed: int, size: int) -> dict:
  """{"map", "seed", "max_turns"}: a size x size map with a path (`frozenlake.generate_map`)."""
  return {"map": list(frozenlake.generate_map(size, seed)), "seed": seed, "max_turns": 2 * size}


def _task_source(config: AgentEnvConfig):
  """(tasks_of(seeds), pool, content_key) of the config's task source."""
  if config.tasks == "jsonl":
    lines = [ln for ln in pathlib.Path(config.path).read_text().splitlines() if ln.strip()]
    items = [json.loads(ln) for ln in lines]
    return (lambda seeds: [items[s % len(items)] for s in seeds]), len(items), None
  if config.tasks == "arithmetic":
    make = lambda seeds: [arithmetic_task(s) for s in seeds]
    return make, None, lambda task, seed: task["question"]
  make = lambda seeds: [frozenlake_task(s, config.size) for s in seeds]
  return make, None, lambda task, seed: tuple(task["map"])


def build(config: AgentEnvConfig, run: protocol.RunInfo) -> protocol.EnvTasks:
  """The agent environment (module docstring); `env` is a placeholder the recipe's
  checks read (name, max_turns), the episodes are the player's."""
  del run
  make, pool, key = _task_source(config)
  env = protocol.Env("agent", _no_reset, _no_step, max_turns=1)
  player = protocol.Player(lambda *a, **k: play(config, *a, **k), metrics)
  return protocol.EnvTasks(
    env, make, make, pool=pool, shuffle=pool is not None, content_key=key, player=player
  )


def _no_reset(task, seed):
  raise NotImplementedError("env.name=agent: episodes are played by its agent, not reset")


def _no_step(state, text):
  raise NotImplementedError("env.name=agent: episodes are played by its agent, not stepped")


def _agent_config(config: AgentEnvConfig) -> agents.AgentConfig:
  return agents.AgentConfig(config.agent, config.timeout_s, config.threads)


def play(config: AgentEnvConfig, params, tasks, seeds, key, **kw) -> multiturn.Rollout:
  """G episodes of each task by the agent through an endpoint on `params`: a
  `multiturn.Rollout` (`rollout_of`). kw: tokenizer, model_config, sampling_config,
  turns, num_generations (`protocol.Player.play`). A request holds at most
  rollout.max_prompt_tokens + rollout.max_total_tokens tokens (the endpoint's context,
  a longer one is answered 400 and fails its episode), max_turn_tokens new ones."""
  del key  # each request draws its own seed (or the agent's)
  if jax.process_count() > 1:
    raise errors.ConfigError(
      f"config.env.name=agent plays on one process; this run has {jax.process_count()}"
    )
  tok, turns, sc, G = kw["tokenizer"], kw["turns"], kw["sampling_config"], kw["num_generations"]
  layout = turns.layout
  engine = engine_lib.Engine(
    params,
    kw["model_config"],
    tok,
    MODEL_NAME,
    context=turns.max_prompt_tokens + turns.max_total_tokens,
    max_tokens=turns.max_turn_tokens,
    chat=chat.setup(layout.template if layout else None, "native"),
    temperature=sc.temperature,
  )
  settings = server.ServerConfig(port=0, request_timeout_s=config.timeout_s)
  each = [t for t in tasks for _ in range(G)]
  # a batch closes as soon as every live episode's request waits (not after the window)
  batching = scheduler.BatchConfig(max_batch=min(config.threads, len(each)))
  agent = agents.load(config.agent)
  for name in ("httpx", "httpx2"):  # the openai client logs every request at INFO
    logging.getLogger(name).setLevel(logging.WARNING)
  with server.serve_in_thread(engine, settings, batching) as endpoint:
    played = agents.play(endpoint, agent, each, _agent_config(config))
  return rollout_of(played, seeds, G, tok, sc.prompt_bucket)


class _Row(NamedTuple):
  segment: sessions.Segment
  episode: int  # index into the played episodes
  mirror: bool  # a row after the first B*G (an earlier segment, or a blank)
  weight: float  # 0: no loss (a failed episode, a blank)


def _rows(played: list, G: int, blank: sessions.Segment) -> list[_Row]:
  """Each episode's last segment in order, then the mirror groups of earlier segments
  (module docstring); an episode with no request has a blank."""
  segs = [list(e.segments) or [blank] for e in played]
  w = [e.weight if e.segments else 0.0 for e in played]
  rows = [_Row(s[-1], k, False, w[k]) for k, s in enumerate(segs)]
  for first in range(0, len(played), G):
    group = range(first, first + G)
    for depth in range(1, max(len(segs[k]) for k in group)):
      rows += [
        _Row(segs[k][-1 - depth], k, True, w[k])
        if depth < len(segs[k])
        else _Row(blank, k, True, 0.0)
        for k in group
      ]
  # Whole blank groups (task 0's) until the rows are a multiple of B*G: the train step's
  # micro-batches divide B*G (checked when the run starts), not B*G plus a mirror group.
  while len(rows) % len(played):
    rows += [_Row(blank, k, True, 0.0) for k in range(G)]
  return rows


def _turn_ids(loss_NxT: np.ndarray, valid_NxT: np.ndarray) -> np.ndarray:
  """[N, T] int32: the turn a completion slot belongs to (a run of sampled tokens starts a
  turn; the prompt tokens after it are that turn's), -1 on empty slots."""
  sampled = loss_NxT > 0
  starts = sampled & ~np.pad(sampled, ((0, 0), (1, 0)))[:, :-1]
  return np.where(valid_NxT, np.maximum(np.cumsum(starts, axis=1) - 1, 0), -1).astype(np.int32)


def rollout_of(played: list, seeds, G: int, tokenizer, prompt_bucket: int) -> multiturn.Rollout:
  """The Rollout of played episodes (`agents.Episode`, G per task, task-major): rows as
  the module docstring lays them out, rewards [N] and turn rewards [N, T] (the reward on
  a row's last sampled token), a `multiturn.Episode` per row."""
  blank = sessions.Segment((tokenizer.pad_id,), (0,), (0.0,))
  rows = _rows(played, G, blank)
  fields = sessions.rows([r.segment for r in rows], tokenizer.pad_id, prompt_bucket, WIDTH_BUCKET)
  T = fields["loss_mask"].shape[1]
  weight_N1 = np.asarray([[r.weight] for r in rows], np.float32)
  fields["loss_mask"] = fields["loss_mask"] * weight_N1
  fields["sampler_logp"] = fields["sampler_logp"] * weight_N1
  fields["turn_ids"] = _turn_ids(fields["loss_mask"], fields["valid"][:, -T:])
  batch = batch_lib.RLBatch(**fields)
  rewards = np.asarray([played[r.episode].reward for r in rows], np.float32)
  turn_rewards = np.zeros_like(batch.loss_mask)
  for n in np.flatnonzero(batch.loss_mask.any(axis=1)):
    turn_rewards[n, np.flatnonzero(batch.loss_mask[n])[-1]] = rewards[n]
  episodes = [
    _transcript(played[r.episode], seeds[r.episode // G], r.segment, r.mirror, tokenizer)
    for r in rows
  ]
  return multiturn.Rollout(batch, rewards, turn_rewards, episodes)


def _transcript(e: agents.Episode, seed: int, segment, mirror: bool, tokenizer):
  """The `multiturn.Episode` of one row: its runs of sampled tokens decoded as turns."""
  runs, run = [], []
  for token, sampled in zip(segment.tokens, segment.loss_mask):
    if sampled:
      run.append(token)
    elif run:
      runs, run = runs + [run], []
  runs += [run] if run else []
  texts = [tokenizer.decode(r) for r in runs] or [""]
  infos = [{} for _ in texts]
  infos[-1] = {
    "agent/error": e.error,
    "agent/prefix_breaks": e.prefix_breaks,
    "agent/mirror": mirror,
  }
  first = e.task if isinstance(e.task, str) else json.dumps(e.task)
  observations = [""] * (len(texts) - 1) + [e.error or ""]
  return multiturn.Episode(
    e.task, seed, first, e.reward, [e.reward], texts, observations, infos, False, False
  )


def metrics(episodes: list) -> dict:
  """agent/errors (failed episodes), agent/prefix_breaks (over episodes), agent/split_rows
  (rows of earlier segments), agent/reward (mean over episodes)."""
  last = [e.infos[-1] for e in episodes]
  own = [(e, i) for e, i in zip(episodes, last) if not i["agent/mirror"]]
  return {
    "agent/errors": sum(i["agent/error"] is not None for _, i in own),
    "agent/prefix_breaks": sum(i["agent/prefix_breaks"] for _, i in own),
    "agent/split_rows": len(episodes) - len(own),
    "agent/reward": float(np.mean([e.reward for e, _ in own])) if own else 0.0,
  }
