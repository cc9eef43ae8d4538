"""Orbax save/restore of the whole TrainState plus a JSON `meta` dict (data cursor, ...).

Checkpoints are written synchronously to a temporary directory and renamed
when complete, so a run killed mid-save leaves the previous checkpoint as the
newest readable one; `restore_latest` only ever sees finished checkpoints.
"""

import os

import jax
import orbax.checkpoint as ocp

from rlpost.train.step import TrainState


def manager(workdir: str, max_to_keep: int = 3) -> ocp.CheckpointManager:
  """CheckpointManager on `workdir/checkpoints`, keeping the newest `max_to_keep`."""
  options = ocp.CheckpointManagerOptions(
    max_to_keep=max_to_keep,
    create=True,
    enable_async_checkpointing=False,
    cleanup_tmp_directories=True,
  )
  return ocp.CheckpointManager(
    os.path.join(os.path.abspath(workdir), "checkpoints"),
    options=options,
    item_names=("state", "meta"),
  )


def _to_saveable(state: TrainState):
  return state._replace(key=jax.random.key_data(state.key))


def save(mngr: ocp.CheckpointManager, step: int, state: TrainState, meta: dict) -> None:
  """Saves `state` and the JSON-serialisable `meta` as checkpoint `step`; blocks until done."""
  if step in mngr.all_steps():
    return
  mngr.save(
    step,
    args=ocp.args.Composite(
      state=ocp.args.StandardSave(_to_saveable(state)), meta=ocp.args.JsonSave(meta)
    ),
  )
  mngr.wait_until_finished()


def restore_latest(mngr: ocp.CheckpointManager, like: TrainState):
  """(state, meta) of the newest finished checkpoint, or None when there is none.

  `like` is a TrainState of the right structure (e.g. freshly initialised);
  it gives shapes, dtypes and shardings.
  """
  step = mngr.latest_step()
  if step is None:
    return None
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _to_saveable(like))
  restored = mngr.restore(
    step,
    args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
  )
  state = restored["state"]
  impl = jax.random.key_impl(like.key)
  return state._replace(key=jax.random.wrap_key_data(state.key, impl=impl)), restored["meta"]
