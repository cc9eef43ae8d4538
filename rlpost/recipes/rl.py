"""RL from a ConfigDict: one recipe for every learner and every environment.

Tasks reach the recipe only through an environment of the table (`rlpost.envs.table`,
the `env` block): FrozenLake, GSM8K with a calculator, or a prompt dataset (GSM8K, the
arithmetic and digit tasks, a JSONL file with reward functions: each prompt a one-turn
episode, `rlpost.envs.prompt_dataset`). A dataset's tasks are drawn in the data cursor's
order; an environment of seeds plays seeds i*B .. i*B+B-1 at iteration i, held-out seeds
from eval.seed_offset (`protocol.EnvTasks.pool`). Old field names (`data.*`,
`train.batch_prompts`, a top-level `max_staleness`) are read at their new places
(`rlpost.config_moves`).

The learner is a value from the table (`rlpost.recipes.learners`), chosen by name:
`config.learner`, else the entry point's default (experiments.grpo: grpo,
experiments.ppo: ppo; `learners.name_of`). Reads top to bottom: `check_config` (ConfigDict -> frozen
`Setup`, nothing loaded), `build`, `run`, then one iteration's two phases:

  produce: B tasks -> G episodes each (`multiturn.rollout`) -> rewards [-> the rollout
    block's DAPO options: overlong penalty, dynamic sampling (drop groups whose rewards
    tie, play more tasks)] -> metrics
  train: the global RLBatch with the rewards as `scores` -> learner.update (advantages,
    reference / old logprobs or critic pass and GAE, train steps)
    -> [greedy episodes on held-out seeds every eval.every iterations,
        transcripts every log.trajectories_every]

With `rollout.max_staleness` set, `produce` runs ahead in a thread
(`rlpost.train.pipeline`) on the policy exactly that many updates old (`rollout.loop_step`).
"""

import dataclasses
import functools
import time
from concurrent import futures
from typing import Any, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from rlpost import config_moves
from rlpost import errors
from rlpost import sampling as sampling_lib
from rlpost.data import tasks as tasks_lib
from rlpost.data.cursor import Cursor, next_indices
from rlpost.envs import multiturn
from rlpost.envs import prompt_dataset
from rlpost.envs import protocol
from rlpost.envs import table as env_table
from rlpost.models import policy
from rlpost.recipes import alarms as alarms_lib
from rlpost.recipes import blocks
from rlpost.recipes import common
from rlpost.recipes import learners as learners_lib
from rlpost.recipes import reports
from rlpost.recipes import rollout as rollout_lib
from rlpost.rl import advantages as adv_lib
from rlpost.rl import batch as batch_lib
from rlpost.rl import credit as credit_lib
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


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything static about a run, from the ConfigDict (`check_config`; `build` adds the
  parts that need the tokenizer or the environment: `turns`, `sampling`, `greedy`).

  learner / settings: the LEARNERS name and its settings (`forward` and
  `num_generations`, episodes per task, derive from them). env: the `env` block's typed
  config (`envs.table`). rollout: the `rollout` block (turn layout, DAPO's collection
  options, max_staleness). batch_tasks: tasks per iteration (`train.batch_tasks`).
  eval_*: greedy held-out episodes (`eval.every` > 0).
  """

  learner: str
  settings: Any
  env: Any
  rollout: rollout_lib.RolloutConfig
  batch_tasks: int
  temperature: float
  prompt_bucket: int
  max_new_tokens: int  # a turn's cap
  turns: multiturn.TurnConfig | None = None  # `build`: with the environment's scaffold
  sampling: sampling_lib.SamplingConfig | None = None
  greedy: sampling_lib.SamplingConfig | None = None
  eval_every: int = 0
  eval_tasks: int = 0
  eval_batch_tasks: int = 0
  eval_seed_offset: int = 0
  trajectories_every: int = 0
  trajectories_logged: int = 0
  step_threads: int = 1
  per_turn_rewards: bool = False
  learned_reward: blocks.LearnedRewardConfig = blocks.LearnedRewardConfig()
  alarms: alarms_lib.AlarmConfig = alarms_lib.AlarmConfig()
  offers_tools: bool = False  # an environment whose episodes can call tools

  @property
  def spec(self) -> learners_lib.LearnerSpec:
    return learners_lib.LEARNERS[self.learner]

  @property
  def forward(self) -> policy.ForwardConfig:
    """The trainer's forward (the learner's); the sampler's model config is its `model`."""
    return self.settings.forward

  @property
  def num_generations(self) -> int:
    """Episodes per task: the learner's samples per task (G, `algo.num_generations`)."""
    return self.spec.samples_per_task(self.settings)


class Pieces(NamedTuple):
  """Everything a run is built from (see `build`)."""

  setup: Setup
  tokenizer: Any
  tasks: protocol.EnvTasks
  state: step_lib.TrainState  # fresh: step 0
  learner: learner_lib.Learner
  sampler: rollout_lib.Sampler  # where rollouts run
  scorer: Any = None  # the reward model's jitted `scores(batch) -> [N]`, or None


BATCH_FIELD = "train.batch_tasks"


def check_config(cfg, learner: str | None = None) -> Setup:
  """Validates the ConfigDict before anything is loaded (errors name the field, the value
  and the fix). Old field names are read at their new places (`config_moves`).
  `learner`: the default when the config names none (`learners.name_of`)."""
  cfg = migrated(cfg)
  name = learners_lib.name_of(cfg, learner)
  spec = learners_lib.spec(name)
  r = common.from_block(rollout_lib.RolloutConfig, cfg.rollout, "rollout", learners_lib.RENAMED)
  s = common.from_block(blocks.SamplingBlock, cfg.sampling, "sampling")
  env = env_table.env_config(cfg.env)  # a dataset's file and reward functions, checked now
  if r.dynamic_sampling and not spec.groups:
    common.fail(
      "rollout.dynamic_sampling",
      True,
      f"{name} samples one completion per task and its critic gives every sample a "
      "baseline: there are no tied groups to drop; use False",
    )
  rollout_lib.check_training_sampling(
    s,
    _greedy_why(name, cfg.algo),
    "use e.g. 1.0. Greedy evaluation is eval.every's (an environment's held-out episodes) "
    "or experiments.eval_gsm8k's job.",
  )
  turns = _turns(r, s)
  threads = cfg.get("rollout_threads", 1)
  if threads < 1:
    common.fail("rollout_threads", threads, "must be >= 1 thread")
  _check_context(cfg, r, env, turns)
  if r.overlong_buffer and r.overlong_buffer > turns.max_total_tokens:
    common.fail(
      "rollout.overlong_buffer",
      r.overlong_buffer,
      f"must be <= the {turns.max_total_tokens} tokens a row samples at most "
      "(rollout.max_total_tokens, else sampling.max_new_tokens)",
    )
  settings = spec.settings(cfg, BATCH_FIELD)
  per_turn = bool(cfg.get("per_turn_rewards", False))
  _check_credit(settings, per_turn)
  rollout_lib.check_off_policy(s, r.max_staleness, settings.algo.tis_cap)
  ev = _eval_block(cfg)
  t = cfg.train
  if ev.every and t.steps * t.batch_tasks > ev.seed_offset:
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
  log = common.from_block(blocks.LogConfig, cfg.log, "log") if "log" in cfg else blocks.NO_LOG
  tools = common.from_block(blocks.ToolsConfig, cfg.tools, "tools") if "tools" in cfg else None
  setup = Setup(
    learner=name,
    settings=settings,
    env=env,
    rollout=r,
    batch_tasks=t.batch_tasks,
    temperature=s.temperature,
    prompt_bucket=s.prompt_bucket,
    max_new_tokens=turns.max_turn_tokens,
    eval_every=ev.every,
    eval_tasks=ev.num_tasks,
    eval_batch_tasks=ev.batch_tasks,
    eval_seed_offset=ev.seed_offset,
    trajectories_every=log.trajectories_every,
    trajectories_logged=log.trajectories_logged,
    step_threads=threads,
    per_turn_rewards=per_turn,
    offers_tools=env_table.offers_tools(cfg.env.name, bool(tools and tools.enabled)),
  )
  return _with_watch_and_reward_model(cfg, setup)


def migrated(cfg):
  """`cfg` with old field names at their new places (`rlpost.config_moves`); a field set
  at both is a ConfigError."""
  try:
    return config_moves.migrate(cfg)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None


def _turns(r: rollout_lib.RolloutConfig, s) -> multiturn.TurnConfig:
  """The turn layout the rollout and sampling blocks give (the scaffold comes with the
  environment, at `build`)."""
  if r.max_turn_tokens is None and s.max_new_tokens is None:
    common.fail(
      "sampling.max_new_tokens", None, "must be >= 1 token (or set rollout.max_turn_tokens)"
    )
  if r.max_turn_tokens and s.max_new_tokens and r.max_turn_tokens != s.max_new_tokens:
    common.fail(
      "rollout.max_turn_tokens",
      r.max_turn_tokens,
      f"differs from sampling.max_new_tokens={s.max_new_tokens}: both cap a turn; set one",
    )
  try:
    turns = r.turns(r.max_turn_tokens or s.max_new_tokens)
  except ValueError as e:
    raise errors.ConfigError(str(e).replace("RolloutConfig.", "config.rollout.")) from None
  if turns.max_total_tokens < turns.max_turn_tokens:
    common.fail(
      "rollout.max_total_tokens",
      turns.max_total_tokens,
      f"is below rollout.max_turn_tokens={turns.max_turn_tokens}: every episode would be cut "
      "inside its first turn; give room for env.max_turns turns and their observations",
    )
  return turns


def _check_context(cfg, r: rollout_lib.RolloutConfig, env, turns: multiturn.TurnConfig) -> None:
  """A first prompt at its cap plus a row's completion slots fit the model's context: the
  cap is rollout.max_prompt_tokens, else a dataset's own env.max_prompt_tokens."""
  if r.max_prompt_tokens is not None:
    field, cap = "rollout.max_total_tokens", turns.max_total_tokens
    what = f"with rollout.max_prompt_tokens={r.max_prompt_tokens} an episode holds"
    common.check_context(cfg, r.max_prompt_tokens + cap, field, cap, what)
  elif hasattr(env, "max_prompt_tokens"):
    what = f"with sampling.max_new_tokens={turns.max_total_tokens} a sequence holds"
    total = env.max_prompt_tokens + turns.max_total_tokens
    common.check_context(cfg, total, "env.max_prompt_tokens", env.max_prompt_tokens, what)


def _check_credit(settings, per_turn: bool) -> None:
  """A credit rule reading each turn's reward (`credit.RULES`: GRPO's turn and state
  credit) needs `per_turn_rewards`; one reading the episode's sum refuses them."""
  rewards = credit_lib.of(settings.algo).rewards  # episode: [N]; turn: [N, T]; either
  if per_turn and rewards == "episode":
    common.fail(
      "per_turn_rewards",
      True,
      "GRPO with algo.credit='episode' scores each episode by its summed reward: use False, "
      "algo.credit='turn' or 'state' (each turn's reward-to-go), or learner ppo (',ppo')",
    )
  if rewards == "turn" and not per_turn:
    common.fail(
      "algo.credit",
      settings.algo.credit,
      f"{settings.algo.credit} credit reads each turn's reward where the turn ends: set "
      "per_turn_rewards=True (a prompt's completion is one turn: use 'episode')",
    )


def _eval_block(cfg) -> blocks.EvalConfig:
  """The greedy held-out evaluation (`eval.every` > 0); a GSM8K config's `eval` block is
  experiments.eval_gsm8k's instead (no `every`): off here."""
  if "eval" not in cfg or "every" not in cfg.eval:
    return blocks.EvalConfig(every=0)
  return common.from_block(blocks.EvalConfig, cfg.eval, "eval")


def _with_watch_and_reward_model(cfg, setup: Setup) -> Setup:
  """`setup` with the `alarms` block and the `reward_model` block (a learned reward)."""
  if "alarms" in cfg:
    watch = common.from_block(alarms_lib.AlarmConfig, cfg.alarms, "alarms")
    setup = dataclasses.replace(setup, alarms=watch)
  if "reward_model" not in cfg:
    return setup
  learned = common.from_block(blocks.LearnedRewardConfig, cfg.reward_model, "reward_model")
  if learned.path and setup.rollout.dynamic_sampling:
    common.fail(
      "reward_model.path",
      learned.path,
      "dynamic sampling keeps groups by their rule-based rewards, before the reward model "
      "scores them: set rollout.dynamic_sampling=False, or leave the reward model out",
    )
  return dataclasses.replace(setup, learned_reward=learned)


def _greedy_why(name: str, algo) -> str:
  """Why `name` cannot train on greedy samples (the sampling.temperature error's reason;
  `algo`: the config's `algo` block)."""
  estimator = algo.get("advantage_estimator")
  if name == "grpo" and credit_lib.compares_groups(estimator):
    return (
      f"greedy decoding gives the {algo.num_generations} samples of a prompt identical "
      f"completions, so {estimator}'s group-relative advantages are all 0"
    )
  return "the trainer's logprobs divide the logits by the temperature"


def make_env(cfg, tokenizer=None) -> protocol.EnvTasks:
  """The `env` block's environment from the table (`rlpost.envs.table`), with the `tools`
  block's tools when enabled, and its tasks (a dataset counts its prompts' tokens with
  `tokenizer`)."""
  cfg = migrated(cfg)
  config = env_table.env_config(cfg.env)
  ev, tools = _eval_block(cfg), cfg.get("tools")
  run_info = protocol.RunInfo(
    seed=cfg.seed,
    eval_seed_offset=ev.seed_offset,
    eval_tasks=ev.num_tasks,
    max_result_chars=tools.max_result_chars if tools else 200,
    tokenizer=tokenizer,
  )
  return env_table.make(cfg.env.name, config, run_info, bool(tools and tools.enabled))


def with_task(p: Pieces, task: tasks_lib.Task, template: str) -> Pieces:
  """`p` training on another prompt dataset (e.g. a benchmark's fixed prompts) under a
  data template (fewshot | chat | plain)."""
  tasks = prompt_dataset.tasks(task, template, p.tokenizer)
  turns = dataclasses.replace(p.setup.turns, template=tasks.scaffold)
  return p._replace(setup=dataclasses.replace(p.setup, turns=turns), tasks=tasks)


def build(cfg, loaded=None, learner: str | None = None, setup: Setup | None = None) -> Pieces:
  """Loads the model (or takes `loaded` = (config, params, tokenizer)) and builds the run
  (`setup`: `check_config`'s, when the caller has it; else checked here)."""
  cfg = migrated(cfg)
  setup = setup or check_config(cfg, learner)
  _, params, tokenizer = loaded or common.load_model(cfg)
  tasks = make_env(cfg, tokenizer)
  r = setup.rollout
  if r.template and tasks.scaffold and r.template != tasks.scaffold:
    common.fail(
      "rollout.template",
      r.template,
      f"this environment's scaffold is {tasks.scaffold!r} (a dataset's follows its "
      "env.template): leave rollout.template None",
    )
  turns = r.turns(setup.max_new_tokens, tasks.scaffold)
  sc = sampling_lib.SamplingConfig(
    temperature=setup.temperature,
    stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id),
    max_new_tokens=turns.max_turn_tokens,
    pad_id=tokenizer.pad_id,
    prompt_bucket=setup.prompt_bucket,
  )
  setup = dataclasses.replace(
    setup, turns=turns, sampling=sc, greedy=dataclasses.replace(sc, temperature=0.0)
  )
  built, state = setup.spec.build(cfg, params, setup.settings)
  setup = dataclasses.replace(setup, settings=built.settings)
  sampler = rollout_lib.make_sampler(cfg, built.frozen, setup.forward)
  scorer = _scorer(cfg, setup, tokenizer, built)
  return Pieces(setup, tokenizer, tasks, state, built, sampler, scorer)


def _scorer(cfg, setup: Setup, tokenizer, built: learner_lib.Learner):
  """The `reward_model` block's scorer: `scores(RLBatch) -> [N]`, jitted; None without a
  path. A LoRA reward model over the policy's own base reads the learner's copy of it (on
  one process), else its own. Its tokenizer must be the policy's (it reads the policy's
  token ids)."""
  path = setup.learned_reward.path
  if not path:
    return None
  base = built.ref_params if built.ref_params is not None else built.frozen
  shared = (cfg, base, tokenizer) if base is not None and jax.process_count() == 1 else None
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
  start, learned = time.perf_counter(), p.setup.learned_reward
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
  cfg = common.with_compute_dtype(migrated(cfg), workdir)
  setup = check_config(cfg, learner)  # a bad config fails before the int8 calibration (seconds)
  cfg = common.with_int8_paths(cfg, workdir)
  p = build(cfg, loaded, setup=setup)
  setup = p.setup
  if p.tasks.env.max_turns > 1 and jax.default_backend() == "cpu":
    runtime.check_map_count()  # multi-turn rollouts compile a program per shape
  title, (curves, postfix) = _title_and_curves(p)
  loop = loop_lib.loop_config(cfg, f"{title}[{cfg.name}]", curves, postfix)
  with _pool(setup) as pool:
    step_fn, close, carry = loop_step(
      p, pool, workdir, setup.rollout.max_staleness, cfg.train.steps
    )
    gap = setup.alarms.logp_gap
    if gap is None:
      gap = alarms_lib.default_logp_gap(setup.forward.compute_dtype, cfg.sampling.weights)
    idle = setup.alarms.idle_tools if setup.offers_tools else 0
    step_fn = alarms_lib.watch(step_fn, gap, idle)
    initial = functools.partial(initial_metrics, p, pool, workdir)
    try:
      state, _ = loop_lib.run_loop(
        workdir,
        cfg,
        p.state,
        step_fn,
        loop,
        initial_metrics=initial if setup.eval_every else None,
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
  return p.setup.learner, _CURVES[("completions", p.setup.learner)]


def _pool(setup: Setup) -> futures.ThreadPoolExecutor:
  """The threads that step an iteration's episodes (`rollout_threads`; a prompt's one
  scoring step: one)."""
  return futures.ThreadPoolExecutor(setup.step_threads)


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
  with _pool(p.setup) as pool:
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
  setup, tasks = p.setup, p.tasks
  B, G, r = setup.batch_tasks, setup.num_generations, setup.rollout
  groups = setup.spec.groups
  report = tasks.report or protocol.CompletionReport()
  # With several processes, dynamic sampling has every process play each round whole, so
  # all keep the same groups (those one process would keep) and take their block of them.
  everyone = r.dynamic_sampling and jax.process_count() > 1
  kept, dropped, rounds, errors = [], [], 0, {}
  while True:
    idx, cursor = _draw(tasks, cursor, index, B)
    mine = slice(0, B) if everyone else shares.block(B, BATCH_FIELD)
    seeds = [int(i) for i in idx[mine]]
    first_seeded = rounds == 0 and tasks.pool is None
    round_key = jax.random.fold_in(key, rounds) if groups and not first_seeded else key
    problems = tasks.train_tasks(seeds)
    out = _play(p, pool, params_s, problems, seeds, round_key, setup.sampling, G, mine.start * G)
    out, penalty = _with_overlong_penalty(out, setup)
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
    chosen = shares.take(chosen, BATCH_FIELD)
  whole = rounds == 1 and not dropped and not everyone
  out, penalty = _groups_of(chosen, G, setup.sampling.pad_id, whole)
  extra = {} if penalty is None else {"overlong_penalty": penalty}
  metrics = {**errors, **reports.rollout_metrics(out, tasks.report, extra)}
  # dynamic/*: a group learner's on a dataset (the names those runs always had), or with
  # dynamic sampling on
  if groups and (tasks.report is not None or r.dynamic_sampling):
    metrics.update({"dynamic/rounds": rounds, "dynamic/filled": filled})
  return out, metrics, cursor


def _with_overlong_penalty(out: multiturn.Rollout, setup: Setup):
  """(out with DAPO's soft overlong penalty added to its rewards, the penalty [N] float32:
  a row's sampled tokens against the most it can sample, `turns.max_total_tokens`), or
  (out, None) when rollout.overlong_buffer is off."""
  r = setup.rollout
  if not r.overlong_buffer:
    return out, None
  penalty = np.asarray(
    adv_lib.overlong_penalty(
      jnp.asarray(out.batch.loss_mask.sum(1)),
      max_len=setup.turns.max_total_tokens,
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
  """`num_generations` episodes of each (task, seed) with the sampler weights `params_s`."""
  out = multiturn.rollout(
    params_s,
    p.tasks.env,
    tasks,
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


def train(p: Pieces, state, sampled, index: int, version: int, publish=None, pool=None, workdir=""):
  """The learner's update on `produce`'s episodes (played by policy `version`; TIS
  corrects an older one), then an environment's due evaluation and transcripts.
  Returns (state, publish(new state) or None, metrics)."""
  del version  # the train step's TIS weights see it through the batch's sampler logprobs
  out, metrics, rollout_s = sampled
  setup, start = p.setup, time.perf_counter()
  metrics = dict(metrics)
  scores = out.turn_rewards if setup.per_turn_rewards else out.rewards
  batch = dataclasses.replace(out.batch, scores=scores)
  batch = batch_lib.with_shared_prefix(batch, shares.all_rows if jax.process_count() > 1 else None)
  batch = batch_lib.to_device(step_lib.global_batch(batch, sharding.mesh_of(state)))
  state, update_metrics = setup.spec.update(p.learner, state, batch, index)
  metrics.update(update_metrics)
  metrics["shared_prefix"] = batch.shared_prefix  # slots the trainer's passes computed once
  weights = publish(state) if publish else None
  elapsed = time.perf_counter() - start
  metrics["time/rollout_s"] = rollout_s
  metrics["time/train_s"] = elapsed - metrics.get("time/forward_s", 0.0)
  metrics["tokens_per_s"] = float(batch.loss_mask.sum()) / (rollout_s + elapsed)
  if setup.eval_every and (index + 1) % setup.eval_every == 0:
    metrics.update(evaluate(p, pool, state, workdir, index + 1))
  if setup.trajectories_every and (index + 1) % setup.trajectories_every == 0:
    reports.write_trajectories(workdir, index + 1, out.episodes[: setup.trajectories_logged])
  return state, weights, metrics


def evaluate(p: Pieces, pool, state, workdir: str, step: int) -> dict:
  """Greedy episodes (temperature 0, one per task) on the held-out seeds: greedy/* metrics.

  The first `log.trajectories_logged` transcripts go to workdir/eval_trajectories.jsonl,
  every episode's outcome and replies to workdir/eval_outcomes.jsonl. With several
  processes every process plays all of them (the same greedy episodes).
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
    tasks = p.tasks.eval_tasks(part)
    out = _greedy_rollout(p, pool, state, tasks, part)
    episodes += out.episodes
  reports.write_trajectories(
    workdir, step, episodes[: setup.trajectories_logged], reports.EVAL_TRANSCRIPTS
  )
  reports.write_outcomes(workdir, step, episodes)
  return {f"greedy/{k}": v for k, v in reports.episode_metrics(episodes).items()}


def _greedy_rollout(p: Pieces, pool, state, tasks, seeds) -> multiturn.Rollout:
  """Greedy episodes of `tasks` by `state`'s policy, sampled by this process alone, from
  the policy's own weights (even when training rollouts read an int8 copy)."""
  actor = state.trainable["policy"]
  mesh = sharding.mesh_of(state)
  sampler = p.sampler._replace(int8=None)
  key = jax.random.key(0)
  params_s, key = rollout_lib.sampler_weights(sampler, actor, p.setup.forward, key, mesh)
  return _play(p, pool, params_s, tasks, seeds, key, p.setup.greedy, 1, 0)
