"""The held-out evaluation set: items disjoint by content from everything a run can train on.

A seed names an episode, not its content: FrozenLake's seeds 7 and 1,000,003 can draw the
same map, and two GSM8K problems can ask the same question. `choose` walks the held-out
seeds `offset, offset + 1, ...` and keeps a seed only when its content key
(`protocol.EnvTasks.content_key`) differs from every training item's and from every seed
kept before it, until it has `n` seeds: `n` distinct items, none trained on.

This changes which items are evaluated: on 4x4 FrozenLake the most frequent maps (the
all-frozen one is 4% of draws) are those training saw, so the held-out maps are the rarer
ones, with more holes: 356 of them average 3.8 holes after a 480-episode budget, 4.5 after
3,200, against 2.6 for seeds 1,000,000 .. 1,000,355. Scores are comparable only between
runs of one episode budget (`train_seeds`). An environment without a content key keeps
seeds `offset .. offset + n - 1` and reports its overlap as unknown.
"""

import hashlib
from collections.abc import Hashable, Iterable
from typing import NamedTuple

from rlpost.envs import protocol

DRAW_CHUNK = 256  # held-out candidates whose tasks are made in one eval_tasks call
MIN_MAX_DRAWS = 100_000  # candidates examined before giving up (at least; 100 per item)


class HeldOut(NamedTuple):
  """The evaluation set of a run and how it was found.

  seeds: the held-out seeds evaluated, in order.
  keys: each seed's content key digest (`key_digest`), or None per seed without a key.
  overlap_before: of the first `n` candidate seeds (the set by seed alone), how many equal
    a training item; None: unknown (no content key).
  distinct_before: distinct items among those first `n` (None: unknown).
  overlap: evaluated items equal to a training item (0 with a key; None: unknown).
  distinct: distinct items evaluated (None: unknown).
  draws: candidate seeds examined.
  """

  seeds: tuple[int, ...]
  keys: tuple[str | None, ...]
  overlap_before: int | None
  distinct_before: int | None
  overlap: int | None
  distinct: int | None
  draws: int

  def metrics(self) -> dict:
    """The eval/* metrics (the unknown ones left out: `describe` says so)."""
    names = ("overlap_before", "distinct_before", "overlap", "distinct")
    out = {f"eval/{k}": getattr(self, k) for k in names if getattr(self, k) is not None}
    return {**out, "eval/draws": self.draws}

  def describe(self, env_name: str) -> str:
    """One line for the run's log."""
    if self.distinct is None:
      return (
        f"held-out evaluation of {env_name}: {len(self.seeds)} seeds from {self.seeds[0]}; "
        "overlap with training unknown (the environment names no content_key)"
      )
    return (
      f"held-out evaluation of {env_name}: {self.distinct} distinct items, none trained on "
      f"(eval/overlap=0), {self.draws} seeds examined; by seed alone the first "
      f"{len(self.seeds)} held-out seeds had {self.distinct_before} distinct items, "
      f"{self.overlap_before} of them trained on"
    )


def key_digest(key: Hashable) -> str:
  """A short stable digest of a content key (its repr's SHA-1, 16 hex digits): the same
  key gives the same digest in every process and run (unlike `hash`)."""
  return hashlib.sha1(repr(key).encode("utf-8")).hexdigest()[:16]


def train_seeds(tasks: protocol.EnvTasks, steps: int, per_step: int) -> range:
  """The training seeds a run's evaluation set excludes: a dataset's whole pool, else seeds
  0 .. steps * per_step - 1 (`EnvTasks.pool`). The recipe passes its episodes per step
  (tasks x episodes per task), a superset of the seeds it draws (tasks per step), so two
  runs with the same episode budget (PPO's 16 tasks x 1, GRPO's 2 x 8) evaluate the same
  items, and a paired comparison of them uses every item."""
  return range(tasks.pool) if tasks.pool is not None else range(steps * per_step)


def _keys(tasks: protocol.EnvTasks, make, seeds) -> list:
  seeds = list(seeds)
  return [tasks.content_key(t, s) for t, s in zip(make(seeds), seeds)]


def choose(
  tasks: protocol.EnvTasks, train: Iterable[int], offset: int, n: int, max_draws: int = 0
) -> HeldOut:
  """The `n` held-out seeds from `offset` on whose items are distinct and none a training
  item (`train`: the training seeds, `train_seeds`); module docstring.

  max_draws: candidates to examine before raising (0: max(MIN_MAX_DRAWS, 100 * n)).
  Raises ValueError naming eval.num_tasks when fewer than `n` such items turn up.
  """
  if tasks.content_key is None:
    seeds = tuple(range(offset, offset + n))
    return HeldOut(seeds, (None,) * n, None, None, None, None, 0)
  train_keys = set(_keys(tasks, tasks.train_tasks, train))
  limit = max_draws or max(MIN_MAX_DRAWS, 100 * n)
  chosen, keys, seen, first = [], [], set(), []
  draws = 0
  while len(chosen) < n and draws < limit:
    part = range(offset + draws, offset + min(draws + DRAW_CHUNK, limit))
    for seed, key in zip(part, _keys(tasks, tasks.eval_tasks, part)):
      if draws < n:
        first.append(key)
      draws += 1
      if key not in train_keys and key not in seen:
        chosen.append(seed)
        keys.append(key_digest(key))
      seen.add(key)
      if len(chosen) == n:  # the first n candidates are all read by now
        break
  if len(chosen) < n:
    raise ValueError(
      f"config.eval.num_tasks={n}: only {len(chosen)} held-out items differ from every "
      f"training item and from each other in {draws} seeds from {offset} (the run trains "
      f"on {len(train_keys)} distinct items); lower eval.num_tasks, or train on fewer "
      "items (train.steps x train.batch_tasks), or draw from a larger space (a bigger map)"
    )
  before = sum(k in train_keys for k in first)
  return HeldOut(tuple(chosen), tuple(keys), before, len(set(first)), 0, len(chosen), draws)
