"""What an RL iteration reports about its rollouts: metrics over every process's rows and
episode transcripts (a helper module of the RL recipe, `rlpost.recipes.rl`).

Prompt datasets (one-turn episodes, `protocol.CompletionReport`) report the single-turn
names (reward per reward function, accuracies, completion lengths); other environments
report per-episode and per-turn rates (success, turns, tool use, invalid actions,
truncation).
"""

import gzip
import json
import os
import zlib

import jax
import numpy as np

from rlpost import errors
from rlpost.envs import multiturn
from rlpost.train import metrics as metrics_lib
from rlpost.train import shares

EPISODE_ACCURACY = ("answer_accuracy", "format_accuracy")  # last-turn info keys averaged
TRANSCRIPTS = "trajectories.jsonl"  # sampled training episodes
EVAL_TRANSCRIPTS = "eval_trajectories.jsonl"  # greedy held-out episodes
EVAL_OUTCOMES = "eval_outcomes.jsonl"  # every greedy held-out episode, in brief
REPLY_CHARS = 200  # an outcome record's replies are clipped to this many characters


def single_turn_metrics(out: multiturn.Rollout, reward_names, accuracy_names, extra) -> dict:
  """Reward mean/std (total and per reward function), accuracies and completion lengths
  of one-turn episodes, over every process's rows (`out`: this process's).

  reward_names: the reward functions, whose values each episode's info holds as
  `reward/<name>`; accuracy_names: the info's accuracy flags; extra: further per-row
  reward terms {name: [N] float32} (e.g. the overlong penalty), already in `out.rewards`.
  """
  infos = [e.infos[0] for e in out.episodes]
  per_row = {
    "reward": out.rewards,
    "length": out.batch.loss_mask.sum(1),
    **{
      f"reward/{name}": np.asarray([i[f"reward/{name}"] for i in infos], np.float32)
      for name in reward_names
    },
    **{f"reward/{name}": values for name, values in extra.items()},
    **{name: np.asarray([i[name] for i in infos], np.float64) for name in accuracy_names},
  }
  per_row = {k: shares.all_rows(v) for k, v in per_row.items()}
  rewards, lengths = per_row.pop("reward"), per_row.pop("length")
  metrics = {
    "reward/mean": rewards.mean(),
    "reward/std": rewards.std(),
    "completion_len/mean": lengths.mean(),
    "completion_len/max": lengths.max(),
  }
  metrics.update({k: v.mean() for k, v in per_row.items()})
  return metrics


def rollout_metrics(out: multiturn.Rollout, report, extra: dict) -> dict:
  """The metrics of `out` as its environment reports them (`protocol.EnvTasks.report`):
  a dataset's one-turn episodes per reward function (`single_turn_metrics`), else
  per-episode rates (`episode_metrics`). extra: further per-row reward terms {name: [N]}
  (e.g. the overlong penalty), already in `out.rewards`, reported as reward/<name>."""
  if report is not None:
    return single_turn_metrics(out, report.reward_names, report.accuracy_names, extra)
  metrics = episode_metrics(out.episodes)
  for name, values in extra.items():
    metrics[f"reward/{name}"] = float(shares.all_rows(np.asarray(values, np.float64)).mean())
  return metrics


def reward_errors(out: multiturn.Rollout, reward_names) -> dict:
  """{reward/<name>/errors: failed examples of that reward function} summed over every
  process's one-turn episodes."""
  infos = [e.infos[0] for e in out.episodes]
  return {
    f"reward/{name}/errors": sum(int(i[f"reward/{name}/errors"]) for i in infos)
    for name in reward_names
  }


def episode_metrics(episodes: list[multiturn.Episode]) -> dict:
  """Reward, success, turns, tool use, invalid actions and truncation over every
  process's episodes (`episodes`: this process's).

  Rates per turn: tool_call_rate, tool_error_rate, invalid_action_rate; per
  episode: success and EPISODE_ACCURACY keys (the last turn's info, when the
  environment reports them), tool_episode_rate (episodes with a tool call),
  truncation_rate, failure_rate (ended by the environment without success: FrozenLake's
  holes); with the template scaffold, template/prefix_mismatch: the turns whose
  re-rendered conversation does not extend the tokens sampled; against a user's textarena
  opponent, opponent/fallback_rate: its refused replies (replaced by a random legal
  move) per turn of ours.
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
    "prefix_mismatch": count("prefix_mismatch"),
    "opponent_fallbacks": [
      sum(int(i.get("opponent_fallbacks", 0)) for i in e.infos) for e in episodes
    ],
    "tool_episode": [any(i.get("tool_call") for i in e.infos) for e in episodes],
    "truncated": [e.truncated for e in episodes],
    "failed": [e.done and not bool(i.get("success")) for e, i in zip(episodes, last)],
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
    "failure_rate": float(v["failed"].mean()),
  }
  if any("prefix_mismatch" in i for e in episodes for i in e.infos):  # the template scaffold
    out["template/prefix_mismatch"] = float(v["prefix_mismatch"].sum())
  if any("opponent_fallbacks" in i for e in episodes for i in e.infos):  # a user's opponent
    out["opponent/fallback_rate"] = float(v["opponent_fallbacks"].sum() / turns)
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


def write_outcomes(workdir: str, step: int, episodes) -> None:
  """Appends one record to workdir/EVAL_OUTCOMES for `episodes` (every held-out episode of
  one evaluation): {"step", "episodes": [{"seed", "reward", "success", "done",
  "truncated", "replies"}]}, each reply its first REPLY_CHARS characters (records after
  a resume point dropped); process 0 writes, the others do nothing."""
  if jax.process_index():
    return
  path = os.path.join(workdir, EVAL_OUTCOMES)
  metrics_lib.truncate_jsonl(path, step - 1)
  brief = [
    {
      "seed": e.seed,
      "reward": float(e.reward),
      "success": bool(e.infos and e.infos[-1].get("success")),
      "done": bool(e.done),
      "truncated": bool(e.truncated),
      "replies": [t[:REPLY_CHARS] for t in e.texts],
    }
    for e in episodes
  ]
  metrics_lib.append_jsonl(path, {"step": step, "episodes": brief})


def read_outcomes(path: str) -> list[dict]:
  """The records of an EVAL_OUTCOMES file (`write_outcomes`), plain or gzipped (`.gz`: the
  copy `experiments.seeds keep` puts in the tree), in file order. A line that is not such
  a record (not JSON, no "step" or "episodes" list) is a DataError naming path:line."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      lines = f.readlines()
  except (gzip.BadGzipFile, EOFError, zlib.error, UnicodeDecodeError) as e:
    raise errors.DataError(f"{path}: unreadable ({e}): give a run's {EVAL_OUTCOMES}[.gz]")
  except OSError as e:  # absent, a directory, no permission
    raise errors.DataError(f"{path}: {e.strerror}: give a run's WORKDIR/{EVAL_OUTCOMES}[.gz]")
  records = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise errors.DataError(f"{path}:{number}: not JSON ({e.msg}): give a run's {EVAL_OUTCOMES}")
    if (
      not isinstance(record, dict)
      or not isinstance(record.get("episodes"), list)
      or "step" not in record
    ):
      raise errors.DataError(
        f'{path}:{number}: not an evaluation record ({{"step", "episodes": [...]}}, '
        f"what `write_outcomes` writes): give a run's {EVAL_OUTCOMES}"
      )
    records.append(record)
  return records
