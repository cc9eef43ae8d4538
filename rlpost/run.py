"""The files of one experiment run in `--workdir`, shared by every experiment script.

  workdir/config.json     the resolved ConfigDict
  workdir/metrics.jsonl   one record per step ({"step": ..., metric: value, ...})
  workdir/tb/             TensorBoard events (when tensorboardX is installed)
  workdir/checkpoints/    orbax checkpoints (TrainState + JSON meta)
  workdir/curves.png      the main curves, written at the end

Resuming is automatic: `start` restores the newest finished checkpoint and drops
metric records written after it, so a killed run continues exactly where its
last checkpoint left it.
"""
import json
import os
from typing import Any, NamedTuple

import tqdm

from rlpost import checkpoint
from rlpost import metrics as metrics_lib
from rlpost.train import TrainState


class Run(NamedTuple):
  workdir: str
  metrics_path: str
  checkpoints: Any          # orbax CheckpointManager
  tensorboard: Any          # tensorboardX SummaryWriter or None


def start(workdir: str, config, fresh_state: TrainState, fresh_meta: dict, keep: int = 3):
  """Opens the run and resumes it. Returns (Run, state, meta, resumed: bool)."""
  if not workdir:
    raise ValueError("--workdir is required (checkpoints and metrics are written there)")
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(config.to_json_best_effort(indent=2) if hasattr(config, "to_json_best_effort")
            else json.dumps(config, indent=2))
  run = Run(workdir, os.path.join(workdir, "metrics.jsonl"),
            checkpoint.manager(workdir, max_to_keep=keep),
            metrics_lib.tensorboard_writer(workdir))
  restored = checkpoint.restore_latest(run.checkpoints, fresh_state)
  if restored is None:
    metrics_lib.truncate_jsonl(run.metrics_path, -1)
    return run, fresh_state, fresh_meta, False
  state, meta = restored
  metrics_lib.truncate_jsonl(run.metrics_path, int(meta["iteration"]))
  return run, state, meta, True


def log(run: Run, iteration: int, record: dict) -> dict:
  """Writes one step's metrics (arrays become floats) to JSONL and TensorBoard."""
  record = {"step": iteration, **metrics_lib.to_python(record)}
  metrics_lib.append_jsonl(run.metrics_path, record)
  metrics_lib.write_tensorboard(run.tensorboard, iteration, record)
  return record


def save(run: Run, state: TrainState, meta: dict) -> None:
  """Checkpoints state + meta (meta["iteration"] = completed iterations)."""
  checkpoint.save(run.checkpoints, int(meta["iteration"]), state, meta)


def progress(start_iteration: int, total: int, desc: str):
  """A tqdm bar that continues from `start_iteration` after a resume."""
  return tqdm.tqdm(total=total, initial=start_iteration, desc=desc, dynamic_ncols=True)


def finish(run: Run, keys: list[str], title: str) -> str | None:
  """Writes workdir/curves.png with one panel per metric in `keys`; closes writers."""
  if run.tensorboard is not None:
    run.tensorboard.close()
  run.checkpoints.close()
  return metrics_lib.plot_curves(run.metrics_path, keys, os.path.join(run.workdir, "curves.png"),
                                 title)
