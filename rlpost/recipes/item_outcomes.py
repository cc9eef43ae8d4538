"""Per-item outcomes of every evaluation: `<workdir>/eval/step_<N>.jsonl`, one line per item.

A line is {"item": the held-out seed (a dataset: the problem's index in its split),
"key": the content key's digest (`held_out.key_digest`, null when the environment names
none), "reward", "success", "turns", "completion": the model's text, its first
COMPLETION_CHARS characters (turns joined by newlines), and "answer": the reference
answer, where the environment has one (its last step's info["answer"]: reasoning-gym,
GSM8K and the prompt datasets)}. What an interval, a paired comparison between runs and
the best constant answer's score are computed from (`experiments.seeds report`).

Each file is written whole to a temporary name and renamed over the old one: an
interruption never leaves half a file, and an evaluation played again after a resume
replaces its file instead of adding lines. `read` refuses (DataError naming file:line) a
line without these fields or with the wrong types, and an item listed twice, so a recount
never drops or doubles an item silently.
"""

import json
import os
import re

import jax

from rlpost import errors
from rlpost.data import jsonl

EVAL_DIR = "eval"
COMPLETION_CHARS = 300
_NAME = re.compile(r"step_(\d+)\.jsonl")
# the fields every line has, and the JSON types they hold ("key" may also be null)
_FIELDS = {"item": int, "key": str, "reward": (int, float), "success": bool, "turns": int}


def path(workdir: str, step: int) -> str:
  """Where evaluation `step`'s per-item outcomes go."""
  return os.path.join(workdir, EVAL_DIR, f"step_{step}.jsonl")


def item(
  item_id: int, key: str | None, reward, success, turns: int, completion: str, answer=None
) -> dict:
  """One line of an outcome file (module docstring); "answer" only when given."""
  line = {
    "item": int(item_id),
    "key": key,
    "reward": float(reward),
    "success": bool(success),
    "turns": int(turns),
    "completion": completion[:COMPLETION_CHARS],
  }
  return line if answer is None else {**line, "answer": str(answer)[:COMPLETION_CHARS]}


def episode_items(episodes, keys) -> list[dict]:
  """The lines of greedy held-out `episodes` (`multiturn.Episode`s, one per held-out
  seed), `keys` their content digests in the same order."""
  if len(keys) != len(episodes):
    raise ValueError(f"{len(episodes)} episodes need as many keys, got {len(keys)}")
  return [
    item(
      e.seed,
      key,
      e.reward,
      bool(e.infos and e.infos[-1].get("success")),
      len(e.infos),
      "\n".join(e.texts),
      e.infos[-1].get("answer") if e.infos else None,
    )
    for e, key in zip(episodes, keys)
  ]


def write(workdir: str, step: int, items: list[dict]) -> str | None:
  """Writes evaluation `step`'s lines atomically (temporary file, then rename); process 0
  writes, the others do nothing. Returns the path (None on other processes)."""
  if jax.process_index() or not workdir:
    return None
  target = path(workdir, step)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  tmp = f"{target}.tmp{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(line) + "\n" for line in items)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):  # the write failed: the old file (if any) stays as it was
      os.remove(tmp)
  return target


def read(workdir: str) -> dict[int, list[dict]]:
  """{step: its lines} of every outcome file in `workdir` (temporary files ignored), in
  step order; {} when there are none."""
  folder = os.path.join(workdir, EVAL_DIR)
  if not os.path.isdir(folder):
    return {}
  found = {}
  for name in os.listdir(folder):
    match = _NAME.fullmatch(name)
    if match:
      found[int(match.group(1))] = _lines(os.path.join(folder, name))
  return dict(sorted(found.items()))


def _lines(file: str) -> list[dict]:
  """The checked lines of one outcome file: DataError (file:line, what is wrong) for a
  line that is not a JSON object with the fields of `item`, or an item listed twice."""
  lines, seen = [], set()
  for where, line in jsonl.read_jsonl(file):
    _check_line(line, where)
    if (line["item"], line["key"]) in seen:
      raise errors.DataError(
        f"{where}: item {line['item']} (key {line['key']}) is listed twice; one line per "
        "evaluated item"
      )
    seen.add((line["item"], line["key"]))
    lines.append(line)
  return lines


def _check_line(line: dict, where: str) -> None:
  for field, kind in _FIELDS.items():
    value = line.get(field, KeyError)
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok and not (field == "key" and value is None):
      shown = "missing" if value is KeyError else repr(value)
      raise errors.DataError(
        f"{where}: field {field!r} is {shown}; every line has "
        f"{sorted(_FIELDS)} (rlpost.recipes.item_outcomes)"
      )
