"""The finished chunks of an evaluation in progress, kept so an interrupted one resumes.

A held-out evaluation with the real model is long (356 FrozenLake maps: about 20 minutes
on 2 cores) and plays its seeds in chunks of `eval.batch_tasks`. Each finished chunk's
episodes go to `<workdir>/eval/step_<N>.partial/<first seed's index>.pkl`, with the
chunk's seeds and a fingerprint of the policy's weights. An evaluation of the same step
that finds a chunk with the same seeds and the same fingerprint takes its episodes
instead of playing them again: a run killed during an evaluation and resumed replays
the step bitwise (its checkpoint is the step before), so it finds them. The folder goes
when the evaluation's outputs are written.

What can go wrong reads as "not kept": a file that does not unpickle, names other seeds
or another fingerprint is played again (and overwritten); episodes that do not pickle
(an environment's task object) are not kept (logged once). Only one process keeps them:
with several processes every process plays every chunk (their greedy episodes must be
the same on each).
"""

import hashlib
import os
import pickle
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rlpost.recipes import item_outcomes


def folder(workdir: str, step: int) -> str:
  """Where evaluation `step`'s finished chunks wait."""
  return os.path.join(workdir, item_outcomes.EVAL_DIR, f"step_{step}.partial")


def enabled(workdir: str) -> bool:
  """Chunks are kept for a run with a workdir on one process."""
  return bool(workdir) and jax.process_count() == 1


@jax.jit
def _leaf_sums(leaves):
  """[leaves, 2] float32: each leaf's sum and sum of squares (in float32)."""
  return jnp.stack([jnp.stack([x.sum(), (x * x).sum()]) for x in map(_as_f32, leaves)])


def _as_f32(x):
  return x.astype(jnp.float32)


def fingerprint(policy) -> str:
  """A digest of the policy's weights (the pytree's structure, each leaf's shape, sum and
  sum of squares): equal for the same weights, different after any update."""
  leaves, tree = jax.tree.flatten(policy)
  sums = np.asarray(jax.device_get(_leaf_sums(leaves)), np.float32)
  h = hashlib.sha256(str(tree).encode())
  h.update(str([x.shape for x in leaves]).encode())
  h.update(sums.tobytes())
  return h.hexdigest()[:32]


def load(workdir: str, step: int, first: int, seeds: list[int], digest: str):
  """The episodes of the chunk starting at index `first`, if kept with these `seeds` and
  this `digest`; else None."""
  path = os.path.join(folder(workdir, step), f"{first}.pkl")
  try:
    with open(path, "rb") as f:
      kept = pickle.load(f)
    if kept["seeds"] == list(seeds) and kept["fingerprint"] == digest:
      return list(kept["episodes"])
  except FileNotFoundError:
    return None
  except Exception as e:  # noqa: BLE001  (damaged or foreign: played again)
    logging.warning("evaluation chunk %s unreadable (%s): playing it again", path, e)
  return None


def save(workdir: str, step: int, first: int, seeds: list[int], digest: str, episodes) -> None:
  """Keeps a finished chunk (written to a temporary name, then renamed)."""
  target = os.path.join(folder(workdir, step), f"{first}.pkl")
  os.makedirs(os.path.dirname(target), exist_ok=True)
  record = {"seeds": list(seeds), "fingerprint": digest, "episodes": list(episodes)}
  tmp = f"{target}.tmp{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      pickle.dump(record, f)
    os.replace(tmp, target)
  except (pickle.PicklingError, TypeError, AttributeError) as e:
    logging.log_first_n(
      logging.WARNING, "evaluation chunks not kept (their episodes do not pickle: %s)", 1, e
    )
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def clear(workdir: str, step: int) -> None:
  """Removes evaluation `step`'s kept chunks (its outputs are written)."""
  shutil.rmtree(folder(workdir, step), ignore_errors=True)
