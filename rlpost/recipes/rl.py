"""RL from a ConfigDict: one recipe for every learner and every task source.

Tasks reach the recipe only through an environment (`rlpost.envs.protocol`):

  data block (configs/grpo_gsm8k.py, ppo_gsm8k.py): a prompt dataset, each prompt a
    one-turn episode (`rlpost.envs.single_turn`), drawn in the data cursor's order;
  env block (configs/agentic.py): an environment from the table (`rlpost.envs.table`),
    training seeds i*B .. i*B+B-1 at iteration i, held-out seeds from eval.seed_offset.

The learner is a value from the table (`rlpost.recipes.learners`), chosen by name:
`config.learner`, else the entry point's default (experiments.grpo: grpo,
experiments.ppo: ppo; `learners.name_of`). Reads top to bottom: `check_config` (ConfigDict -> frozen
`Setup`, nothing loaded), `build`, `run`, then one iteration's two phases:

  produce: B tasks -> G episodes each (`multiturn.rollout`; one turn for a prompt)
    -> rewards [-> the data source's DAPO options: overlong penalty, dynamic
    sampling (drop groups whose rewards tie, draw more prompts)] -> metrics
  train: the global RLBatch with the rewards as `scores` -> learner.update (advantages,
    reference / old logprobs or critic pass and GAE, train steps)
    -> [env: greedy episodes on held-out seeds every eval.every iterations,
        transcripts every log.trajectories_every]

With `max_staleness` set, `produce` runs ahead in a thread (`rlpost.train.pipeline`) on
the policy exactly that many updates old (`rollout.loop_step`).
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

from rlpost import sampling as sampling_lib
from rlpost.data import limits
from rlpost.data import tasks as tasks_lib
from rlpost.data.cursor import Cursor, next_indices
from rlpost.envs import multiturn
from rlpost.envs import protocol
from rlpost.envs import single_turn
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

PROMPTS, ENV = "prompts", "env"  # the two task sources
# Progress bar title and curves per (source, learner): the names runs always had.
_CURVES = {
  (PROMPTS, "grpo"): (
    ("reward/mean", "answer_accuracy", "format_accuracy", "kl"),
    ("reward/mean", "kl"),
  ),
  (PROMPTS, "ppo"): (
    ("reward/mean", "answer_accuracy", "explained_variance", "vf_loss"),
    ("reward/mean", "explained_variance"),
  ),
  ENV: (  # explained_variance: PPO's only
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
# A prompt is one turn: no cap on its length beyond the model's (a dataset's prompts
# were never capped).
_NO_PROMPT_CAP = 1 << 30


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything static about a run, from the ConfigDict (`check_config`; `build` adds the
  parts that need the tokenizer or the data: `turns`, `sampling`, `greedy`).

  learner / settings: the LEARNERS name and its settings (`forward` and
  `num_generations`, episodes per task, derive from them). source: PROMPTS | ENV;
  tasks_field: the `train` field counting a batch's tasks. rollout: the data source's
  rollout block (dynamic sampling, overlong penalty; an environment's: the defaults). template, shuffle: the data source's
  prompt template and order. eval_*: greedy held-out episodes (an environment's).
  """

  learner: str
  settings: Any
  source: str
  tasks_field: str
  batch_tasks: int
  rollout: rollout_lib.RolloutConfig
  max_staleness: int | None
  temperature: float
  prompt_bucket: int
  max_new_tokens: int  # a turn's cap (a prompt's completion)
  turns: multiturn.TurnConfig | None = None  # env: from the rollout block; data: `build`
  sampling: sampling_lib.SamplingConfig | None = None
  greedy: sampling_lib.SamplingConfig | None = None
  template: str = ""
  shuffle: bool = False
  eval_every: int = 0
  eval_tasks: int = 0
  eval_batch_tasks: int = 0
  eval_seed_offset: int = 0
  trajectories_every: int = 0
  trajectories_logged: int = 0
  step_threads: int = 1
  per_turn_rewards: bool = False
  data: blocks.DataConfig | None = None  # a prompt dataset's `data` block
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


class Tasks(NamedTuple):
  """The environment and its tasks (`protocol.EnvTasks`); for a prompt dataset also its
  size (tasks are drawn by index in the cursor's order; None: seeds i*B+b) and the
  names its one-turn episodes report (reward functions, accuracy flags)."""

  env_tasks: protocol.EnvTasks
  size: int | None = None
  reward_names: tuple = ()
  accuracy_names: tuple = ()


class Pieces(NamedTuple):
  """Everything a run is built from (see `build`)."""

  setup: Setup
  tokenizer: Any
  tasks: Tasks
  state: step_lib.TrainState  # fresh: step 0
  learner: learner_lib.Learner
  sampler: rollout_lib.Sampler  # where rollouts run
  scorer: Any = None  # the reward model's jitted `scores(batch) -> [N]`, or None


def check_config(cfg, learner: str | None = None) -> Setup:
  """Validates the ConfigDict before anything is loaded (errors name the field, the value
  and the fix). `learner`: the default when the config names none (`learners.name_of`)."""
  name = learners_lib.name_of(cfg, learner)
  spec = learners_lib.spec(name)
  setup = _env_setup(cfg, name, spec) if "env" in cfg else _prompts_setup(cfg, name, spec)
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


def _prompts_setup(cfg, name: str, spec: learners_lib.LearnerSpec) -> Setup:
  """The data source's checks (configs/grpo_gsm8k.py, ppo_gsm8k.py)."""
  r = common.from_block(rollout_lib.RolloutConfig, cfg.rollout, "rollout", learners_lib.RENAMED)
  if r.dynamic_sampling and not spec.groups:
    common.fail(
      "rollout.dynamic_sampling",
      True,
      f"{name} samples one completion per prompt and its critic gives every sample a "
      "baseline: there are no tied groups to drop; use False",
    )
  s = common.from_block(blocks.SamplingBlock, cfg.sampling, "sampling")
  rollout_lib.check_training_sampling(
    s,
    _greedy_why(name, cfg.algo),
    "use e.g. 1.0. Greedy evaluation is experiments.eval_gsm8k's job.",
  )
  if s.max_new_tokens is None:
    common.fail("sampling.max_new_tokens", None, "must be >= 1 token")
  settings = spec.settings(cfg, "train.batch_prompts")
  if credit_lib.of(settings.algo).rewards == "turn":
    common.fail(
      "algo.credit",
      settings.algo.credit,
      "a prompt's completion is one turn: use 'episode' (turn and state credit are for "
      "environments)",
    )
  d = common.from_block(blocks.DataConfig, cfg.data, "data")
  common.check_loop_settings(cfg)
  if r.overlong_buffer and r.overlong_buffer > s.max_new_tokens:
    common.fail(
      "rollout.overlong_buffer",
      r.overlong_buffer,
      f"must be <= sampling.max_new_tokens={s.max_new_tokens}",
    )
  rollout_lib.check_off_policy(s, r.max_staleness, settings.algo.tis_cap)
  common.check_context(
    cfg,
    d.max_prompt_tokens + s.max_new_tokens,
    "data.max_prompt_tokens",
    d.max_prompt_tokens,
    f"with sampling.max_new_tokens={s.max_new_tokens} a sequence holds",
  )
  return Setup(
    learner=name,
    settings=settings,
    source=PROMPTS,
    tasks_field="train.batch_prompts",
    batch_tasks=cfg.train.batch_prompts,
    rollout=r,
    max_staleness=r.max_staleness,
    temperature=s.temperature,
    prompt_bucket=s.prompt_bucket,
    max_new_tokens=s.max_new_tokens,
    template=d.template,
    shuffle=d.shuffle,
    data=d,
  )


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


def _env_setup(cfg, name: str, spec: learners_lib.LearnerSpec) -> Setup:
  """An environment's checks (configs/agentic.py)."""
  turns = common.from_block(multiturn.TurnConfig, cfg.rollout, "rollout")
  s = common.from_block(blocks.SamplingBlock, cfg.sampling, "sampling")
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
  common.check_context(
    cfg,
    turns.max_prompt_tokens + turns.max_total_tokens,
    "rollout.max_total_tokens",
    turns.max_total_tokens,
    f"with rollout.max_prompt_tokens={turns.max_prompt_tokens} an episode holds",
  )
  log = common.from_block(blocks.LogConfig, cfg.log, "log")
  common.from_block(blocks.ToolsConfig, cfg.tools, "tools")
  settings = spec.settings(cfg, "train.batch_tasks")
  ev = common.from_block(blocks.EvalConfig, cfg.eval, "eval")
  rollout_lib.check_off_policy(s, cfg.max_staleness, settings.algo.tis_cap, "max_staleness")
  rewards = credit_lib.of(settings.algo).rewards  # episode: [N]; turn: [N, T]; either
  if cfg.per_turn_rewards and rewards == "episode":
    common.fail(
      "per_turn_rewards",
      True,
      "GRPO with algo.credit='episode' scores each episode by its summed reward: use False, "
      "algo.credit='turn' or 'state' (each turn's reward-to-go), or learner ppo (',ppo')",
    )
  if rewards == "turn" and not cfg.per_turn_rewards:
    common.fail(
      "algo.credit",
      settings.algo.credit,
      f"{settings.algo.credit} credit reads each turn's reward where the turn ends: set "
      "per_turn_rewards=True",
    )
  t = cfg.train
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
  return Setup(
    learner=name,
    settings=settings,
    source=ENV,
    tasks_field="train.batch_tasks",
    batch_tasks=t.batch_tasks,
    rollout=rollout_lib.RolloutConfig(),
    max_staleness=cfg.max_staleness,
    temperature=s.temperature,
    prompt_bucket=s.prompt_bucket,
    max_new_tokens=turns.max_turn_tokens,
    turns=turns,
    eval_every=ev.every,
    eval_tasks=ev.num_tasks,
    eval_batch_tasks=ev.batch_tasks,
    eval_seed_offset=ev.seed_offset,
    trajectories_every=log.trajectories_every,
    trajectories_logged=log.trajectories_logged,
    step_threads=cfg.rollout_threads,
    per_turn_rewards=cfg.per_turn_rewards,
    offers_tools=env_table.offers_tools(cfg.env.name, cfg.tools.enabled),
  )


def make_env(cfg) -> protocol.EnvTasks:
  """The `env` block's environment from the table (`rlpost.envs.table`), with the `tools`
  block's tools when enabled, and its tasks."""
  config = env_table.env_config(cfg.env)
  run_info = protocol.RunInfo(
    seed=cfg.seed,
    eval_seed_offset=cfg.eval.seed_offset,
    eval_tasks=cfg.eval.num_tasks,
    max_result_chars=cfg.tools.max_result_chars,
  )
  return env_table.make(cfg.env.name, config, run_info, cfg.tools.enabled)


def prompt_tasks(task: tasks_lib.Task, template: str, tokenizer) -> tuple[Tasks, str]:
  """A prompt dataset (`data.tasks.Task`) as one-turn episodes under a data template, in
  the tokenizer's chat format: (Tasks, scaffold template). Seed s is problem s of
  `task.problems`."""
  env, kind = single_turn.make_env(task, template, tokenizer)
  problems = task.problems
  pick = lambda seeds: [problems[s] for s in seeds]
  env_tasks = protocol.EnvTasks(env, pick, pick)
  names = tuple(task.reward_fns), tuple(task.accuracy_fns)
  return Tasks(env_tasks, len(problems), *names), kind


def with_task(p: Pieces, task: tasks_lib.Task, template: str) -> Pieces:
  """`p` training on another prompt dataset (e.g. a benchmark's fixed prompts) under a
  data template (fewshot | chat | plain)."""
  tasks, kind = prompt_tasks(task, template, p.tokenizer)
  turns = dataclasses.replace(p.setup.turns, template=kind)
  return p._replace(setup=dataclasses.replace(p.setup, template=template, turns=turns), tasks=tasks)


def build(cfg, loaded=None, learner: str | None = None, setup: Setup | None = None) -> Pieces:
  """Loads the model (or takes `loaded` = (config, params, tokenizer)) and builds the run
  (`setup`: `check_config`'s, when the caller has it; else checked here)."""
  setup = setup or check_config(cfg, learner)
  if setup.source == ENV:
    tasks = Tasks(make_env(cfg))
    turns = setup.turns
  else:  # the data file before the model (its errors fail fast), its lengths after
    task = tasks_lib.load_task(cfg.data, "train", cfg.seed)
  _, params, tokenizer = loaded or common.load_model(cfg)
  if setup.source != ENV:
    d = setup.data
    task, _ = limits.prompts_within(task, d.template, tokenizer, d.max_prompt_tokens, d.on_too_long)
    tasks, kind = prompt_tasks(task, setup.template, tokenizer)
    cap = setup.max_new_tokens
    turns = multiturn.TurnConfig(kind, cap, cap, max_prompt_tokens=_NO_PROMPT_CAP)
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
  cfg = common.with_compute_dtype(cfg, workdir)
  setup = check_config(cfg, learner)  # a bad config fails before the int8 calibration (seconds)
  cfg = common.with_int8_paths(cfg, workdir)
  p = build(cfg, loaded, setup=setup)
  setup = p.setup
  if setup.source == ENV and jax.default_backend() == "cpu":
    runtime.check_map_count()  # multi-turn rollouts compile a program per shape
  curves, postfix = _CURVES[ENV if setup.source == ENV else (PROMPTS, setup.learner)]
  title = "agentic" if setup.source == ENV else setup.learner
  loop = loop_lib.loop_config(cfg, f"{title}[{cfg.name}]", curves, postfix)
  with _pool(setup) as pool:
    step_fn, close, carry = loop_step(p, pool, workdir, setup.max_staleness, cfg.train.steps)
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
    p.setup.spec.policy_part,
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
  if p.setup.source == ENV:
    B, G = p.setup.batch_tasks, p.setup.num_generations
    mine = shares.block(B, p.setup.tasks_field)
    seeds = [index * B + b for b in range(B)][mine]
    tasks = p.tasks.env_tasks.train_tasks(seeds)
    out = _play(p, pool, params_s, tasks, seeds, key, p.setup.sampling, G, mine.start * G)
    metrics = reports.episode_metrics(out.episodes)
  else:
    out, metrics, cursor = _collect_prompts(p, pool, params_s, cursor, key)
  if p.scorer is not None:
    out, scored = _with_learned_reward(p, out)
    metrics = {**metrics, **scored}
  del params_s, weights
  host_memory.release_freed_memory()  # the sampler's weight copies, before the train step
  return (out, metrics, time.perf_counter() - start), cursor


def _collect_prompts(p: Pieces, pool, params_s, cursor: Cursor, key):
  """`batch_prompts` prompts of the data cursor, G one-turn episodes each, scored; with
  DAPO's options: the overlong penalty added to the rewards, dynamic sampling.

  Dynamic sampling drops groups whose G rewards are all equal (zero advantage, no
  signal) and draws further prompts, up to `max_resample_rounds` extra rounds; if the
  batch is still short it is filled with dropped groups (they contribute no policy
  gradient) and `dynamic/filled` counts them. With several processes each plays every
  round whole (sampling is not split) and trains on its block of the groups chosen. A
  group learner's rounds sample with key fold_in(key, round) (as runs before the one
  recipe did). Returns (Rollout, metrics, cursor).
  """
  setup, tasks = p.setup, p.tasks
  B, G, r = setup.batch_tasks, setup.num_generations, setup.rollout
  groups = setup.spec.groups
  # With several processes, dynamic sampling has every process play each round whole, so
  # all keep the same groups (those one process would keep) and take their block of them.
  everyone = r.dynamic_sampling and jax.process_count() > 1
  kept, dropped, rounds, errors = [], [], 0, {}
  while True:
    idx, cursor = next_indices(cursor, tasks.size, B, shuffle=setup.shuffle)
    mine = slice(0, B) if everyone else shares.block(B, setup.tasks_field)
    seeds = [int(i) for i in idx[mine]]
    round_key = jax.random.fold_in(key, rounds) if groups else key
    problems = tasks.env_tasks.train_tasks(seeds)
    out = _play(p, pool, params_s, problems, seeds, round_key, setup.sampling, G, mine.start * G)
    out, penalty = _with_overlong_penalty(out, setup)
    for name, n in reports.reward_errors(out, tasks.reward_names).items():
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
    chosen = shares.take(chosen, setup.tasks_field)
  whole = rounds == 1 and not dropped and not everyone
  out, penalty = _groups_of(chosen, G, setup.sampling.pad_id, whole)
  extra = {} if penalty is None else {"overlong_penalty": penalty}
  metrics = {
    **errors,
    **reports.single_turn_metrics(out, tasks.reward_names, tasks.accuracy_names, extra),
  }
  if groups:
    metrics.update({"dynamic/rounds": rounds, "dynamic/filled": filled})
  return out, metrics, cursor


def _with_overlong_penalty(out: multiturn.Rollout, setup: Setup):
  """(out with DAPO's soft overlong penalty added to its rewards, the penalty [N] float32),
  or (out, None) when rollout.overlong_buffer is off."""
  r = setup.rollout
  if not r.overlong_buffer:
    return out, None
  penalty = np.asarray(
    adv_lib.overlong_penalty(
      jnp.asarray(out.batch.loss_mask.sum(1)),
      max_len=setup.sampling.max_new_tokens,
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
    p.tasks.env_tasks.env,
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
  if setup.source == PROMPTS:
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
    tasks = p.tasks.env_tasks.eval_tasks(part)
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
  actor = learners_lib.policy_of(p.setup.spec.policy_part, state.trainable)
  mesh = sharding.mesh_of(state)
  sampler = p.sampler._replace(int8=None)
  key = jax.random.key(0)
  params_s, key = rollout_lib.sampler_weights(sampler, actor, p.setup.forward, key, mesh)
  return _play(p, pool, params_s, tasks, seeds, key, p.setup.greedy, 1, 0)
