"""GSM8K-style evaluation: greedy answer/format accuracy and pass@k with sampling.

`evaluate_run` is what experiments/eval_gsm8k.py runs: the base model and,
given a GRPO run directory, its newest checkpoint, on the same problems: the split's
first problems whose normalised question (`prompt_dataset.normalized_question`) is no
training problem's or solved example's, nor an earlier one's (GSM8K's test split has
none of either: all 1,319 are kept). Each greedy evaluation of a run's workdir writes
its per-problem outcomes (`item_outcomes`): the base model as step 0, the trained
checkpoint as its iteration.
"""

import dataclasses
import hashlib
import math
import numbers

import jax
import numpy as np
import tqdm

from rlpost import config_moves
from rlpost import errors
from rlpost import sampling
from rlpost.data import gsm8k
from rlpost.data import prompts as prompts_lib
from rlpost.models import policy
from rlpost.data import tasks as tasks_lib
from rlpost.envs import held_out as held_out_lib
from rlpost.envs import prompt_dataset
from rlpost.envs import table as env_table
from rlpost.recipes import common
from rlpost.recipes import eval_progress
from rlpost.recipes import item_outcomes
from rlpost.recipes import rl_config
from rlpost.rewards import checkers
from rlpost.rewards import gsm8k as gsm8k_rewards
from rlpost.rl import batch as batch_lib
from rlpost.serve import engine as engine_lib
from rlpost.serve import offline
from rlpost.train import checkpoint

PASS_TEMPERATURE = 0.8  # pass@k's sampling temperature unless config.eval.pass_temperature
BATCH_SIZE = 8  # problems per sampling call unless config.eval.batch_size


def _completions(params, model_config, tokenizer, problems, template, examples, sc, key, k):
  ids = [prompts_lib.prompt_ids(p, template, examples, tokenizer) for p in problems]
  tokens, lengths = sampling.pad_prompts(ids, sc)
  out = jax.device_get(
    sampling.sample(
      params, tokens, lengths, key, model_config=model_config, config=sc, num_samples=k
    )
  )
  batch = batch_lib.from_samples(tokens, lengths, out, k)
  if template != "plain":
    batch = batch_lib.truncate_at_stop_strings(batch, tokenizer, prompts_lib.STOP_STRINGS)
  prefix = prompts_lib.completion_prefix(template)
  return [prefix + c for c in batch_lib.completion_texts(batch, tokenizer)]


def answer_checker(checker: str = "exact"):
  """`correct(completion, truth) -> bool` of an `env.checker`: exact, GSM8K's own numeric
  check (`rewards.gsm8k.is_correct`); math_verify, math-verify on the <answer> span."""
  if checker == "exact":
    return gsm8k_rewards.is_correct
  reward = checkers.answer_reward(checkers.get(checker))
  return lambda completion, truth: reward([""], [completion], [truth])[0] > 0


def accuracy_report(
  problems, greedy: list[str], samples: list[str], pass_k: int, correct=gsm8k_rewards.is_correct
) -> dict:
  """Accuracies of completions already generated (host side, pure).

  Args:
    problems: the `Problem`s, in order.
    greedy: one greedy completion per problem.
    samples: `pass_k` sampled completions per problem, problem-major (empty if pass_k == 0).
    pass_k: samples per problem; pass@k counts a problem solved if ANY sample is correct.
  Returns greedy answer/format accuracy, pass@k and the first three greedy completions.
  """
  if len(greedy) != len(problems) or len(samples) != len(problems) * pass_k:
    raise ValueError(
      f"{len(problems)} problems need {len(problems)} greedy completions and "
      f"{len(problems) * pass_k} samples (pass_k={pass_k}); got {len(greedy)} "
      f"and {len(samples)}"
    )
  report = {
    "num_problems": len(problems),
    "greedy_answer_accuracy": float(
      np.mean([correct(c, p.final) for c, p in zip(greedy, problems)])
    ),
    "greedy_format_accuracy": float(np.mean([gsm8k_rewards.has_format(c) for c in greedy])),
    "examples": [
      {"question": p.question, "truth": p.final, "completion": c}
      for c, p in zip(greedy[:3], problems)
    ],
  }
  if pass_k:
    hits = np.array(
      [correct(c, p.final) for c, p in zip(samples, [p for p in problems for _ in range(pass_k)])]
    )
    report[f"pass@{pass_k}"] = float(np.mean(hits.reshape(len(problems), pass_k).any(1)))
  return report


def evaluate(
  params,
  model_config,
  tokenizer,
  problems,
  *,
  template: str,
  examples,
  sampling_config: sampling.SamplingConfig,
  batch_size: int = BATCH_SIZE,
  pass_k: int = 4,
  temperature: float = PASS_TEMPERATURE,
  seed: int = 0,
  desc: str = "eval",
  outcomes: tuple[str, int, list[int]] | None = None,
  checker: str = "exact",
) -> dict:
  """Accuracy report over `problems` (see `accuracy_report`).

  Greedy decoding (`batch_size` slots of continuous batching, `_greedy`) gives
  `answer_accuracy` and `format_accuracy`; `pass_k` samples at `temperature`, drawn
  `batch_size` problems a call, give pass@k (any of k correct).
  outcomes: (workdir, step, each problem's index in its split): the per-problem outcomes
  go to workdir/eval/step_<step>.jsonl; each chunk of `batch_size` problems is kept as it
  finishes (`eval_progress`), so an interrupted evaluation resumes.
  checker: how an answer is checked (`answer_checker`: the env block's `checker`).
  """
  sample_sc = dataclasses.replace(sampling_config, temperature=temperature)
  key = jax.random.key(seed)
  workdir, step, ids = outcomes or ("", 0, list(range(len(problems))))
  keep = eval_progress.enabled(workdir)
  settings = (template, examples, sampling_config, batch_size, pass_k, temperature, seed)
  digest = _digest(params, settings, problems) if keep else ""
  starts = range(0, len(problems), batch_size)
  greedy, samples = _kept_chunks(workdir, step, ids, digest, batch_size) if keep else ({}, {})
  greedy = [greedy.get(i) for i in range(len(problems))]
  bar = tqdm.tqdm(total=len(problems), initial=len(problems) - greedy.count(None), desc=desc)

  def finished(i: int, text: str) -> None:
    """Problem i's greedy completion; a chunk whose every one is in draws its samples and
    is kept."""
    greedy[i] = text
    bar.update(1)
    start = i - i % batch_size
    chunk = greedy[start : start + batch_size]
    if start in samples or None in chunk:
      return
    samples[start] = []
    if pass_k:
      samples[start] = _completions(
        params,
        model_config,
        tokenizer,
        problems[start : start + batch_size],
        template,
        examples,
        sample_sc,
        jax.random.fold_in(key, start),
        pass_k,
      )
    if keep:
      part = ids[start : start + batch_size]
      eval_progress.save(workdir, step, start, part, digest, [chunk, samples[start]])

  todo = [i for i, text in enumerate(greedy) if text is None]
  greedy_sc = dataclasses.replace(sampling_config, temperature=0.0)
  args = (params, model_config, tokenizer, problems, template, examples, greedy_sc)
  _greedy(args, todo, batch_size, finished, key)
  bar.close()
  samples = [text for start in starts for text in samples[start]]
  correct = answer_checker(checker)
  report = {**accuracy_report(problems, greedy, samples, pass_k, correct), "template": template}
  if outcomes:
    item_outcomes.write(workdir, step, problem_items(problems, greedy, ids, correct))
  if keep:
    eval_progress.clear(workdir, step)
  if pass_k:
    report["sampling_temperature"] = temperature
  return report


def _kept_chunks(workdir: str, step: int, ids, digest: str, batch_size: int):
  """({problem index: greedy text}, {chunk start: its samples}) of the chunks of
  `batch_size` problems an interrupted evaluation finished (`eval_progress`)."""
  greedy, samples = {}, {}
  for start in range(0, len(ids), batch_size):
    part = ids[start : start + batch_size]
    kept = eval_progress.load(workdir, step, start, part, digest)
    if kept is not None:
      greedy.update(zip(range(start, start + len(part)), kept[0], strict=True))
      samples[start] = kept[1]
  return greedy, samples


def _greedy(args: tuple, todo: list[int], batch_size: int, finished, key) -> None:
  """Greedy completions of the problems `todo` indexes (`args`: `_greedy_by_slots`'s
  first seven), `finished(i, text)` as each ends: through the slots on one process; on
  several, every process samples every batch of `batch_size` (the slots are one
  process's)."""
  if jax.process_count() == 1:
    _greedy_by_slots(*args, todo, batch_size, finished)
    return
  problems = args[3]
  for start in range(0, len(todo), batch_size):
    part = todo[start : start + batch_size]
    texts = _completions(*args[:3], [problems[i] for i in part], *args[4:], key, 1)
    for i, text in zip(part, texts, strict=True):
      finished(i, text)


def _greedy_by_slots(
  params, model_config, tokenizer, problems, template, examples, sc, todo, rows, finished
):
  """Greedy completions of `problems[i]` for i in `todo` through `rows` slots of
  continuous batching; `finished(i, text)` as each ends. A completion's text is the
  sampler path's (`_completions`): cut at the prompt's stop strings (not for "plain"),
  the template's opened prefix in front."""
  if not todo:
    return
  stops = () if template == "plain" else prompts_lib.STOP_STRINGS
  prompts = [prompts_lib.prompt_ids(problems[i], template, examples, tokenizer) for i in todo]
  context = max(map(len, prompts)) + sc.max_new_tokens
  engine = engine_lib.Engine(params, model_config, tokenizer, "eval", context, sc.max_new_tokens)
  prefix = prompts_lib.completion_prefix(template)

  def done(j: int, ids: list[int]) -> None:
    end = batch_lib.stop_length(ids, tokenizer, stops) if stops else None
    finished(todo[j], prefix + tokenizer.decode(ids if end is None else ids[:end]))

  offline.decode_all(
    engine,
    prompts,
    budget=sc.max_new_tokens,
    rows=rows,
    stops=stops,
    stop_ids=sc.stop_ids,
    on_done=done,
  )


def _digest(params, settings: tuple, problems) -> str:
  """What a kept chunk must match to be reused: the weights' fingerprint and every other
  input of a completion (template, solved examples, sampling settings, batch size,
  pass@k, temperature, seed, the problems' questions: another split has other ones)."""
  text = repr((settings, [p.question for p in problems]))
  return eval_progress.fingerprint(params) + hashlib.sha256(text.encode()).hexdigest()[:16]


def problem_items(
  problems, greedy: list[str], ids: list[int], correct=gsm8k_rewards.is_correct
) -> list[dict]:
  """The outcome lines (`item_outcomes`) of greedy completions: success and reward 1 when
  the answer is correct, the content key the normalised question's digest, the reference
  answer."""
  lines = []
  for problem, completion, i in zip(problems, greedy, ids, strict=True):
    right = correct(completion, problem.final)
    key = held_out_lib.key_digest(prompt_dataset.normalized_question(problem.question))
    lines.append(item_outcomes.item(i, key, float(right), right, 1, completion, problem.final))
  return lines


def held_out_problems(problems, trained, num: int, split: str):
  """(the first `num` of `problems` whose normalised question is none of `trained`'s nor
  an earlier kept one's, their indices in `problems`, the report's "held_out" counts).
  On the train split nothing is excluded (its problems are the training ones)."""
  key = lambda p: prompt_dataset.normalized_question(p.question)
  train_keys = {key(p) for p in trained}
  first = [key(p) for p in problems[:num]]
  counts = {"overlap_before": sum(k in train_keys for k in first)}
  counts["distinct_before"] = len(set(first))
  if split == "train":
    ids = list(range(min(num, len(problems))))
    return [problems[i] for i in ids], ids, {**counts, "excluded": "none (the train split)"}
  ids, seen = [], set()
  for i, k in enumerate(map(key, problems)):
    if len(ids) == num:
      break
    if k not in train_keys and k not in seen:
      ids.append(i)
    seen.add(k)
  counts.update({"overlap": 0, "distinct": len(ids)})
  return [problems[i] for i in ids], ids, counts


def _dataset(cfg):
  """(cfg with old field names at their new places, its `env` block: a prompt dataset's
  typed config, `rlpost.envs.prompt_dataset`); a run's config.json from before the move
  (a `data` block) reads the same."""
  try:
    cfg = config_moves.migrate(cfg)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
  return cfg, env_table.env_config(cfg.env)


def _sampling_config(cfg, tokenizer) -> sampling.SamplingConfig:
  """The `sampling` block's settings, stopping at EOS and the end of a turn."""
  return sampling.SamplingConfig(
    temperature=cfg.sampling.temperature,
    stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id),
    max_new_tokens=cfg.sampling.max_new_tokens,
    pad_id=tokenizer.pad_id,
    prompt_bucket=cfg.sampling.prompt_bucket,
  )


def solution_sampler(cfg):
  """`sample(problems, key, k) -> completions` (k per problem, problem-major) of the
  config's model (`model.init_from`: an earlier run's weights) at `sampling.temperature`,
  prompts in `env.template` (a prompt dataset's `env` block). Loads the model once."""
  cfg, data = _dataset(cfg)
  task = tasks_lib.load_task(data, "train", cfg.seed)
  config, params, tokenizer = common.load_model(cfg)
  sc = _sampling_config(cfg, tokenizer)

  def sample(problems, key, k: int) -> list[str]:
    return _completions(
      params, config, tokenizer, problems, data.template, task.examples, sc, key, k
    )

  return sample


def evaluate_run(
  cfg,
  workdir: str = "",
  *,
  split: str = "test",
  num_problems: int | None = None,
  pass_k: int | None = None,
  base: bool = True,
  batch_size: int | None = None,
) -> dict:
  """Report {"split", "base": ..., "trained": ...} for a GRPO or PPO ConfigDict.

  "trained" (with the checkpoint's iteration) only when `workdir` holds a run;
  "base" unless `base=False`. num_problems / pass_k / batch_size: None takes the
  config's `eval` block (BATCH_SIZE for a config.json without `batch_size`); pass@k
  samples at its `pass_temperature` (PASS_TEMPERATURE for a run whose config.json
  predates that field)."""
  cfg, data = _dataset(cfg)
  num_problems = cfg.eval.num_problems if num_problems is None else num_problems
  pass_k = cfg.eval.pass_k if pass_k is None else pass_k
  temperature = cfg.eval.get("pass_temperature", PASS_TEMPERATURE)
  batch_size = cfg.eval.get("batch_size", BATCH_SIZE) if batch_size is None else batch_size
  _check_counts(num_problems, pass_k, temperature, batch_size)
  # Before the model: an unknown split or a missing data_dir fails at once.
  problems = gsm8k.load_gsm8k(split, data.data_dir)
  c = rl_config.parse(cfg)  # the run's typed config: its learner, settings and model
  task = tasks_lib.load_task(data, "train", cfg.seed)
  trained = list(task.problems) + list(task.examples)
  problems, ids, counts = held_out_problems(problems, trained, num_problems, split)
  _, params, tokenizer = common.load_model(c)
  learner, state = c.spec.build(c, params, c.settings)
  forward = c.settings.forward
  sc = _sampling_config(cfg, tokenizer)
  settings = {
    "template": data.template,
    "examples": task.examples,
    "sampling_config": sc,
    "pass_k": pass_k,
    "batch_size": batch_size,
    "temperature": temperature,
    "seed": cfg.seed,
    "checker": data.checker,
  }
  report = {"split": split, "held_out": counts, "checker": data.checker}
  if base:  # the base params under LoRA (or kept beside a copy that trains), else untrained
    weights = learner.frozen if learner.frozen is not None else state.trainable["policy"]
    out = (workdir, 0, ids) if workdir else None
    report["base"] = evaluate(
      weights, forward.model, tokenizer, problems, desc="base", outcomes=out, **settings
    )
  if workdir:
    with checkpoint.manager(workdir, read_only=True) as mngr:
      restored = checkpoint.restore_latest(mngr, state, read_only=True)
    if restored is None:
      raise FileNotFoundError(f"no checkpoint in {workdir}/checkpoints")
    trained, meta = restored
    params = policy.sampling_params(trained.trainable["policy"], learner.frozen, forward)
    out = (workdir, meta["iteration"], ids)
    report["trained"] = evaluate(
      params, forward.model, tokenizer, problems, desc="trained", outcomes=out, **settings
    )
    report["trained"]["iteration"] = meta["iteration"]
  return report


def _check_counts(num_problems, pass_k, temperature, batch_size) -> None:
  """Refuses an evaluation's counts and pass@k temperature, naming the `eval` field."""
  if not (isinstance(batch_size, numbers.Integral) and batch_size >= 1):
    common.fail(
      "eval.batch_size", batch_size, "must be an integer >= 1 (slots; pass@k: problems a call)"
    )
  if num_problems < 1:
    common.fail(
      "eval.num_problems", num_problems, "must be >= 1 problem (--num_problems or config.eval)"
    )
  if pass_k < 0:
    common.fail(
      "eval.pass_k",
      pass_k,
      "must be >= 0 samples per problem (0: greedy only; --pass_k or config.eval)",
    )
  if pass_k and not (isinstance(temperature, numbers.Real) and 0 < temperature < math.inf):
    common.fail(
      "eval.pass_temperature",
      temperature,
      "must be a finite number > 0 for pass@k sampling (greedy accuracy is reported anyway)",
    )
