"""Metrics on disk: JSONL (always), TensorBoard events (when tensorboardX is installed), PNG curves."""

import json
import logging
import os

import numpy as np


def to_python(metrics: dict) -> dict:
  """Arrays / numpy scalars -> plain floats and ints (JSON-ready).

  Non-finite floats stay floats: JSONL writes them as NaN / Infinity / -Infinity
  (which `json.loads` reads back), TensorBoard records them as such.
  """
  out = {}
  for name, value in metrics.items():
    value = np.asarray(value)
    out[name] = value.item() if value.ndim == 0 else value.tolist()
  return out


def append_jsonl(path: str, record: dict) -> None:
  """Appends one JSON line and flushes it to disk."""
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def read_jsonl(path: str) -> list[dict]:
  """The records of a JSONL file ([] when absent). A last line that is not JSON and has no
  newline is a write cut short (a kill, a full disk): it is dropped with a warning. Any
  other line that is not JSON raises ValueError naming the file and the line."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = f.read().split("\n")
  records = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except ValueError as e:
      if number == len(lines):  # no newline after it: the last write was cut short
        logging.warning("%s: dropped a torn last line (%s): %.80r", path, e, line)
        continue
      raise ValueError(
        f"{path}, line {number}: not a JSON record ({e}): {line[:80]!r}. Fix or delete that "
        "line (records after a resume point are dropped on resume; earlier ones are kept)."
      ) from None
  return records


def truncate_jsonl(path: str, max_step: int) -> None:
  """Drops records with step > max_step (after resuming from an older checkpoint)."""
  write_jsonl(path, [r for r in read_jsonl(path) if r.get("step", 0) <= max_step])


def write_jsonl(path: str, records: list[dict]) -> None:
  """Writes `records` as `path`, whole or not at all (a temporary file, synced, renamed
  over it)."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def tensorboard_writer(workdir: str):
  """A tensorboardX SummaryWriter on workdir/tb, or None when tensorboardX is absent."""
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return tensorboardX.SummaryWriter(os.path.join(workdir, "tb"))


def write_tensorboard(writer, step: int, record: dict) -> None:
  if writer is None:
    return
  for name, value in record.items():
    if isinstance(value, (int, float)) and name != "step":
      writer.add_scalar(name, value, step)
  writer.flush()


def plot_curves(jsonl_path: str, keys: list[str], png_path: str, title: str = "") -> str | None:
  """One panel per metric in `keys` (those present) against step; returns the PNG path."""
  records = read_jsonl(jsonl_path)
  keys = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in records)]
  if not records or not keys:
    return None
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
  for ax, key in zip(axes[0], keys):
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None)
    ax.set_xlabel("step")
    ax.set_title(key)
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  # Fixed margins: tight_layout's measuring pass took 0.13 of 0.35 s of CPU for 4 panels,
  # paid at the end of every run (hundreds in the test suite).
  fig.subplots_adjust(left=0.16 / len(keys), right=0.98, bottom=0.16, top=0.8, wspace=0.3)
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
  return png_path
