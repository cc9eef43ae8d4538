"""reasoning-gym tasks as environments (`env.name=reasoning_gym`, the `reasoning-gym` extra).

An episode is one item of a procedural generator: its question, then the instruction to
give the final answer between <answer> and </answer>. The reward is the package's own
`score_answer(extracted, item)` on the text of the last <answer> span (0.0 when there is
none; a scorer that raises scores 0.0 too: never an exception; it runs in a worker process
and scores 0.0 past `rlpost.rewards.bounded.TIMEOUT_S`: never a hang), or, with `env.checker`
exact | math_verify, 1.0 when that checker accepts the span against the item's answer.
With `env.retries` = k > 0 a wrong answer is told "not correct" and the model answers
again, up to k more times; the episode's reward is the last answer's.
Refused by name: a generator whose score_answer credits a wrong reply (`BROKEN_SCORERS`:
use checker=exact), and exact or math_verify on items without a reference answer
(graph_color, boxnet, ...: only their score_answer judges a reply). A generator with an
item limit (`MAX_ITEMS`: word_ladder, 20,000) holds the pool to it and cuts the held-out
stream to it.
`env.answer_format="cue"` (for base models, which do not follow the tag instruction: the
base Gemma 3 270M gave no <answer> span on 64 of 64 chain_sum items) ends the prompt with
"Answer:" instead, stops the reply at its first newline and scores that line.

Items come from the generator by index: training seed s (0 <= s < `env.pool`, drawn by
the data cursor) is item s of the generator seeded `env.seed`; held-out seed
eval_seed_offset + k is item k of the generator seeded `env.seed + eval_seed_offset`,
and the recipe evaluates those whose normalised question (`content_key`) is none of the
training pool's nor an earlier held-out item's (`rlpost.envs.held_out`: the run logs
and reports eval/overlap = 0 and how many it skipped).

`env.task`: a generator's name (`reasoning_gym.factory.DATASETS`) with `env.task_config`
its config's fields (a dict or a JSON object string, e.g. '{"min_terms": 2}'); or a
mixture "chain_sum:2,basic_arithmetic:1" (name:weight, comma-separated), each drawn with
its weight by the item's seed and built with its own defaults overridden by the
`task_config` entries keyed by its name ({"chain_sum": {"max_terms": 3}}).
"""

import dataclasses
import json
import math
import random
from typing import Any, NamedTuple


from rlpost.envs import block_fields
from rlpost.envs import held_out
from rlpost.envs import protocol
from rlpost.rewards import bounded
from rlpost.rewards import checkers
from rlpost.rewards import extras

_HERE = "rlpost.envs.reasoning_gym"
CHECKERS = ("score_answer",) + checkers.CHECKERS
# Generators whose score_answer (reasoning-gym 0.1.25) gives full credit to a wrong reply a
# policy finds at once: refused with checker=score_answer (tests/test_reasoning_gym.py
# shows each reply scoring 1.0, so a fixed release fails that test and this entry goes).
BROKEN_SCORERS = {
  "game_of_life_halting": "gives 1.0 to any non-empty reply (it compares bool(reply) with "
  "bool(answer), and bool('False') is True)",
  "coin_flip": "gives 1.0 to the reply '0' for every probability below 1 (its partial "
  "credit divides the matching prefix by the shorter string's length)",
}
# The most items a generator makes (its config refuses a larger `size`): the training pool
# is held to it, the held-out stream cut to it.
MAX_ITEMS = {"word_ladder": 20_000}
INSTRUCTION = (
  "Give your final answer between <answer> and </answer>, e.g. <answer>your answer</answer>."
)
RETRY = (
  "That answer is not correct. Try again; give your final answer between <answer> and </answer>."
)
NO_ANSWER = "No <answer>...</answer> found. Give your final answer between <answer> and </answer>."
CUE = "Answer:"  # answer_format="cue": the prompt ends here; the reply's first line answers
CUE_RETRY = "That answer is not correct. Try again.\nAnswer:"
FORMATS = ("tags", "cue")


def _bad(field: str, value, fix: str):
  raise ValueError(f"{field}={value!r}: {fix}")


def parse_tasks(task: str) -> tuple[tuple[str, float], ...]:
  """ "name" or "name:weight,name:weight" -> ((name, weight), ...) (weights > 0)."""
  out = []
  for part in task.split(","):
    name, _, weight = part.strip().partition(":")
    try:
      w = float(weight) if weight else 1.0
    except ValueError:
      w = -1.0
    if not name:
      _bad("task", task, "write a generator's name, or name:weight pairs, comma-separated")
    if not 0 < w < math.inf:
      _bad(
        "task", task, f"{name}'s weight {weight!r} is not a positive finite number; e.g. {name}:1"
      )
    out.append((name, w))
  if len({n for n, _ in out}) != len(out):
    _bad("task", task, "names a generator twice; give each one weight")
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class ReasoningGymConfig:
  """The `env` block (module docstring); checked on construction, the generators built
  once to check `task_config`."""

  task: str = "chain_sum"
  task_config: Any = ""
  pool: int = 1000
  seed: int = 0
  checker: str = "score_answer"
  retries: int = 0
  answer_format: str = "tags"

  def __post_init__(self):
    rg = extras.load("reasoning_gym", "config.env.name='reasoning_gym'")
    tasks = parse_tasks(self.task)
    known = sorted(rg.factory.DATASETS)
    for name, _ in tasks:
      if name not in known or name == "composite":
        _bad("task", name, f"is not a reasoning-gym generator; use one of {known}")
    object.__setattr__(
      self, "task_config", block_fields.frozen_json(self.task_config, "task_config")
    )
    if not isinstance(self.pool, int) or self.pool < 1:
      _bad("pool", self.pool, "must be an integer >= 1 (training items)")
    if not isinstance(self.retries, int) or self.retries < 0:
      _bad("retries", self.retries, "must be an integer >= 0 (answers after the first)")
    if self.answer_format not in FORMATS:
      _bad("answer_format", self.answer_format, f"use one of {FORMATS}")
    if self.checker not in CHECKERS:
      _bad("checker", self.checker, f"use one of {CHECKERS}")
    if self.checker == "math_verify":
      checkers.check(self.checker)
    if self.pool > max_items(self):
      _bad("pool", self.pool, f"{self.task} makes at most {max_items(self)} items; lower it")
    for name, dataset in generators(self, 0, 1).items():  # their checks of task_config, now
      if self.checker == "score_answer" and name in BROKEN_SCORERS:
        _bad(
          "task", name, f"its score_answer {BROKEN_SCORERS[name]}; use --config.env.checker=exact"
        )
      if self.checker != "score_answer" and dataset[0]["answer"] is None:
        _bad(
          "checker",
          self.checker,
          f"{name}'s items carry no reference answer (its score_answer checks a reply, several "
          "may be right): use score_answer",
        )

  def task_configs(self) -> dict:
    """name -> its generator's config fields."""
    fields = json.loads(self.task_config)
    tasks = parse_tasks(self.task)
    if len(tasks) == 1:
      return {tasks[0][0]: fields}
    unknown = sorted(set(fields) - {n for n, _ in tasks})
    if unknown:
      _bad(
        "task_config",
        fields,
        f"a mixture's config is keyed by its generators' names; {unknown} is not one",
      )
    return {name: fields.get(name, {}) for name, _ in tasks}


def max_items(config: ReasoningGymConfig) -> float:
  """The most items every generator of the task makes (`MAX_ITEMS`; inf: no limit)."""
  return min(MAX_ITEMS.get(name, math.inf) for name, _ in parse_tasks(config.task))


def generators(config: ReasoningGymConfig, seed: int, size: int) -> dict:
  """name -> the generator seeded `seed` with `size` items (errors name task_config)."""
  rg = extras.load("reasoning_gym", "config.env.name='reasoning_gym'")
  out = {}
  for name, fields in config.task_configs().items():
    try:
      out[name] = rg.create_dataset(name, **{**fields, "seed": seed, "size": size})
    except (TypeError, ValueError, AssertionError) as err:
      _bad("task_config", fields, f"{name} refuses it: {err!r}")
  return out


class Source(NamedTuple):
  """Items of one seeded stream: index -> (name, item)."""

  datasets: dict
  weights: tuple[tuple[str, float], ...]
  seed: int

  def item(self, index: int) -> tuple[str, dict]:
    names = [n for n, _ in self.weights]
    name = names[0]
    if len(names) > 1:
      name = random.Random(f"{self.seed}:{index}").choices(names, [w for _, w in self.weights])[0]
    return name, self.datasets[name][index]


class State(NamedTuple):
  """An episode: the generator's name, its item (never changed), answers given so far."""

  name: str
  item: dict
  attempts: int


def normalise(question: str) -> str:
  """A question as compared for duplicates: lower-cased, whitespace collapsed."""
  return " ".join(question.lower().split())


def answer_in(config: ReasoningGymConfig, text: str) -> str | None:
  """The answer `text` gives: with answer_format="cue" its first line, else the last
  <answer> span (`checkers.extract_answer`); None without one."""
  if config.answer_format == "cue":
    return text.strip().split("\n")[0].strip() or None
  return checkers.extract_answer(text)


def score(config: ReasoningGymConfig, state: State, text: str) -> tuple[float, bool]:
  """(reward, answered) of `text`: the checker's verdict on its answer (the <answer> span;
  with answer_format="cue" its first line); 0.0 and False without one. Never raises: a
  scorer's exception scores 0.0. score_answer runs in a worker process (a scorer can
  spend hours on a reply: coin_flip's on "1e999999999"), 0.0 past `bounded.TIMEOUT_S`;
  it reads the item and its generator's config (the training generators')."""
  found = answer_in(config, text)
  if found is None:
    return 0.0, False
  if config.checker == "score_answer":
    setup = (_HERE + ":scorers", (config.task, config.task_config, config.seed, config.pool))
    args = (state.name, found, state.item)
    value = bounded.call(_HERE + ":score_here", args, 0.0, setup=setup)
  else:
    value = float(checkers.get(config.checker)(found, str(state.item["answer"])))
  return (value if value == value else 0.0), True  # NaN -> 0


def scorers(task: str, task_config: str, seed: int, pool: int) -> dict:
  """The training generators of the config these fields give (name -> generator), built
  once in a scoring worker (`rlpost.rewards.bounded`)."""
  config = ReasoningGymConfig(task=task, task_config=task_config, seed=seed, pool=pool)
  return generators(config, seed, pool)


def score_here(datasets: dict, name: str, answer: str, item: dict) -> float:
  """The package's score_answer of `answer`, in this process; 0.0 when it raises."""
  try:
    return float(datasets[name].score_answer(answer, item))
  except Exception:  # pylint: disable=broad-except  (the issue: never an exception)
    return 0.0


def make_env(config: ReasoningGymConfig) -> protocol.Env:
  """The environment; a task is a State (from `train_tasks` / `eval_tasks`)."""

  def reset(task: State, seed: int):
    del seed  # the item is the task
    if config.answer_format == "cue":
      return task, f"{task.item['question']}\n{CUE}"
    return task, f"{task.item['question']}\n\n{INSTRUCTION}"

  def step(state: State, text: str) -> protocol.Step:
    reward, answered = score(config, state, text)
    new = state._replace(attempts=state.attempts + 1)
    done = reward >= 1.0 or new.attempts > config.retries
    info = {
      "success": reward >= 1.0,
      "invalid_action": not answered,
      "answer": str(state.item["answer"]),
    }
    if config.answer_format == "cue":
      feedback = "" if done else CUE_RETRY
    else:
      feedback = "" if done else (RETRY if answered else NO_ANSWER)
    return protocol.Step(new, feedback, reward if done else 0.0, done, info)

  stops = ("\n",) if config.answer_format == "cue" else ("</answer>",)
  return protocol.Env(
    "reasoning_gym", reset, step, max_turns=config.retries + 1, stop_strings=stops
  )


def held_out_stream(count: int) -> int:
  """Items of the held-out generator: as many as `held_out.choose` may examine for `count`
  evaluation items (items are made on access, so the size costs nothing)."""
  return max(held_out.MIN_MAX_DRAWS, 100 * count)


def content_key(state: State, seed: int) -> str:
  """What an item is about, for the held-out set (`held_out.choose`): its normalised
  question."""
  del seed
  return normalise(state.item["question"])


def build(config: ReasoningGymConfig, run: protocol.RunInfo) -> protocol.EnvTasks:
  """Training items 0 .. pool-1; held-out seed offset + k: item k of the held-out stream
  (the recipe keeps the seeds whose question is new: `held_out.choose`)."""
  if config.pool > run.eval_seed_offset:
    _bad(
      "pool", config.pool, f"must be <= eval.seed_offset={run.eval_seed_offset} (disjoint seeds)"
    )
  weights = parse_tasks(config.task)
  train = Source(generators(config, config.seed, config.pool), weights, config.seed)
  held_seed = config.seed + run.eval_seed_offset
  size = min(held_out_stream(run.eval_tasks), max_items(config))
  held = Source(generators(config, held_seed, size), weights, held_seed)
  env = make_env(config)

  def train_tasks(seeds):
    return [State(*train.item(s), 0) for s in seeds]

  def eval_tasks(seeds):
    ks = [s - run.eval_seed_offset for s in seeds]
    if any(not 0 <= k < size for k in ks):
      raise ValueError(f"held-out seeds {seeds} outside the held-out stream's {size} items")
    return [State(*held.item(k), 0) for k in ks]

  return protocol.EnvTasks(
    env, train_tasks, eval_tasks, pool=config.pool, shuffle=True, content_key=content_key
  )
