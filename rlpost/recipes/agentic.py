"""Multi-turn agentic RL from a ConfigDict (configs/agentic.py): GRPO or PPO over trajectories.

Rollouts are the only data source: tasks come from environment seeds, there
is no dataloader. One iteration:

  B task seeds -> G episodes each (multi-turn rollout, `rlpost.envs.multiturn`)
  -> trajectory rewards -> `config.learner`:
     grpo: group advantages on the model's tokens -> `grpo.update` (ref / old
       logprobs, train steps)
     ppo (G = 1): the reward on each episode's last sampled token (`per_turn_rewards`:
       each turn's on that turn's last) -> `ppo.update`
       (critic values, GAE over the stream: observation tokens are transparent,
       value targets; actor + critic train step)
  -> [every eval.every iterations: greedy episodes on held-out seeds, transcripts to
      eval_trajectories.jsonl]
  -> [every log.trajectories_every iterations: transcripts to trajectories.jsonl]

Training seeds of iteration i are i*B .. i*B+B-1; held-out seeds start at
`eval.seed_offset`, which training never reaches (checked).
"""

import dataclasses
import functools
import json
import os
import time
from concurrent import futures
from typing import Any, NamedTuple

import jax
import numpy as np
import tqdm

from rlpost import sampling
from rlpost.envs import multiturn
from rlpost.envs import protocol
from rlpost.envs import table as env_table
from rlpost.models import policy
from rlpost.recipes import common
from rlpost.recipes import grpo
from rlpost.recipes import ppo
from rlpost.recipes import rollout as rollout_lib
from rlpost.rl import advantages as adv_lib
from rlpost.rl import batch as batch_lib
from rlpost.rl import objectives
from rlpost.train import host_memory
from rlpost.train import loop as loop_lib
from rlpost.train import metrics as metrics_lib
from rlpost.train import shares
from rlpost.train import sharding
from rlpost.train import step as step_lib
from rlpost.text import tool_syntax

LEARNERS = ("grpo", "ppo")
EPISODE_ACCURACY = ("answer_accuracy", "format_accuracy")  # last-turn info keys averaged
TRANSCRIPTS = "trajectories.jsonl"  # sampled training episodes
EVAL_TRANSCRIPTS = "eval_trajectories.jsonl"  # greedy held-out episodes


class GRPOLearnerSetup(NamedTuple):
  """What `grpo.update` reads of a setup."""

  algo: objectives.GRPOConfig
  forward: policy.ForwardConfig


class Learner(NamedTuple):
  """The `p` of `grpo.update` / `ppo.update`: their setup, frozen weights and train step."""

  setup: Any  # GRPOLearnerSetup | ppo.Setup
  frozen: Any
  ref_params: Any
  train_step: Any


@dataclasses.dataclass(frozen=True)
class Setup:
  """Static pieces of an agentic run, resolved once from the ConfigDict."""

  learner: str
  num_generations: int  # episodes per task (PPO: 1)
  forward: policy.ForwardConfig
  turns: multiturn.TurnConfig
  sampling: sampling.SamplingConfig
  greedy: sampling.SamplingConfig
  batch_tasks: int
  eval_every: int
  eval_tasks: int
  eval_batch_tasks: int  # greedy episodes per rollout call (0: all at once)
  eval_seed_offset: int
  trajectories_every: int
  trajectories_logged: int
  step_threads: int
  per_turn_rewards: bool  # PPO: each turn's reward on its last token (else their sum on the last)


class Pieces(NamedTuple):
  """Everything an agentic run is built from (see `build`)."""

  setup: Setup
  tokenizer: Any
  tasks: protocol.EnvTasks  # the environment and its tasks
  state: Any
  learner: Learner
  sampler: rollout_lib.Sampler  # where rollouts run


def make_env(cfg) -> protocol.EnvTasks:
  """The `env` block's environment from the table (`rlpost.envs.table`), with the `tools`
  block's tools when enabled, and its tasks."""
  config = env_table.env_config(cfg.env)
  run = protocol.RunInfo(
    seed=cfg.seed,
    eval_seed_offset=cfg.eval.seed_offset,
    eval_tasks=cfg.eval.num_tasks,
    max_result_chars=cfg.tools.max_result_chars,
  )
  return env_table.make(cfg.env.name, config, run, cfg.tools.enabled)


def check_config(cfg):
  """Validates the ConfigDict before anything is loaded.

  Returns (learner setup: GRPOLearnerSetup | ppo.Setup, episodes per task, TurnConfig).
  """
  if cfg.learner not in LEARNERS:
    common.fail("learner", cfg.learner, f"use one of {LEARNERS}")
  turns = common.from_block(multiturn.TurnConfig, cfg.rollout, "rollout")
  t, s, ev = cfg.train, cfg.sampling, cfg.eval
  rollout_lib.check_training_sampling(
    s,
    "the trainer's logprobs divide the logits by it, and greedy episodes of a task are identical",
    "greedy validation uses eval.* instead",
  )
  if turns.max_total_tokens < turns.max_turn_tokens:
    common.fail(
      "rollout.max_total_tokens",
      turns.max_total_tokens,
      f"is below rollout.max_turn_tokens={turns.max_turn_tokens}: every episode would be cut "
      "inside its first turn; give room for env.max_turns turns and their observations",
    )
  if cfg.rollout_threads < 1:
    common.fail("rollout_threads", cfg.rollout_threads, "must be >= 1 thread")
  if cfg.log.trajectories_every < 0:  # -1 would write them every iteration
    common.fail("log.trajectories_every", cfg.log.trajectories_every, "must be >= 0 (0: never)")
  if cfg.log.trajectories_logged < 0:  # -1 would keep all but the last
    common.fail("log.trajectories_logged", cfg.log.trajectories_logged, "must be >= 0 episodes")
  if cfg.tools.max_result_chars < len(tool_syntax.TRUNCATION_MARKER):
    common.fail(
      "tools.max_result_chars",
      cfg.tools.max_result_chars,
      f"must be >= {len(tool_syntax.TRUNCATION_MARKER)} (the truncation marker's length)",
    )
  if t.batch_tasks < 1:
    common.fail("train.batch_tasks", t.batch_tasks, "must be >= 1")
  if cfg.learner == "ppo":
    learner = ppo.learner_setup(cfg, t.batch_tasks, "train.batch_tasks (one episode each)")
    num_generations = 1
  else:
    algo = common.from_block(objectives.GRPOConfig, cfg.algo, "algo", grpo.RENAMED)
    learner = GRPOLearnerSetup(algo, common.forward_config(cfg, s.temperature))
    num_generations = algo.num_generations
    rows_text = "train.batch_tasks * algo.num_generations"
    common.check_rows_per_device(cfg, t.batch_tasks * num_generations, rows_text)
  if ev.every < 0 or ev.num_tasks < 1 or ev.batch_tasks < 0:
    common.fail(
      "eval",
      f"every={ev.every}, num_tasks={ev.num_tasks}, batch_tasks={ev.batch_tasks}",
      "use every >= 0, num_tasks >= 1, batch_tasks >= 0 (0: all tasks in one rollout)",
    )
  rollout_lib.check_off_policy(cfg, cfg.max_staleness, learner.algo.tis_cap, "max_staleness")
  if cfg.per_turn_rewards and cfg.learner != "ppo":
    common.fail(
      "per_turn_rewards",
      True,
      "only PPO places rewards per token; GRPO's advantage is per episode (of the summed "
      "reward): use False, or learner ppo (the ',ppo' variant)",
    )
  if t.steps * t.batch_tasks > ev.seed_offset:
    common.fail(
      "eval.seed_offset",
      ev.seed_offset,
      f"training uses seeds up to train.steps * train.batch_tasks = {t.steps * t.batch_tasks}; "
      "held-out seeds must start above them",
    )
  common.check_loop_settings(
    cfg,
    min_steps=0 if ev.every else 1,
    steps_fix="must be >= 1, or 0 with eval.every > 0 (greedy evaluation only)",
  )
  return learner, num_generations, turns


def build(cfg, loaded=None) -> Pieces:
  """Loads the model (or takes `loaded` = (config, params, tokenizer)) and builds the run."""
  learner_setup, num_generations, turns = check_config(cfg)
  env_tasks = make_env(cfg)
  _, params, tokenizer = loaded or common.load_model(cfg)
  sc = sampling.SamplingConfig(
    temperature=cfg.sampling.temperature,
    stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id),
    max_new_tokens=turns.max_turn_tokens,
    pad_id=tokenizer.pad_id,
    prompt_bucket=cfg.sampling.prompt_bucket,
  )
  setup = Setup(
    learner=cfg.learner,
    num_generations=num_generations,
    forward=learner_setup.forward,
    turns=turns,
    sampling=sc,
    greedy=dataclasses.replace(sc, temperature=0.0),
    batch_tasks=cfg.train.batch_tasks,
    eval_every=cfg.eval.every,
    eval_tasks=cfg.eval.num_tasks,
    eval_batch_tasks=cfg.eval.batch_tasks,
    eval_seed_offset=cfg.eval.seed_offset,
    trajectories_every=cfg.log.trajectories_every,
    trajectories_logged=cfg.log.trajectories_logged,
    step_threads=cfg.rollout_threads,
    per_turn_rewards=cfg.per_turn_rewards,
  )
  if cfg.learner == "ppo":
    learner_setup, state, frozen, train_step = ppo.build_learner(cfg, params, learner_setup)
    learner = Learner(learner_setup, frozen, None, train_step)
  else:
    state, frozen, ref_params, train_step = grpo.build_policy(
      cfg, params, learner_setup.algo, learner_setup.forward
    )
    learner = Learner(learner_setup, frozen, ref_params, train_step)
  sampler = rollout_lib.make_sampler(cfg, learner.frozen, setup.forward)
  return Pieces(setup, tokenizer, env_tasks, state, learner, sampler)


def run(cfg, workdir: str, stop_after: int | None = None, loaded=None):
  """Trains until cfg.train.steps iterations are done (or `stop_after` in this call).

  Resumes from the newest checkpoint in `workdir`. Returns the final TrainState.
  """
  cfg = common.with_compute_dtype(cfg, workdir)
  cfg = common.with_int8_paths(cfg, workdir)
  p = build(cfg, loaded)
  curves = ("reward/mean", "success", "greedy/success", "turns/mean", "invalid_action_rate")
  loop = loop_lib.loop_config(
    cfg, f"agentic[{cfg.name}]", curves, ("reward/mean", "greedy/success")
  )
  with futures.ThreadPoolExecutor(p.setup.step_threads) as pool:
    step_fn, close, carry = loop_step(p, pool, workdir, cfg.max_staleness, cfg.train.steps)
    try:
      state, _ = loop_lib.run_loop(
        workdir,
        cfg,
        p.state,
        step_fn,
        loop,
        initial_metrics=functools.partial(initial_metrics, p, pool, workdir),
        stop_after=stop_after,
        carry=carry,
      )
    finally:
      close()
  return state


def initial_metrics(p: Pieces, pool, workdir: str, state) -> dict:
  """Step 0's record: greedy episodes on the held-out seeds before training."""
  return evaluate(p, pool, state, workdir, 0) if p.setup.eval_every else {}


def evaluate(p: Pieces, pool, state, workdir: str, step: int) -> dict:
  """Greedy episodes (temperature 0, one per task) on the held-out seeds: greedy/* metrics.

  The first `log.trajectories_logged` transcripts go to workdir/eval_trajectories.jsonl.
  With several processes every process plays all of them (the same greedy episodes).
  """
  setup = p.setup
  seeds = [setup.eval_seed_offset + k for k in range(setup.eval_tasks)]
  chunk = setup.eval_batch_tasks or len(seeds)
  episodes = []
  progress = tqdm.trange(  # one tick per chunk of held-out tasks
    0, len(seeds), chunk, desc=f"eval@{step}", leave=False, disable=jax.process_index() > 0
  )
  for first in progress:
    part = seeds[first : first + chunk]
    tasks_ = p.tasks.eval_tasks(part)
    out = _rollout(p, pool, state, tasks_, part, jax.random.key(0), setup.greedy, 1)
    episodes += out.episodes
  write_trajectories(workdir, step, episodes[: setup.trajectories_logged], EVAL_TRANSCRIPTS)
  return {f"greedy/{k}": v for k, v in episode_metrics(episodes).items()}


def _rollout(
  p: Pieces, pool, state, tasks_, seeds, key, sc, num_generations, first_row=0
) -> multiturn.Rollout:
  """Episodes of `tasks_` by `state`'s policy, sampled by this process alone, from the
  policy's own weights (the evaluation's: even when training rollouts read an int8 copy)."""
  actor = state.trainable["actor"] if p.setup.learner == "ppo" else state.trainable
  mesh = sharding.mesh_of(state)
  sampler = p.sampler._replace(int8=None)
  params_s, key = rollout_lib.sampler_weights(sampler, actor, p.setup.forward, key, mesh)
  return _play(p, pool, params_s, tasks_, seeds, key, sc, num_generations, first_row)


def _play(p: Pieces, pool, params_s, tasks_, seeds, key, sc, num_generations, first_row):
  out = multiturn.rollout(
    params_s,
    p.tasks.env,
    tasks_,
    seeds,
    key,
    tokenizer=p.tokenizer,
    model_config=p.setup.forward.model,
    sampling_config=sc,
    turns=p.setup.turns,
    num_generations=num_generations,
    pool=pool,
    first_row=first_row,
    widest=lambda n: int(shares.max_over_processes([n])[0]),
  )
  del params_s
  host_memory.release_freed_memory()  # the sampler's weight copies, before the train step
  return out


def iteration(p: Pieces, pool, workdir: str, state, cursor, index: int):
  """One synchronous iteration (module docstring). The cursor is passed through."""
  step = loop_step(p, pool, workdir, None, index + 1)[0]
  return step(state, cursor, index)


def loop_step(p: Pieces, pool, workdir: str, max_staleness, steps: int):
  """The run loop's (step_fn, close, carry): `produce` then `train` in turn, or pipelined
  (`rollout.loop_step`)."""
  return rollout_lib.loop_step(
    p,
    functools.partial(produce, pool=pool),
    functools.partial(train, pool=pool, workdir=workdir),
    "actor" if p.setup.learner == "ppo" else None,
    max_staleness,
    steps,
  )


def produce(p: Pieces, weights, cursor, index: int, pool=None):
  """Iteration `index`'s episodes, played with `weights` ((params, base key) on the
  sampler's devices); each process plays its block of the task seeds
  (`rlpost.train.shares`). Returns ((rollout, metrics, seconds), cursor)."""
  setup, start = p.setup, time.perf_counter()
  B, G = setup.batch_tasks, setup.num_generations
  mine = shares.block(B, "train.batch_tasks")
  seeds = [index * B + b for b in range(B)][mine]
  params_s, key = weights
  key = jax.random.fold_in(key, index)
  out = _play(
    p, pool, params_s, p.tasks.train_tasks(seeds), seeds, key, setup.sampling, G, mine.start * G
  )
  return (out, episode_metrics(out.episodes), time.perf_counter() - start), cursor


def train(p: Pieces, state, sampled, index: int, version: int, publish=None, pool=None, workdir=""):
  """The update on `produce`'s episodes (played by policy `version`; TIS corrects an older
  one), then the due evaluation and transcripts. Returns (state, publish(new state) or
  None, metrics)."""
  out, metrics, rollout_s = sampled
  setup, start = p.setup, time.perf_counter()
  metrics = dict(metrics)
  mesh = sharding.mesh_of(state)
  if setup.learner == "ppo":
    scores = out.turn_rewards if setup.per_turn_rewards else out.rewards
    batch = step_lib.global_batch(dataclasses.replace(out.batch, scores=scores), mesh)
    batch = batch_lib.to_device(batch)
    state, update_metrics = ppo.update(p.learner, state, batch, batch.scores, index)
  else:
    algo = p.learner.setup.algo
    rewards = shares.all_rows(out.rewards)
    metrics["zero_signal_groups"] = float(
      np.mean(np.asarray(adv_lib.zero_signal_groups(rewards, setup.num_generations)))
    )
    advantages = grpo.process_advantages(rewards, algo)
    batch = step_lib.global_batch(dataclasses.replace(out.batch, advantages=advantages), mesh)
    state, update_metrics = grpo.update(p.learner, state, batch_lib.to_device(batch))
  metrics.update(update_metrics)
  weights = publish(state) if publish else None
  metrics["time/rollout_s"] = rollout_s
  forward_s = metrics.get("time/forward_s", 0.0)  # PPO's critic pass, when separate
  metrics["time/train_s"] = time.perf_counter() - start - forward_s
  if setup.eval_every and (index + 1) % setup.eval_every == 0:
    metrics.update(evaluate(p, pool, state, workdir, index + 1))
  if setup.trajectories_every and (index + 1) % setup.trajectories_every == 0:
    write_trajectories(workdir, index + 1, out.episodes[: setup.trajectories_logged])
  return state, weights, metrics


def episode_metrics(episodes: list[multiturn.Episode]) -> dict:
  """Reward, success, turns, tool use, invalid actions and truncation over every
  process's episodes (`episodes`: this process's).

  Rates per turn: tool_call_rate, tool_error_rate, invalid_action_rate; per
  episode: success and EPISODE_ACCURACY keys (the last turn's info, when the
  environment reports them), tool_episode_rate (episodes with a tool call),
  truncation_rate.
  """
  last = [e.infos[-1] if e.infos else {} for e in episodes]
  count = lambda key: [sum(bool(i.get(key)) for i in e.infos) for e in episodes]
  per_episode = {
    "reward": [e.reward for e in episodes],
    "success": [bool(i.get("success")) for i in last],
    "turns": [len(e.infos) for e in episodes],
    "tool_call": count("tool_call"),
    "tool_error": count("tool_error"),
    "invalid_action": count("invalid_action"),
    "tool_episode": [any(i.get("tool_call") for i in e.infos) for e in episodes],
    "truncated": [e.truncated for e in episodes],
    **{key: [bool(i.get(key)) for i in last] for key in EPISODE_ACCURACY},
    **{f"has/{key}": [key in i for i in last] for key in EPISODE_ACCURACY},
  }
  v = {k: shares.all_rows(np.asarray(x, np.float64)) for k, x in per_episode.items()}
  turns = v["turns"].sum()
  out = {
    "reward/mean": float(v["reward"].mean()),
    "reward/std": float(v["reward"].std()),
    "success": float(v["success"].mean()),
    "turns/mean": float(v["turns"].mean()),
    "tool_call_rate": float(v["tool_call"].sum() / turns),
    "tool_error_rate": float(v["tool_error"].sum() / turns),
    "tool_episode_rate": float(v["tool_episode"].mean()),
    "invalid_action_rate": float(v["invalid_action"].sum() / turns),
    "truncation_rate": float(v["truncated"].mean()),
  }
  for key in EPISODE_ACCURACY:
    if v[f"has/{key}"].any():
      out[key] = float(v[key].mean())
  return out


def write_trajectories(workdir: str, step: int, episodes, name: str = TRANSCRIPTS) -> None:
  """Appends readable transcripts to workdir/`name` (records after a resume point dropped);
  process 0 writes, the others do nothing."""
  if jax.process_index():
    return
  path = os.path.join(workdir, name)
  metrics_lib.truncate_jsonl(path, step - 1)
  for e in episodes:
    turns = [
      {"assistant": a, "observation": o, "reward": r, "info": i}
      for a, o, r, i in zip(e.texts, e.observations, e.turn_rewards, e.infos)
    ]
    record = {
      "step": step,
      "seed": e.seed,
      "first_observation": e.first_observation,
      "reward": e.reward,
      "done": e.done,
      "truncated": e.truncated,
      "turns": turns,
    }
    metrics_lib.append_jsonl(path, json.loads(json.dumps(record, default=str)))
