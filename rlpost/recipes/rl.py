"""RL from a ConfigDict: one recipe for every learner and every environment.

Tasks reach the recipe only through an environment of the table (`rlpost.envs.table`,
the `env` block): FrozenLake, GSM8K with a calculator, or a prompt dataset (GSM8K, the
arithmetic and digit tasks, a JSONL file with reward functions: each prompt a one-turn
episode, `rlpost.envs.prompt_dataset`). A dataset's tasks are drawn in the data cursor's
order; an environment of seeds plays seeds i*B .. i*B+B-1 at iteration i, held-out seeds
from eval.seed_offset (`protocol.EnvTasks.pool`), skipping any whose content a training
seed can draw or an earlier held-out seed has (`rlpost.envs.held_out`). Old field names (`data.*`,
`train.batch_prompts`, a top-level `max_staleness`) are read at their new places
(`rlpost.config_moves`).

The learner is a value from the table (`rlpost.recipes.learners`), chosen by name:
`config.learner`, else the entry point's default (experiments.grpo: grpo,
experiments.ppo: ppo; `learners.name_of`). Reads top to bottom: `check_config` (ConfigDict -> the
typed `rl_config.RLConfig`, nothing loaded; below it nothing reads the ConfigDict), `build`,
`run`, then one iteration's two phases:

  produce: B tasks -> G episodes each (`multiturn.rollout`) -> rewards [-> the rollout
    block's DAPO options: overlong penalty, dynamic sampling (drop groups whose rewards
    tie, play more tasks)] -> metrics
  train: the global RLBatch with the rewards as `scores` -> learner.update (advantages,
    reference / old logprobs or critic pass and GAE, train steps)
    -> [greedy episodes on held-out seeds every eval.every iterations and after the last,
        transcripts every log.trajectories_every]

With `rollout.max_staleness` set, `produce` runs ahead in a thread
(`rlpost.train.pipeline`) on the policy exactly that many updates old (`rollout.loop_step`).
"""

import dataclasses
import functools
import json
import time
from concurrent import futures
from typing import Any, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from rlpost import errors as errors_lib
from rlpost import sampling as sampling_lib
from rlpost.data import tasks as tasks_lib
from rlpost.data.cursor import Cursor, next_indices
from rlpost.envs import held_out as held_out_lib
from rlpost.envs import multiturn
from rlpost.envs import prompt_dataset
from rlpost.envs import protocol
from rlpost.envs import table as env_table
from rlpost.models import policy
from rlpost.recipes import alarms as alarms_lib
from rlpost.recipes import chat_layout
from rlpost.recipes import common
from rlpost.recipes import eval_progress
from rlpost.recipes import item_outcomes
from rlpost.recipes import reports
from rlpost.recipes import rl_config
from rlpost.recipes import rollout as rollout_lib
from rlpost.rl import advantages as adv_lib
from rlpost.rl import batch as batch_lib
from rlpost.rl import learner as learner_lib
from rlpost.supervised import reward_model as reward_model_lib
from rlpost.train import host_memory
from rlpost.train import loop as loop_lib
from rlpost.train import runtime
from rlpost.train import shares
from rlpost.train import sharding
from rlpost.train import step as step_lib

# Progress bar title and curves per (report, learner): a dataset's one-turn episodes
# (protocol.CompletionReport) or an environment's episodes (None); the names runs always had.
_CURVES = {
  ("completions", "grpo"): (
    ("reward/mean", "answer_accuracy", "format_accuracy", "kl"),
    ("reward/mean", "kl"),
  ),
  ("completions", "ppo"): (
    ("reward/mean", "answer_accuracy", "explained_variance", "vf_loss"),
    ("reward/mean", "explained_variance"),
  ),
  ("episodes", None): (  # explained_variance: PPO's only
    (
      "reward/mean",
      "success",
      "greedy/success",
      "greedy/truncation_rate",
      "greedy/failure_rate",
      "turns/mean",
      "invalid_action_rate",
      "explained_variance",
    ),
    ("reward/mean", "greedy/success"),
  ),
}


class Pieces(NamedTuple):
  """Everything a run is built from (see `build`): its `config` (the typed RLConfig, the
  learner's settings as built), the turn layout and sampling settings the environment
  and tokenizer give (`turns`, `sampling`, `greedy`: temperature 0), and what was made."""

  config: rl_config.RLConfig
  turns: multiturn.TurnConfig
  sampling: sampling_lib.SamplingConfig
  greedy: sampling_lib.SamplingConfig
  tokenizer: Any
  tasks: protocol.EnvTasks
  state: step_lib.TrainState  # fresh: step 0
  learner: learner_lib.Learner
  sampler: rollout_lib.Sampler  # where rollouts run
  scorer: Any = None  # the reward model's jitted `scores(batch) -> [N]`, or None
  held_out: held_out_lib.HeldOut | None = None  # the evaluation set (None: eval.every 0)

  @property
  def forward(self) -> policy.ForwardConfig:
    """The trainer's forward (the learner's); the sampler's model config is its `model`."""
    return self.config.settings.forward

  @property
  def num_generations(self) -> int:
    """Episodes per task: the learner's samples per task (G, `algo.num_generations`)."""
    return self.config.spec.samples_per_task(self.config.settings)


def check_config(cfg, learner: str | None = None) -> rl_config.RLConfig:
  """The typed config of a ConfigDict (`rl_config.parse`: every block and every rule
  between them checked before anything is loaded; errors name the field, the value and
  the fix). `learner`: the default when the config names none (`learners.name_of`)."""
  return rl_config.parse(cfg, learner)


def make_env(
  c: rl_config.RLConfig, tokenizer=None, tool_format: str = "library"
) -> protocol.EnvTasks:
  """The `env` block's environment from the table (`rlpost.envs.table`), with the `tools`
  block's tools when enabled (in `tool_format`), and its tasks (a dataset counts its
  prompts' tokens with `tokenizer`)."""
  run_info = protocol.RunInfo(
    seed=c.seed,
    eval_seed_offset=c.eval.seed_offset,
    eval_tasks=c.eval.num_tasks,
    max_result_chars=c.tools.max_result_chars,
    tokenizer=tokenizer,
  )
  return env_table.make(c.env_name, c.env, run_info, c.tools.enabled, tool_format)


def with_task(p: Pieces, task: tasks_lib.Task, template: str) -> Pieces:
  """`p` training on another prompt dataset (e.g. a benchmark's fixed prompts) under a
  data template (fewshot | chat | plain)."""
  tasks = prompt_dataset.tasks(task, template, p.tokenizer)
  turns = dataclasses.replace(p.turns, template=tasks.scaffold)
  return p._replace(turns=turns, tasks=tasks, held_out=held_out_set(p.config, tasks))


def held_out_set(c: rl_config.RLConfig, tasks: protocol.EnvTasks, always: bool = False):
  """The evaluation set (`rlpost.envs.held_out.choose`: distinct items, none of them one
  the seeds of the run's episode budget draw), logged; None when eval.every is 0 (unless
  `always`)."""
  if not (c.eval.every or always):
    return None
  per_step = c.train.batch_tasks * c.spec.samples_per_task(c.settings)  # episodes
  train = held_out_lib.train_seeds(tasks, c.train.steps, per_step)
  try:
    held = held_out_lib.choose(tasks, train, c.eval.seed_offset, c.eval.num_tasks)
  except ValueError as err:
    raise errors_lib.ConfigError(str(err)) from None
  logging.info("%s", held.describe(tasks.env.name))
  return held


def build(cfg, loaded=None, learner: str | None = None) -> Pieces:
  """Loads the model (or takes `loaded` = (config, params, tokenizer)) and builds the run
  of `cfg`: an RLConfig, or a ConfigDict (checked here, `check_config`)."""
  c = cfg if isinstance(cfg, rl_config.RLConfig) else check_config(cfg, learner)
  _, params, tokenizer = loaded or common.load_model(c)
  chat = chat_layout.layout(c, tokenizer)  # the template scaffold's chat template
  tool_format = chat_layout.tool_format(c, chat)
  tasks = make_env(c, tokenizer, tool_format)
  turns = dataclasses.replace(
    rl_config.turn_layout(c, tasks.scaffold),
    layout=chat,
    keep_special=chat_layout.markers(tool_format, tokenizer),
  )
  sc = sampling_lib.SamplingConfig(
    temperature=c.sampling.temperature,
    stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id),
    max_new_tokens=turns.max_turn_tokens,
    pad_id=tokenizer.pad_id,
    prompt_bucket=c.sampling.prompt_bucket,
  )
  built, state = c.spec.build(c, params, c.settings)
  c = dataclasses.replace(c, settings=built.settings)
  sampler = rollout_lib.make_sampler(c, built.frozen, c.settings.forward)
  scorer = _scorer(c, tokenizer, built)
  greedy = dataclasses.replace(sc, temperature=0.0)
  held = held_out_set(c, tasks)
  return Pieces(c, turns, sc, greedy, tokenizer, tasks, state, built, sampler, scorer, held)


def _scorer(c: rl_config.RLConfig, tokenizer, built: learner_lib.Learner):
  """The `reward_model` block's scorer: `scores(RLBatch) -> [N]`, jitted; None without a
  path. A LoRA reward model over the policy's own base reads the learner's copy of it (on
  one process), else its own. Its tokenizer must be the policy's (it reads the policy's
  token ids)."""
  path = c.reward_model.path
  if not path:
    return None
  base = built.ref_params if built.ref_params is not None else built.frozen
  shared = (c, base, tokenizer) if base is not None and jax.process_count() == 1 else None
  trainable, frozen, fwd, rm_tokenizer = common.reward_model_from_run(path, shared=shared)
  if (rm_tokenizer.vocab_size, rm_tokenizer.chat) != (tokenizer.vocab_size, tokenizer.chat):
    common.fail(
      "reward_model.path",
      path,
      f"its tokenizer ({rm_tokenizer.vocab_size} ids, chat format {rm_tokenizer.chat!r}) is "
      f"not the policy's ({tokenizer.vocab_size}, {tokenizer.chat!r}): it would read other "
      "tokens than the policy wrote; train the reward model over the policy's model family",
    )
  score = jax.jit(lambda batch: reward_model_lib.batch_scores(trainable, frozen, batch, fwd))
  return lambda batch: np.asarray(score(batch_lib.to_device(batch)), np.float32)


def _with_learned_reward(p: Pieces, out: multiturn.Rollout):
  """(out with the reward model's scores in its rewards, their metrics): reward =
  rule_weight * reward + weight * score; the score joins the last turn's reward."""
  start, learned = time.perf_counter(), p.config.reward_model
  score_N = p.scorer(out.batch)
  mask = np.asarray(out.batch.loss_mask) > 0
  T = mask.shape[1]
  last_N = T - 1 - np.argmax(mask[:, ::-1], axis=1)
  turn = learned.rule_weight * np.asarray(out.turn_rewards, np.float32)
  turn[np.arange(len(score_N)), last_N] += np.where(mask.any(1), learned.weight * score_N, 0.0)
  rewards = learned.rule_weight * np.asarray(out.rewards, np.float32) + learned.weight * score_N
  metrics = {
    "reward_model/score": float(np.mean(shares.all_rows(score_N))),
    "reward_model/reward": float(np.mean(shares.all_rows(rewards))),
    "time/reward_model_s": time.perf_counter() - start,
  }
  return out._replace(rewards=rewards.astype(np.float32), turn_rewards=turn), metrics


def run(cfg, workdir: str, stop_after: int | None = None, loaded=None, learner: str | None = None):
  """Trains until cfg.train.steps iterations are done (or `stop_after` in this call).

  Resumes from the newest checkpoint in `workdir`. `learner`: the default when the
  config names none (`learners.name_of`). Returns the final TrainState.
  """
  cfg = common.with_compute_dtype(rl_config.migrated(cfg), workdir)
  check_config(cfg, learner)  # a bad config fails before the int8 calibration (seconds)
  cfg = common.with_int4_matmul(common.with_int8_paths(cfg, workdir), workdir)
  config_json = json.loads(cfg.to_json_best_effort())  # what the run records: config.json
  c = check_config(cfg, learner)  # below here nothing reads the ConfigDict
  p = build(c, loaded)
  c = p.config
  if p.tasks.env.max_turns > 1 and jax.default_backend() == "cpu":
    runtime.check_map_count()  # multi-turn rollouts compile a program per shape
  title, (curves, postfix) = _title_and_curves(p)
  loop = loop_lib.loop_config(c, f"{title}[{c.name}]", curves, postfix)
  with _pool(c) as pool:
    step_fn, close, carry = loop_step(p, pool, workdir, c.rollout.max_staleness, c.train.steps)
    gap = c.alarms.logp_gap
    if gap is None:
      gap = alarms_lib.default_logp_gap(p.forward.compute_dtype, c.sampling.weights)
    offers_tools = env_table.offers_tools(c.env_name, c.tools.enabled)
    idle = c.alarms.idle_tools if offers_tools else 0
    step_fn = alarms_lib.watch(step_fn, gap, idle)
    initial = functools.partial(initial_metrics, p, pool, workdir)
    try:
      state, _ = loop_lib.run_loop(
        workdir,
        config_json,
        p.state,
        step_fn,
        loop,
        initial_metrics=initial if c.eval.every else None,
        stop_after=stop_after,
        carry=carry,
      )
    finally:
      close()
  return state


def _title_and_curves(p: Pieces):
  """The progress bar's title and the curves: a dataset's by learner, an environment's."""
  if p.tasks.report is None:
    return "agentic", _CURVES[("episodes", None)]
  return p.config.learner, _CURVES[("completions", p.config.learner)]


def _pool(c: rl_config.RLConfig) -> futures.ThreadPoolExecutor:
  """The threads that step an iteration's episodes (`rollout_threads`; a prompt's one
  scoring step: one)."""
  return futures.ThreadPoolExecutor(c.rollout_threads)


def loop_step(p: Pieces, pool, workdir: str, max_staleness, steps: int):
  """The run loop's (step_fn, close, carry): `produce` then `train` in turn, or pipelined
  (`rollout.loop_step`)."""
  return rollout_lib.loop_step(
    p,
    functools.partial(produce, pool=pool),
    functools.partial(train, pool=pool, workdir=workdir),
    max_staleness,
    steps,
  )


def iteration(p: Pieces, state, cursor: Cursor, index: int, workdir: str = ""):
  """One synchronous iteration (module docstring). Returns (state, cursor, metrics)."""
  with _pool(p.config) as pool:
    step = loop_step(p, pool, workdir, None, index + 1)[0]
    return step(state, cursor, index)


def initial_metrics(p: Pieces, pool, workdir: str, state) -> dict:
  """Step 0's record: greedy episodes on the held-out seeds before training."""
  return evaluate(p, pool, state, workdir, 0)


def produce(p: Pieces, weights, cursor: Cursor, index: int, pool=None):
  """Iteration `index`'s episodes, played with `weights` ((params, base key) on the
  sampler's devices: `rollout.sampler_weights`); each process plays its block of the
  tasks (`rlpost.train.shares`). Returns ((Rollout, metrics, seconds), cursor)."""
  start = time.perf_counter()
  params_s, key = weights
  key = jax.random.fold_in(key, index)
  out, metrics, cursor = _collect(p, pool, params_s, cursor, key, index)
  if p.scorer is not None:
    out, scored = _with_learned_reward(p, out)
    metrics = {**metrics, **scored}
  del params_s, weights
  host_memory.release_freed_memory()  # the sampler's weight copies, before the train step
  return (out, metrics, time.perf_counter() - start), cursor


def _draw(tasks: protocol.EnvTasks, cursor: Cursor, index: int, B: int):
  """(B task seeds, cursor): a dataset's next B in the data cursor's order, else the
  seeds index*B .. index*B+B-1 (`protocol.EnvTasks.pool`)."""
  if tasks.pool is None:
    return np.arange(index * B, (index + 1) * B), cursor
  return next_indices(cursor, tasks.pool, B, shuffle=tasks.shuffle)


def _collect(p: Pieces, pool, params_s, cursor: Cursor, key, index: int):
  """`batch_tasks` tasks, G episodes each, scored; with the rollout block's DAPO options:
  the overlong penalty added to the rewards, dynamic sampling. Any environment.

  Dynamic sampling drops groups whose G rewards are all equal (zero advantage, no
  signal) and draws further tasks (a dataset's next ones; an environment of seeds plays
  the same seeds again with a new key), up to `max_resample_rounds` extra rounds; if the
  batch is still short it is filled with dropped groups (they contribute no policy
  gradient) and `dynamic/filled` counts them. With several processes each plays every
  round whole (sampling is not split) and trains on its block of the groups chosen.
  Round k of a group learner samples with key fold_in(key, k), except a seeded
  environment's first round, which takes `key` itself (the keys runs have always used, so
  earlier runs resume and compare bitwise). Returns (Rollout, metrics, cursor).
  """
  c, tasks = p.config, p.tasks
  B, G, r = c.train.batch_tasks, p.num_generations, c.rollout
  groups = c.spec.groups
  report = tasks.report or protocol.CompletionReport()
  # With several processes, dynamic sampling has every process play each round whole, so
  # all keep the same groups (those one process would keep) and take their block of them.
  everyone = r.dynamic_sampling and jax.process_count() > 1
  kept, dropped, rounds, errors = [], [], 0, {}
  while True:
    idx, cursor = _draw(tasks, cursor, index, B)
    mine = slice(0, B) if everyone else shares.block(B, rl_config.BATCH_FIELD)
    seeds = [int(i) for i in idx[mine]]
    first_seeded = rounds == 0 and tasks.pool is None
    round_key = jax.random.fold_in(key, rounds) if groups and not first_seeded else key
    problems = tasks.train_tasks(seeds)
    out = _play(p, pool, params_s, problems, seeds, round_key, p.sampling, G, mine.start * G)
    out, penalty = _with_overlong_penalty(out, p)
    for name, n in reports.reward_errors(out, report.reward_names).items():
      errors[name] = errors.get(name, 0) + (n if everyone else shares.sum_over_processes(n))
    tied = np.asarray(adv_lib.zero_signal_groups(jnp.asarray(out.rewards), G))
    for g, no_signal in enumerate(tied):
      (dropped if r.dynamic_sampling and no_signal else kept).append((out, penalty, g))
    rounds += 1
    if r.dynamic_sampling and rounds >= 3:  # a long streak of signal-less groups shows
      logging.info(
        "dynamic sampling: %d of %d groups with reward signal after %d rounds "
        "(rollout.max_resample_rounds=%d extra rounds)",
        len(kept),
        B,
        rounds,
        r.max_resample_rounds,
      )
    mine_count = mine.stop - mine.start  # this process's groups (all of B on one process)
    if not r.dynamic_sampling or len(kept) >= mine_count or rounds > r.max_resample_rounds:
      break
  filled = max(0, mine_count - len(kept))  # 0 without dynamic sampling, on any process count
  chosen = (kept + dropped[:filled])[:mine_count]
  if everyone:  # the groups every process chose alike: this process trains on its block
    chosen = shares.take(chosen, rl_config.BATCH_FIELD)
  whole = rounds == 1 and not dropped and not everyone
  out, penalty = _groups_of(chosen, G, p.sampling.pad_id, whole)
  extra = {} if penalty is None else {"overlong_penalty": penalty}
  metrics = {**errors, **reports.rollout_metrics(out, tasks.report, extra)}
  if tasks.player is not None:
    metrics.update(tasks.player.metrics(out.episodes))
  # dynamic/*: a group learner's on a dataset (the names those runs always had), or with
  # dynamic sampling on
  if groups and (tasks.report is not None or r.dynamic_sampling):
    metrics.update({"dynamic/rounds": rounds, "dynamic/filled": filled})
  return out, metrics, cursor


def _with_overlong_penalty(out: multiturn.Rollout, p: Pieces):
  """(out with DAPO's soft overlong penalty added to its rewards, the penalty [N] float32:
  a row's sampled tokens against the most it can sample, `turns.max_total_tokens`), or
  (out, None) when rollout.overlong_buffer is off."""
  r = p.config.rollout
  if not r.overlong_buffer:
    return out, None
  penalty = np.asarray(
    adv_lib.overlong_penalty(
      jnp.asarray(out.batch.loss_mask.sum(1)),
      max_len=p.turns.max_total_tokens,
      buffer_len=r.overlong_buffer,
      penalty_factor=r.overlong_penalty,
    ),
    np.float32,
  )
  return out._replace(rewards=out.rewards + penalty), penalty


def _groups_of(chosen, G: int, pad_id: int, whole: bool):
  """The Rollout (and penalty, or None) of the chosen (rollout, penalty, group) triples, in
  their order; `whole`: they are one rollout's groups in order, taken as they are."""
  if whole:
    return chosen[0][0], chosen[0][1]
  parts = [(out, penalty, slice(g * G, (g + 1) * G)) for out, penalty, g in chosen]
  batch = batch_lib.concatenate(
    [batch_lib.select_rows(out.batch, rows) for out, _, rows in parts], pad_id
  )
  join = lambda get: np.concatenate([get(out)[rows] for out, _, rows in parts])
  width = batch.completion_len  # the rollouts' widest (`multiturn.batch_width`)
  out = multiturn.Rollout(
    batch,
    join(lambda o: o.rewards),
    join(lambda o: batch_lib.pad_slots(o.turn_rewards, width)),
    [e for out, _, rows in parts for e in out.episodes[rows]],
  )
  penalty = None if parts[0][1] is None else np.concatenate([pen[rows] for _, pen, rows in parts])
  return out, penalty


def _play(p: Pieces, pool, params_s, tasks, seeds, key, sc, num_generations, first_row):
  """`num_generations` episodes of each (task, seed) with the sampler weights `params_s`
  (an environment with a `player` plays its own: `protocol.Player`)."""
  shared = dict(tokenizer=p.tokenizer, model_config=p.forward.model, sampling_config=sc)
  shared.update(turns=p.turns, num_generations=num_generations)
  if p.tasks.player is not None:
    out = p.tasks.player.play(params_s, tasks, seeds, key, **shared)
  else:
    out = multiturn.rollout(
      params_s,
      p.tasks.env,
      tasks,
      seeds,
      key,
      **shared,
      pool=pool,
      first_row=first_row,
      widest=lambda n: int(shares.max_over_processes([n])[0]),
    )
  del params_s
  host_memory.release_freed_memory()  # the sampler's weight copies, before the train step
  return out


def train(p: Pieces, state, sampled, index: int, version: int, publish=None, pool=None, workdir=""):
  """The learner's update on `produce`'s episodes (played by policy `version`; TIS
  corrects an older one), then an environment's due evaluation and transcripts.
  Returns (state, publish(new state) or None, metrics)."""
  del version  # the train step's TIS weights see it through the batch's sampler logprobs
  out, metrics, rollout_s = sampled
  c, start = p.config, time.perf_counter()
  metrics = dict(metrics)
  scores = out.turn_rewards if c.per_turn_rewards else out.rewards
  batch = dataclasses.replace(out.batch, scores=scores)
  batch = batch_lib.with_shared_prefix(batch, shares.all_rows if jax.process_count() > 1 else None)
  batch = batch_lib.to_device(step_lib.global_batch(batch, sharding.mesh_of(state)))
  state, update_metrics = c.spec.update(p.learner, state, batch, index)
  metrics.update(update_metrics)
  metrics["shared_prefix"] = batch.shared_prefix  # slots the trainer's passes computed once
  weights = publish(state) if publish else None
  elapsed = time.perf_counter() - start
  metrics["time/rollout_s"] = rollout_s
  metrics["time/train_s"] = elapsed - metrics.get("time/forward_s", 0.0)
  metrics["tokens_per_s"] = float(batch.loss_mask.sum()) / (rollout_s + elapsed)
  if c.eval.every and ((index + 1) % c.eval.every == 0 or index + 1 == c.train.steps):
    metrics.update(evaluate(p, pool, state, workdir, index + 1))  # and after the last
  if c.log.trajectories_every and (index + 1) % c.log.trajectories_every == 0:
    reports.write_trajectories(workdir, index + 1, out.episodes[: c.log.trajectories_logged])
  return state, weights, metrics


def evaluate(p: Pieces, pool, state, workdir: str, step: int) -> dict:
  """Greedy episodes (temperature 0, one per task) on the held-out seeds (`p.held_out`):
  greedy/* metrics and the set's eval/* ones (overlap with training, distinct items).

  The first `log.trajectories_logged` transcripts go to workdir/eval_trajectories.jsonl,
  every episode's outcome and replies to workdir/eval_outcomes.jsonl and, one line per
  item, to workdir/eval/step_<step>.jsonl (`item_outcomes`). With several processes
  every process plays all of them (the same greedy episodes). Finished chunks are kept
  until then, so an evaluation interrupted and played again resumes (`eval_progress`).
  """
  ev, held = p.config.eval, p.held_out or held_out_set(p.config, p.tasks, True)
  seeds = list(held.seeds)
  chunk = ev.batch_tasks or len(seeds)
  keep = eval_progress.enabled(workdir)
  digest = eval_progress.fingerprint(state.trainable["policy"]) if keep else ""
  episodes = []
  progress = tqdm.trange(  # one tick per chunk of held-out tasks
    0, len(seeds), chunk, desc=f"eval@{step}", leave=False, disable=jax.process_index() > 0
  )
  for first in progress:
    part = seeds[first : first + chunk]
    kept = eval_progress.load(workdir, step, first, part, digest) if keep else None
    if kept is None:
      kept = _greedy_rollout(p, pool, state, p.tasks.eval_tasks(part), part).episodes
      if keep:
        eval_progress.save(workdir, step, first, part, digest, kept)
    episodes += kept
  reports.write_trajectories(
    workdir, step, episodes[: p.config.log.trajectories_logged], reports.EVAL_TRANSCRIPTS
  )
  reports.write_outcomes(workdir, step, episodes)
  item_outcomes.write(workdir, step, item_outcomes.episode_items(episodes, held.keys))
  if keep:
    eval_progress.clear(workdir, step)
  greedy = {f"greedy/{k}": v for k, v in reports.episode_metrics(episodes).items()}
  return {**greedy, **held.metrics()}


def _greedy_rollout(p: Pieces, pool, state, tasks, seeds) -> multiturn.Rollout:
  """Greedy episodes of `tasks` by `state`'s policy, sampled by this process alone, from
  the policy's own weights (even when training rollouts read an int8 or 4-bit copy)."""
  actor = state.trainable["policy"]
  mesh = sharding.mesh_of(state)
  sampler = p.sampler._replace(int8=None, int4=False)
  key = jax.random.key(0)
  params_s, key = rollout_lib.sampler_weights(sampler, actor, p.forward, key, mesh)
  return _play(p, pool, params_s, tasks, seeds, key, p.greedy, 1, 0)
