"""The one run loop every experiment uses, and the files of a run in `--workdir`.

  start -> resume -> for step: step_fn -> log -> checkpoint -> progress -> finish/curves

A step function has one contract:

  step_fn(state: TrainState, cursor: Cursor, index: int) -> (state, cursor, metrics)

`index` counts steps from 0 across resumes; `cursor` is the data position
(checkpointed with the state, so a resumed run reads the same data next). A step
function that keeps arrays between steps which the next steps depend on (the off-policy
pipeline's older policies) comes with a `Carry`: each checkpoint holds them too, and a
resumed run gets them back before its first step.

  workdir/config.json     the resolved ConfigDict
  workdir/metrics.jsonl   one record per step ({"step": ..., metric: value, ...})
  workdir/tb/             TensorBoard events (when tensorboardX is installed)
  workdir/checkpoints/    orbax checkpoints (TrainState + JSON meta: step, cursor; the
                          step function's Carry when it has one)
  workdir/curves.png      the main curves, written at the end
  workdir/provenance.jsonl  one line per start or resume: the step, commit, CPU, load
                          (`rlpost.train.provenance`)
  workdir/run.lock        held (flock) by the live run: a second run on the same
                          workdir stops with WorkdirInUseError; freed when the
                          process ends, even by kill -9

Resuming is automatic: the newest finished checkpoint is restored and metric
records written after it are dropped, so a killed run continues exactly where
its last checkpoint left it.
"""

import dataclasses
import errno
import fcntl
import json
import logging
import math
import numbers
import os
import socket
from typing import Any, Callable, NamedTuple

import jax
import tqdm

from rlpost import config_moves
from rlpost import errors
from rlpost.data.cursor import Cursor
from rlpost.models import families
from rlpost.train import checkpoint
from rlpost.train import metrics as metrics_lib
from rlpost.train import provenance
from rlpost.train.step import TrainState

StepFn = Callable[[TrainState, Cursor, int], tuple[TrainState, Cursor, dict]]


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """What the loop needs besides the step function.

  steps: total steps of the run (resumes continue towards it).
  checkpoint_every: save every this many steps (and after the last one of a call).
  keep: newest checkpoints kept.
  title: progress-bar and curves title.
  curves: metric names plotted in curves.png.
  postfix: metric names shown on the progress bar.
  seed: seeds the fresh data cursor.
  max_bad_steps: stop (NonFiniteTrainingError) after this many consecutive train
    steps with a non-finite loss or gradient norm (each left the weights unchanged).
  """

  steps: int
  checkpoint_every: int
  keep: int = 3
  title: str = "train"
  curves: tuple[str, ...] = ("loss",)
  postfix: tuple[str, ...] = ("loss",)
  seed: int = 0
  max_bad_steps: int = 3

  def __post_init__(self):
    for name, least in (("steps", 0), ("checkpoint_every", 1), ("keep", 1), ("max_bad_steps", 1)):
      value = getattr(self, name)
      if not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"LoopConfig.{name}={value!r}: use an integer >= {least}")


def loop_config(cfg, title: str, curves, postfix=("loss",)) -> LoopConfig:
  """The LoopConfig of a recipe ConfigDict (its `train`, `checkpoint` and `seed` fields)."""
  return LoopConfig(
    steps=cfg.train.steps,
    checkpoint_every=cfg.checkpoint.every,
    keep=cfg.checkpoint.keep,
    title=title,
    curves=tuple(curves),
    postfix=tuple(postfix),
    seed=cfg.seed,
    max_bad_steps=cfg.train.max_bad_steps,
  )


class Carry(NamedTuple):
  """What a step function keeps between steps, beside the state and the cursor, that an
  exact resume needs (`rlpost.recipes.rollout.loop_step`: the trainable weights of the
  older policies the next batches are sampled by).

  save() -> (meta, arrays) or None: after a step, what the checkpoint then written
    holds of it (meta: JSON; arrays: a pytree of global arrays, as the state's)
  like(state, meta) -> the arrays' template (structure, dtypes, shapes, shardings) for
    that meta, `state` a TrainState of the run's structure and shardings
  resume(state, index, meta, arrays): before the first step of a run resumed at `index`
    from `state`, what its checkpoint held; meta and arrays None when it held none
  """

  save: Callable[[], tuple[dict, Any] | None]
  like: Callable[[TrainState, dict], Any]
  resume: Callable[[TrainState, int, dict | None, Any], None]


class NonFiniteTrainingError(RuntimeError):
  """Too many consecutive train steps had a non-finite loss or gradient norm."""


class WorkdirError(errors.UsageError, ValueError):
  """--workdir cannot hold a run (missing, a file, not writable)."""


class WorkdirInUseError(errors.UsageError, RuntimeError):
  """Another live run holds the --workdir (its run.lock)."""


class Run(NamedTuple):
  workdir: str
  metrics_path: str
  checkpoints: Any  # orbax CheckpointManager
  tensorboard: Any  # tensorboardX SummaryWriter or None
  lock: int | None = None  # file descriptor holding workdir/run.lock


def _lock_workdir(workdir: str) -> int | None:
  """Takes workdir/run.lock (flock, not blocking) on the lead process; returns its fd.

  A second run on the same workdir would interleave its metrics.jsonl records with the
  first's, truncate them on its start and remove the first's checkpoint being written as
  a "half-written temporary directory". The kernel frees the lock when the holder exits,
  however it exits, so a killed run never leaves a stale lock. A file system without
  flock support is warned about and the run goes on unguarded."""
  if not _lead():
    return None
  path = os.path.join(workdir, "run.lock")
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
      logging.warning("%s: cannot lock (%s); runs on this workdir are not guarded", path, e)
      return fd
    holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "another process"
    os.close(fd)
    raise WorkdirInUseError(
      f"--workdir={workdir} is in use by another run ({holder}; lock {path}): two runs on "
      "one workdir would interleave their metrics and checkpoints. Wait for that run to "
      "end (or stop it), or give this run another --workdir."
    ) from None
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
  return fd


def _unlock(fd: int | None) -> None:
  if fd is not None:
    os.close(fd)  # releases the flock


def start(
  workdir: str, config, fresh_state: TrainState, fresh_meta: dict, keep: int = 3, carry_like=None
):
  """Opens the run (locking the workdir) and resumes it. Returns (Run, state, meta,
  resumed: bool); with `carry_like` (`Carry.like`) meta["carry"] is the checkpoint's
  `checkpoint.Carried` when it holds one."""
  _make_workdir(workdir)
  lock = _lock_workdir(workdir)  # before the manager, which cleans up temporary directories
  try:
    run = Run(
      workdir,
      os.path.join(workdir, "metrics.jsonl"),
      checkpoint.manager(workdir, max_to_keep=keep),
      metrics_lib.tensorboard_writer(workdir) if _lead() else None,
      lock,
    )
  except BaseException:
    _unlock(lock)
    raise
  try:
    if run.checkpoints.latest_step() is not None:
      _refuse_another_family(workdir, config)
      _refuse_fewer_steps(workdir, config, run.checkpoints.latest_step())
    restored = checkpoint.restore_latest(run.checkpoints, fresh_state, carry_like)
  except BaseException:
    _close(run)
    raise
  state, meta = restored or (fresh_state, fresh_meta)
  if _lead():  # only once resumed: a refused resume leaves the run's own config.json
    if restored:
      _report_changes(workdir, config, int(meta["iteration"]))
    _write_config(workdir, config)
    metrics_lib.truncate_jsonl(run.metrics_path, int(meta["iteration"]) if restored else -1)
    provenance.record(workdir, int(meta["iteration"]) if restored else 0)
  return run, state, meta, restored is not None


def _make_workdir(workdir: str) -> None:
  """Creates `workdir`; a path that cannot hold a run fails naming it, before anything is
  written (a file where `checkpoints/` goes would read as "no checkpoint": a fresh start
  that truncates the run's metrics)."""
  if not workdir:
    raise WorkdirError("--workdir is required (checkpoints and metrics are written there)")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"--workdir={workdir} is a file, not a directory: give a directory")
  checkpoints = os.path.join(workdir, "checkpoints")
  if os.path.exists(checkpoints) and not os.path.isdir(checkpoints):
    raise WorkdirError(
      f"{checkpoints} is a file, not a directory: the run keeps its checkpoints there; "
      "move or delete that file"
    )
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise WorkdirError(
      f"--workdir={workdir}: cannot create it ({e.strerror}); give a writable directory"
    ) from e
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise WorkdirError(f"--workdir={workdir} is not writable; give a writable directory")


def _config_text(config) -> str:
  if hasattr(config, "to_json_best_effort"):
    return config.to_json_best_effort(indent=2)
  return json.dumps(config, indent=2)


def _write_config(workdir: str, config) -> None:
  """Writes workdir/config.json whole or not at all (a temporary file renamed over it)."""
  path = os.path.join(workdir, "config.json")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(_config_text(config))
  os.replace(path + ".tmp", path)


def _family(preset) -> str | None:
  config = families.PRESETS.get(preset) if isinstance(preset, str) else None
  return config and config.family


def _refuse_another_family(workdir: str, config) -> None:
  """A run whose config.json names a model preset of another family than `config`'s is
  not resumed (its checkpoints hold another model's weights or adapters: LoRA adapters
  of two families can have the same shapes, which no shape check would catch)."""
  path = os.path.join(workdir, "config.json")
  try:
    with open(path, encoding="utf-8") as f:
      old = (json.load(f).get("model") or {}).get("preset")
  except (OSError, ValueError, AttributeError):
    return
  new = (config.get("model") or {}).get("preset") if hasattr(config, "get") else None
  if _family(old) and _family(new) and _family(old) != _family(new):
    raise errors.ConfigError(
      f"config.model.preset={new!r} is a {_family(new)} model, but the run in {workdir} "
      f"trains {old!r}, a {_family(old)} model: its checkpoints hold that model's weights. "
      f"Resume with --config.model.preset={old}, or use a new --workdir."
    )


def _refuse_fewer_steps(workdir: str, config, latest: int) -> None:
  """A ConfigError when `config.train.steps` is below the step of the run's newest
  checkpoint: nothing would train, and config.json would record fewer steps than the
  run's metrics and weights hold."""
  steps = (config.get("train") or {}).get("steps") if hasattr(config, "get") else None
  if isinstance(steps, int) and not isinstance(steps, bool) and steps < latest:
    raise errors.ConfigError(
      f"config.train.steps={steps}: the run in {workdir} has trained {latest} steps already "
      f"(its newest checkpoint); give train.steps >= {latest} to go on, or a new --workdir"
    )


def _report_changes(workdir: str, config, step: int) -> None:
  """Reports (stdout and the log) the fields of `config` that differ from the run's
  config.json when resuming: config.json is rewritten, so the log keeps the change."""
  path = os.path.join(workdir, "config.json")
  try:
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
  except (OSError, ValueError):  # absent or unreadable: nothing to compare with
    return
  changed = config_moves.differences(old, json.loads(_config_text(config)))
  if changed:
    message = (
      f"resuming from checkpoint {step} with a changed config ({path} rewritten): "
      f"{'; '.join(changed)}. The trained weights, optimizer state, PRNG key and data "
      "position continue from the checkpoint; what the changed fields build anew (a seed's "
      "synthetic data or random base weights, another model file) is used as changed. For a "
      "new run use a new --workdir."
    )
    logging.warning(message)
    print(message, flush=True)


def _lead() -> bool:
  """Process 0 writes the run's host files (config, metrics, curves); every process
  takes part in checkpoints."""
  return jax.process_index() == 0


def log(run: Run, iteration: int, record: dict) -> dict:
  """Writes one step's metrics (arrays become floats) to JSONL and TensorBoard."""
  record = {"step": iteration, **metrics_lib.to_python(record)}
  if _lead():
    metrics_lib.append_jsonl(run.metrics_path, record)
    metrics_lib.write_tensorboard(run.tensorboard, iteration, record)
  return record


def save(run: Run, state: TrainState, meta: dict, carried=None) -> None:
  """Checkpoints state + meta (meta["iteration"] = completed steps) + the step function's
  (meta, arrays) when it carries any (`Carry.save`)."""
  checkpoint.save(run.checkpoints, int(meta["iteration"]), state, meta, carried)


def _close(run: Run) -> None:
  """Closes the run's writers: TensorBoard and the checkpoint manager (left open by a run
  that stopped on an error, orbax's pending cleanup failed at exit: "Event loop is closed")."""
  try:
    if run.tensorboard is not None:
      run.tensorboard.close()
    run.checkpoints.close()
  finally:
    _unlock(run.lock)


def finish(run: Run, keys, title: str) -> str | None:
  """Writes workdir/curves.png with one panel per metric in `keys`; closes writers, then
  frees the workdir."""
  try:
    _close(run._replace(lock=None))
    if not _lead():
      return None
    return metrics_lib.plot_curves(
      run.metrics_path, list(keys), os.path.join(run.workdir, "curves.png"), title
    )
  finally:
    _unlock(run.lock)


def _postfix(record: dict, keys) -> dict[str, str]:
  """Progress-bar fields; a value that is not a finite number is shown as it is."""
  shown = {}
  for key in keys:
    value = record.get(key)
    if isinstance(value, (int, float)) and math.isfinite(value):
      shown[key] = f"{value:.4g}"
    elif value is not None:
      shown[key] = str(value)
  return shown


def run_loop(
  workdir: str,
  config,
  state: TrainState,
  step_fn: StepFn,
  loop: LoopConfig,
  *,
  initial_metrics: Callable[[TrainState], dict] | None = None,
  stop_after: int | None = None,
  carry: Carry | None = None,
) -> tuple[TrainState, dict]:
  """Runs (or resumes) the steps of one experiment; returns (final state, last record).

  Args:
    workdir: the run directory (module docstring).
    config: the experiment's ConfigDict (written to config.json).
    state: the fresh TrainState (restored over when a checkpoint exists).
    step_fn: the step contract in the module docstring.
    loop: steps, checkpointing, progress and curves settings.
    initial_metrics: metrics of the fresh state, logged as step 0 (e.g. a
      held-out evaluation before training); not called when resuming.
    stop_after: leave after this many steps of this call (tests of resumption).
    carry: what `step_fn` keeps between steps that each checkpoint holds too (`Carry`).
  """
  fresh_meta = {"iteration": 0, "cursor": Cursor(loop.seed)._asdict()}
  like = carry.like if carry else None
  run, state, meta, resumed = start(workdir, config, state, fresh_meta, loop.keep, like)
  try:
    first, cursor = int(meta["iteration"]), Cursor(**meta["cursor"])
    last = loop.steps if stop_after is None else min(loop.steps, first + stop_after)
    if resumed and carry and first < last:
      carry.resume(state, first, *(meta.get("carry") or (None, None)))
    if not resumed and initial_metrics is not None:
      first_record = initial_metrics(state)
      if first_record:  # e.g. no held-out evaluation configured: no empty step-0 record
        log(run, 0, first_record)
    record = {}
    progress = tqdm.tqdm(
      total=loop.steps, initial=first, desc=loop.title, dynamic_ncols=True, disable=not _lead()
    )
    with progress as bar:
      for index in range(first, last):
        state, cursor, metrics = step_fn(state, cursor, index)
        done = index + 1
        record = log(run, done, metrics)
        if done % loop.checkpoint_every == 0 or done == last:
          meta = {"iteration": done, "cursor": cursor._asdict()}
          save(run, state, meta, carry.save() if carry else None)
        bar.update(1)
        bar.set_postfix(_postfix(record, loop.postfix))
        bad = int(state.bad_steps)
        if bad >= loop.max_bad_steps:
          raise NonFiniteTrainingError(
            f"step {done}: {bad} consecutive train steps had a non-finite loss or gradient norm "
            f"(train.max_bad_steps={loop.max_bad_steps}); each left the weights and optimizer "
            f"state unchanged. The newest checkpoint is in {run.workdir}/checkpoints and the "
            f"metrics (NaN / Infinity included) in {run.metrics_path}. Lower train.learning_rate, "
            "check the rewards and data for NaN, or raise train.max_bad_steps."
          )
  except BaseException:
    _close(run)
    raise
  png = finish(run, loop.curves, loop.title)
  if _lead():
    print(f"metrics: {run.metrics_path}  curves: {png}")
  return state, record
