r"""What copying a number from the question scores on a reasoning-gym run's held-out items:
yardsticks for its greedy results, and how many of its replies are such copies.

  python -m experiments.reasoning_gym_baselines --workdir=SEED_DIR

reads the run's `config.json` (its env block: task, task_config, answer format, checker)
and its per-item evaluations (`WORKDIR/eval/step_N.jsonl`, `rlpost.recipes.item_outcomes`),
rebuilds the same held-out items (`rlpost.envs.reasoning_gym.build`) and scores, through
the env's own step (the package's `score_answer` on the extracted answer):

- `first_number` / `last_number`: the first / last number the question writes, copied as
  written (e.g. number_format's first candidate, a sequence's first term);
- `random_number`: a uniformly random one of the question's numbers, as the exact
  expectation (each item's mean score over its numbers; no draws).

Each evaluation step's replies are replayed through the same step (a reply that does not
score as recorded is an error: the items or the config are not the run's) and counted:
`successes`, `copies` (replies whose answer is one of the question's numbers, by value),
`first_number_copies` and `last_number_copies` (the question's first / last number). A
run whose successes are such copies, at a yardstick's rate, learned the copy, not the task (`experiments/results/INDEX.md`).

Prints one JSON object: the items, the yardsticks' successes, and per step the counts.
"""

import json
import os
import re

from absl import flags

from experiments import cli
from rlpost import errors
from rlpost.envs import protocol, reasoning_gym
from rlpost.envs import table as env_table
from rlpost.recipes import item_outcomes

# a number as questions write them: sign, thousands commas, decimals, an exponent
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][+-]?\d+)?")


def numbers(text: str) -> list[str]:
  """The numbers `text` writes, in order, as written (e.g. ['345,155,255.352', '3.4e+08'])."""
  return _NUMBER.findall(text)


def value(text: str) -> float | None:
  """The value of `text` if it is one number (commas allowed), else None."""
  text = text.strip()
  return float(text.replace(",", "")) if _NUMBER.fullmatch(text) else None


def reply_with(config: reasoning_gym.ReasoningGymConfig, answer: str) -> str:
  """A reply that gives `answer` in the run's answer format."""
  return f" {answer}\n" if config.answer_format == "cue" else f"<answer>{answer}</answer>"


def scored(env, task, reply: str) -> tuple[float, bool]:
  """(reward, success) of one reply to `task` through the env's reset and step."""
  state, _ = env.reset(task, 0)
  step = env.step(state, reply)
  return step.reward, bool(step.info["success"])


def yardsticks(config, env, tasks: list) -> dict:
  """Successes of the copying policies over `tasks` (see the module docstring)."""
  first = last = expected = 0.0
  for task in tasks:
    found = numbers(task.item["question"])
    if not found:
      continue
    wins = [scored(env, task, reply_with(config, n))[1] for n in found]
    first, last = first + wins[0], last + wins[-1]
    expected += sum(wins) / len(wins)
  return {"first_number": first, "last_number": last, "random_number": round(expected, 3)}


def replayed(config, env, tasks: list, rows: list[dict]) -> dict:
  """One evaluation step's rows (its `eval/step_N.jsonl`) replayed and counted."""
  successes = copies = first_copies = last_copies = 0
  for task, row in zip(tasks, rows, strict=True):
    reward, success = scored(env, task, row["completion"])
    if success != row["success"] or abs(reward - row["reward"]) > 1e-6:
      raise errors.DataError(
        f"item {row['item']}: the recorded reply {row['completion'][:80]!r} scores "
        f"{reward} here, the run recorded {row['reward']}: give the run's own workdir"
      )
    answer = reasoning_gym.answer_in(config, row["completion"])
    v = value(answer) if answer else None
    values = [value(n) for n in numbers(task.item["question"])]
    successes += success
    copies += v is not None and v in values
    first_copies += v is not None and bool(values) and v == values[0]
    last_copies += v is not None and bool(values) and v == values[-1]
  return {
    "items": len(rows),
    "successes": successes,
    "copies": copies,
    "first_number_copies": first_copies,
    "last_number_copies": last_copies,
  }


def report(workdir: str) -> dict:
  """The JSON report of a run's folder (see the module docstring)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise errors.FlagError(
      f"--workdir={workdir!r}: no config.json there (give one seed's run folder)"
    )
  with open(path, encoding="utf-8") as f:
    run = json.load(f)
  if run["env"].get("name") != "reasoning_gym":
    raise errors.FlagError(
      f"--workdir={workdir}: env.name={run['env'].get('name')!r}, not 'reasoning_gym'"
    )
  config = env_table.env_config(run["env"])
  info = protocol.RunInfo(
    eval_seed_offset=run["eval"]["seed_offset"], eval_tasks=run["eval"]["num_tasks"]
  )
  built = reasoning_gym.build(config, info)
  outcomes = item_outcomes.read(workdir)
  if not outcomes:
    raise errors.DataError(
      f"{workdir}: no eval/step_N.jsonl (a run with eval.every > 0 writes them)"
    )
  items = [r["item"] for r in next(iter(outcomes.values()))]
  tasks = built.eval_tasks(items)
  steps = {}
  for step, rows in outcomes.items():
    if [r["item"] for r in rows] != items:
      raise errors.DataError(f"{workdir}: step {step} holds other held-out items than the first")
    steps[str(step)] = replayed(config, built.env, tasks, rows)
  return {
    "task": config.task,
    "items": len(items),
    "yardsticks": yardsticks(config, built.env, tasks),
    "steps": steps,
  }


def main(argv):
  del argv
  print(json.dumps(report(flags.FLAGS.workdir)))


if __name__ == "__main__":  # flags defined here only: importing the functions defines none
  flags.DEFINE_string("workdir", None, "A reasoning-gym run's folder (one seed's).")
  flags.mark_flag_as_required("workdir")
  cli.run(main)
