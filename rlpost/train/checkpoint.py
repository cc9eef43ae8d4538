"""Orbax save/restore of the whole TrainState plus a JSON `meta` dict, verified and fail-soft.

A checkpoint may hold a third item, `carry`: arrays a step function keeps between steps
(`rlpost.train.loop.Carry`), with their own JSON meta in meta["carry"]. Checkpoints
without one (synchronous runs, older versions) restore as before.

Checkpoints are written synchronously to a temporary directory and renamed
when complete, so a run killed mid-save leaves the previous checkpoint as the
newest readable one.

Integrity: `save` records in `meta["digests"]` a CRC-32 of every array's bytes
(with its dtype and shape), keyed by the array's path in the state (the carry's in
meta["carry_digests"]); `restore` recomputes them before the state is used. The digest
is of the logical (gathered) array, so it survives restoring onto another mesh. Orbax
checksums only its index structures; the digests cover the array data.

Layout: a checkpoint written before the one trainable layout (`{"policy": ...}`, PPO's
with `"critic"`; `LEGACY_POLICY_KEYS`) restores into today's: `restore` reads it in the
layout it was saved in, verifies it there, then moves each array to its place today.

Fallback: `restore_latest` tries the newest checkpoint first. One that fails to
restore or to verify (digest mismatch, checksum error, missing file, unreadable
metadata, missing commit marker) is reported (step, file, why) and moved to
`workdir/quarantine/` (never deleted), and the next newest is tried. If
checkpoints existed but none is intact, it raises `NoIntactCheckpointError`
naming the directory and the choices, and so does every later start on that
directory (a marker file; a rerun never silently starts over from step 0).
"""

import json
import os
import re
import shutil
import time
import zlib
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from rlpost import errors
from rlpost.train import settled_loops
from rlpost.train.step import TrainState

_COMMIT_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")
# Left in the checkpoint directory when no checkpoint was intact: later starts stop too.
NO_INTACT_MARKER = "NO_INTACT_CHECKPOINT.txt"


class CheckpointWriteError(RuntimeError):
  """A checkpoint could not be written; the previous one is intact."""


class NoIntactCheckpointError(errors.UsageError, RuntimeError):
  """Every checkpoint of a run failed to restore or verify."""


class CorruptCheckpointError(RuntimeError):
  """A checkpoint's files or array bytes do not match what was saved."""


class StateMismatchError(errors.UsageError, ValueError):
  """A checkpoint holds a state of another structure than this run's (a changed config)."""


class Carried(NamedTuple):
  """A checkpoint's carry: its JSON `meta` and its `arrays` (None when not restored)."""

  meta: dict
  arrays: Any


def manager(workdir: str, max_to_keep: int = 3, read_only: bool = False) -> ocp.CheckpointManager:
  """CheckpointManager on `workdir/checkpoints`, keeping the newest `max_to_keep`.

  The run's own manager removes the temporary directories of saves that never finished.
  `read_only` (another run's weights, an evaluation) neither saves, deletes nor cleans
  up: the run in `workdir` may be writing a checkpoint at that moment.
  """
  options = ocp.CheckpointManagerOptions(
    max_to_keep=None if read_only else max_to_keep,
    save_interval_steps=0 if read_only else 1,  # orbax warns when it has to set these
    create=not read_only,
    enable_async_checkpointing=False,
    cleanup_tmp_directories=not read_only,
    read_only=read_only,
  )
  return ocp.CheckpointManager(
    os.path.join(os.path.abspath(workdir), "checkpoints"),
    options=options,
    item_names=("state", "meta", "carry"),
  )


# Where the policy's weights sat before the one trainable layout, by the size of the dict
# that holds them under "policy" today: alone (GRPO: the trainable was the policy's tree
# itself) or beside other keys (PPO's "critic", multi_transform's labels: "actor").
LEGACY_POLICY_KEYS = {"alone": None, "beside others": "actor"}


def _legacy(tree):
  """`tree` (a TrainState, or any pytree) in the layout of checkpoints written before
  `{"policy": ...}`: each dict with a "policy" key, in the trainable and in the optimizer
  state's mirrors and labels of it, as `LEGACY_POLICY_KEYS` says it was."""
  held = lambda node: isinstance(node, dict) and "policy" in node

  def old(node):
    if not held(node):
      return node
    key = LEGACY_POLICY_KEYS["alone" if len(node) == 1 else "beside others"]
    if key is None:
      return _legacy(node["policy"])
    return {(key if k == "policy" else k): _legacy(v) for k, v in node.items()}

  return jax.tree.map(old, tree, is_leaf=held)


def _from_legacy(like, restored):
  """`restored` (in `_legacy(like)`'s structure) with each array moved to its place in
  `like`'s."""
  leaves, treedef = jax.tree.flatten(like)
  places = jax.tree.leaves(_legacy(jax.tree.unflatten(treedef, range(len(leaves)))))
  moved = [None] * len(leaves)
  for place, leaf in zip(places, jax.tree.leaves(restored), strict=True):
    moved[place] = leaf
  return jax.tree.unflatten(treedef, moved)


def _to_saveable(state: TrainState):
  return state._replace(key=jax.random.key_data(state.key))


def _layout(state: TrainState) -> dict[str, str]:
  """{array path: "dtype[shape]"}, the first part of each digest."""
  return {
    jax.tree_util.keystr(path): f"{np.dtype(leaf.dtype)}{list(leaf.shape)}"
    for path, leaf in jax.tree_util.tree_flatten_with_path(_to_saveable(state))[0]
  }


def digests(tree) -> dict[str, str]:
  """{array path: "dtype[shape]:crc32"} of every array of a TrainState (or any pytree of
  arrays), gathered to host."""
  if isinstance(tree, TrainState):
    tree = _to_saveable(tree)
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if getattr(leaf, "is_fully_addressable", True):
      array = np.asarray(jax.device_get(leaf))
    else:  # split across processes: every process gathers the whole array
      array = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    crc = zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    out[jax.tree_util.keystr(path)] = f"{array.dtype}{list(array.shape)}:{crc:08x}"
  return out


def save(mngr: ocp.CheckpointManager, step: int, state: TrainState, meta: dict, carried=None):
  """Saves `state` and `meta` (+ the state's digests) as checkpoint `step`; blocks until done.

  carried: None, or (carry meta, carry arrays) (`Carried`), kept as meta["carry"] and
  the `carry` item (their digests in meta["carry_digests"]).

  A failed write (disk full, permission, ...) raises CheckpointWriteError; the
  half-written temporary directory is never taken for a checkpoint and is
  removed when the run is next opened.
  """
  if step in mngr.all_steps():
    return
  meta = {**meta, "digests": digests(state)}
  items = {"state": ocp.args.StandardSave(_to_saveable(state))}
  if carried is not None:
    carry_meta, arrays = carried
    meta.update(carry=carry_meta, carry_digests=digests(arrays))
    items["carry"] = ocp.args.StandardSave(arrays)
  try:
    mngr.save(step, args=ocp.args.Composite(meta=ocp.args.JsonSave(meta), **items))
    mngr.wait_until_finished()
  except Exception as e:  # orbax wraps OS errors in several exception types
    if _interrupted(e):  # Ctrl-C in the middle of orbax's work, e.g. deleting an old step
      raise KeyboardInterrupt(f"checkpoint {step} interrupted") from e
    previous = [s for s in mngr.all_steps() if s != step]
    kept = f"checkpoint {max(previous)} is intact" if previous else "no earlier checkpoint exists"
    raise CheckpointWriteError(
      f"writing checkpoint {step} in {mngr.directory} failed ({type(e).__name__}: {e}); "
      f"{kept}. Free disk space or fix permissions, then rerun the same command to resume."
    ) from e


def _interrupted(error: BaseException) -> bool:
  """Whether a KeyboardInterrupt is in the chain of `error`: Ctrl-C inside a save (an
  rmtree of an old checkpoint, a file close) can surface as another error raised while
  handling it (OSError: Bad file descriptor), which is no failed write."""
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, KeyboardInterrupt):
      return True
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return False


def _check_commit_markers(step_dir: str) -> None:
  for name in _COMMIT_MARKERS:
    path = os.path.join(step_dir, name)
    if not os.path.isfile(path):
      raise CorruptCheckpointError(f"{path} is missing (the checkpoint was never committed)")
  path = os.path.join(step_dir, "_CHECKPOINT_METADATA")
  try:
    with open(path, encoding="utf-8") as f:
      json.load(f)
  except (OSError, ValueError) as e:
    raise CorruptCheckpointError(f"{path} is unreadable: {_reason(e)}") from e


def _saved_layout(meta: dict, mngr: ocp.CheckpointManager, step: int, like: TrainState):
  """The template checkpoint `step` restores into: `like`, or `_legacy(like)` when the
  saved arrays (their paths, dtypes and shapes in `meta`'s digests) are in the layout
  before `{"policy": ...}`. Raises StateMismatchError when they are neither."""
  saved = {k: v.rsplit(":", 1)[0] for k, v in (meta.get("digests") or {}).items()}
  wanted = _layout(like)
  if not saved or saved == wanted:
    return like
  legacy = _legacy(like)
  if saved == _layout(legacy):  # written before {"policy": ...}
    return legacy
  diff = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
  first = diff[0]
  raise StateMismatchError(
    f"checkpoint {step} in {mngr.directory} holds a train state of another structure: "
    f"{first} is {saved.get(first, 'absent')} there and {wanted.get(first, 'absent')} in "
    f"this run ({len(diff)} array(s) differ). The config changed since the run started "
    "(e.g. LoRA on/off, model, dtype): resume with the run's own config.json, or use a new "
    "--workdir."
  )


def restore(mngr: ocp.CheckpointManager, step: int, like: TrainState, carry_like=None):
  """(state, meta) of checkpoint `step`, verified against its digests.

  A checkpoint with a carry gives meta["carry"] = Carried(its meta, its arrays), the
  arrays restored (and verified) only with `carry_like(like, carry meta)`, their template.
  A checkpoint in the layout before `{"policy": ...}` is read and verified in that
  layout, then comes back in `like`'s. Raises CorruptCheckpointError (or orbax's error)
  when it cannot be read or verified, StateMismatchError when it holds another structure
  than `like`.
  """
  step_dir = os.path.join(str(mngr.directory), str(step))
  _check_commit_markers(step_dir)
  meta = dict(_item(mngr, step, "meta", ocp.args.JsonRestore()))
  template = _saved_layout(meta, mngr, step, like)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _to_saveable(template))
  state = _item(mngr, step, "state", ocp.args.StandardRestore(abstract))
  impl = jax.random.key_impl(like.key)
  state = state._replace(key=jax.random.wrap_key_data(state.key, impl=impl))
  saved = meta.pop("digests", None)
  if saved is None:
    raise CorruptCheckpointError(f"{step_dir}/meta: holds no array digests")
  _verify(saved, digests(state), step_dir, "state")
  if template is not like:
    state = _from_legacy(like, state)
  carry_meta, carry_digests = meta.pop("carry", None), meta.pop("carry_digests", None)
  if carry_meta is not None:
    arrays = None
    if carry_like is not None:
      if carry_digests is None:
        raise CorruptCheckpointError(f"{step_dir}/meta: holds no carry digests")
      abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, carry_like(like, carry_meta))
      arrays = _item(mngr, step, "carry", ocp.args.StandardRestore(abstract))
      _verify(carry_digests, digests(arrays), step_dir, "carry")
    meta["carry"] = Carried(carry_meta, arrays)
  return state, meta


def _item(mngr: ocp.CheckpointManager, step: int, name: str, args):
  """Item `name` of checkpoint `step`; any failure is a CorruptCheckpointError naming the
  file it came from (`_corrupt`)."""
  try:
    with settled_loops.settled_loops():  # a failed read's siblings end before the fallback
      return mngr.restore(step, args=ocp.args.Composite(**{name: args}))[name]
  except Exception as e:  # orbax, TensorStore and JSON errors alike
    raise _corrupt(os.path.join(str(mngr.directory), str(step)), name, e) from e


def _corrupt(step_dir: str, item: str, error: BaseException) -> CorruptCheckpointError:
  """The error of a checkpoint item that failed to read: the file named in `error`'s
  chain when one under `step_dir` is, else the item's JSON file for a decoding error or
  a missing entry (meta/metadata, state/_METADATA), else the item's directory; and why
  in words."""
  pattern = re.compile(re.escape(step_dir) + r"""[^\s'",)\]]*""")
  files = []
  chain = error
  while chain is not None and len(files) < 50:
    texts = [str(chain), str(getattr(chain, "filename", "") or "")]
    files += [m.group(0).rstrip(".:") for t in texts for m in pattern.finditer(t)]
    chain = chain.__cause__ or chain.__context__
  if files:
    named = max(files, key=len)
  elif isinstance(error, (UnicodeDecodeError, json.JSONDecodeError, KeyError)):
    named = os.path.join(step_dir, item, "metadata" if item == "meta" else "_METADATA")
  else:
    named = os.path.join(step_dir, item)
  return CorruptCheckpointError(f"{named}: {_reason(error).replace(step_dir + os.sep, '')}")


def _root_cause(error: BaseException) -> BaseException:
  """The innermost error an orbax read error was raised from: TensorStore's own, which names
  the array and the byte range (orbax's wrapper names only an index and an object repr)."""
  seen = {id(error)}
  while error.__cause__ is not None and id(error.__cause__) not in seen:
    error = error.__cause__
    seen.add(id(error))
  return error


def _reason(error: BaseException) -> str:
  """Why an item failed to read, in words (no object reprs)."""
  if type(error) is Exception and error.__cause__ is not None:  # orbax's wrapper of a read
    error = _root_cause(error)
  if isinstance(error, UnicodeDecodeError):
    byte = error.object[error.start : error.start + 1]
    return f"not UTF-8 text (byte {byte!r} at offset {error.start})"
  if isinstance(error, json.JSONDecodeError):
    return f"not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
  if isinstance(error, FileNotFoundError):
    return f"a file is missing ({error.filename or error})"
  if isinstance(error, KeyError):
    return f"the entry {error.args[0]!r} is missing"
  text = " ".join(re.sub(r"<bound method [^>]*>", "", str(error)).split())
  if "structure" in text.lower():
    return f"its recorded tree structure does not match the arrays saved ({text[:200]})"
  return f"unreadable ({type(error).__name__}: {text[:300]})"


def _verify(saved: dict, found: dict, step_dir: str, item: str) -> None:
  bad = sorted(k for k in set(saved) | set(found) if saved.get(k) != found.get(k))
  if bad:
    raise CorruptCheckpointError(
      f"{step_dir}/{item}: array bytes differ from those saved (the digests in meta) for "
      f"{len(bad)} array(s): {', '.join(bad[:4])}"
    )


def quarantine(mngr: ocp.CheckpointManager, step: int) -> str:
  """Moves checkpoint `step` to `workdir/quarantine/` (never deletes it); returns the new path."""
  source = os.path.join(str(mngr.directory), str(step))
  target_dir = os.path.join(os.path.dirname(str(mngr.directory)), "quarantine")
  os.makedirs(target_dir, exist_ok=True)
  target = os.path.join(target_dir, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
  while os.path.exists(target):
    target += "+"
  shutil.move(source, target)
  mngr.reload()
  return target


def restore_latest(
  mngr: ocp.CheckpointManager, like: TrainState, carry_like=None, read_only: bool = False
):
  """(state, meta) of the newest intact checkpoint, or None when there is none at all.

  `like` is a TrainState of the right structure (e.g. freshly initialised);
  it gives shapes, dtypes and shardings; `carry_like` the carry's (`restore`). Corrupt
  checkpoints (the carry included) are reported and quarantined (module docstring).
  `read_only` (another run's checkpoints: an `init_from` source, an evaluation): a
  corrupt one is reported and skipped, nothing in that run's directory is moved or
  written, and none intact is a NoIntactCheckpointError naming the directory.
  """
  marker = os.path.join(str(mngr.directory), NO_INTACT_MARKER)
  if os.path.isfile(marker):  # an earlier start found none intact: never start over silently
    with open(marker, encoding="utf-8") as f:
      raise NoIntactCheckpointError(f.read())
  quarantined = []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      return restore(mngr, step, like, carry_like)
    except StateMismatchError:
      raise  # a changed config, not a corrupt file: leave the checkpoints where they are
    except Exception as e:  # any failure to read or verify: fall back to an older one
      where = os.path.join(str(mngr.directory), str(step)) if read_only else quarantine(mngr, step)
      quarantined.append(where)
      fate = "was left where it is (another run's)" if read_only else f"was moved to {where}"
      why = str(e) if isinstance(e, CorruptCheckpointError) else f"{type(e).__name__}: {e}"
      message = f"CHECKPOINT {step} IS CORRUPT: {why}. It {fate}; trying the previous checkpoint."
      print(message, flush=True)
  if quarantined and read_only:
    raise NoIntactCheckpointError(
      f"no intact checkpoint in {mngr.directory} (another run's, read only: nothing there "
      f"was changed): steps {[os.path.basename(q) for q in quarantined]} failed to restore "
      "or verify. Point at a run with an intact checkpoint."
    )
  if quarantined:
    message = (
      f"no intact checkpoint in {mngr.directory}: every one failed to restore or verify and "
      f"was moved to {os.path.dirname(quarantined[0])}. Either start fresh in a new --workdir, "
      f"or remove {mngr.directory} (and metrics.jsonl) to restart this run from step 0."
    )
    with open(marker, "w", encoding="utf-8") as f:  # a rerun stops too, until a choice is made
      f.write(message)
    raise NoIntactCheckpointError(message)
  return None
