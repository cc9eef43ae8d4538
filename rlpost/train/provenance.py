"""What code and machine each start of a run ran on: workdir/provenance.jsonl.

The lead process adds one record each time the loop opens a run (the first start and
every resume), so a number read from the run names the commits and CPUs behind it:

  {"step": 21,                 the iteration this start continued from (0: a fresh run)
   "time": "2026-12-07T15:24:29Z",
   "commit": "97a700a...",     HEAD of the git checkout rlpost is imported from (None
   "dirty": false,             outside one); dirty: tracked files differ from it
   "cpu": "AMD EPYC 7B13", "cpu_family": "25", "cpu_model": "1",   /proc/cpuinfo
   "cores": 1,                 the CPUs this process may run on (taskset / cgroup)
   "load": 2.1,                the 1-minute load average at the start
   "backend": "cpu", "devices": {"cpu": 1}, "jax": "0.7.2", "host": "..."}

`experiments.seeds keep` copies the file beside the outcomes and `report` lists each
seed's commits and CPUs.
"""

import datetime
import os
import socket
import subprocess

import jax

from rlpost.train import metrics as metrics_lib
from rlpost.train import runtime

FILE = "provenance.jsonl"
_CPUINFO_FIELDS = {"model name": "cpu", "cpu family": "cpu_family", "model": "cpu_model"}


def cpu_fields(cpuinfo: str | None = None) -> dict:
  """{"cpu", "cpu_family", "cpu_model"} of the first processor in /proc/cpuinfo (absent
  fields are None: another OS, an ARM core)."""
  out = dict.fromkeys(_CPUINFO_FIELDS.values())
  for line in (runtime.read_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
    name, _, value = line.partition(":")
    key = _CPUINFO_FIELDS.get(name.strip())
    if key and out[key] is None:
      out[key] = value.strip()
  return out


def cpu_name(fields: dict) -> str:
  """ "AMD EPYC 7B13 (family 25, model 1)" from `cpu_fields` (or a record holding them); a
  generic model name ("AMD EPYC" on some VMs) says little without the numbers."""
  name = fields.get("cpu") or "unknown CPU"
  if fields.get("cpu_family") is None:
    return name
  return f"{name} (family {fields['cpu_family']}, model {fields.get('cpu_model')})"


def checkout(package_dir: str | None = None) -> tuple[str | None, bool | None]:
  """(HEAD commit, tracked files changed) of the git checkout whose top folder holds
  `package_dir` (default: rlpost's own folder); (None, None) when rlpost is not imported
  from a checkout's top (an installed copy) or git is missing."""
  package_dir = package_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  parent = os.path.dirname(package_dir)

  def git(*args):
    done = subprocess.run(
      ["git", "-C", parent, *args], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.strip()

  try:
    if os.path.realpath(git("rev-parse", "--show-toplevel")) != os.path.realpath(parent):
      return None, None  # e.g. a site-packages copy inside some other checkout
    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return None, None
  return commit, bool(changed)


def describe(step: int) -> dict:
  """The record of a start that continues from iteration `step` (module docstring)."""
  commit, dirty = checkout()
  devices = {}
  for d in jax.local_devices():
    devices[d.device_kind] = devices.get(d.device_kind, 0) + 1
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {
    "step": int(step),
    "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": commit,
    "dirty": dirty,
    **cpu_fields(),
    "cores": cores,
    "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    "backend": jax.default_backend(),
    "devices": devices,
    "jax": jax.__version__,
    "host": socket.gethostname(),
  }


def record(workdir: str, step: int) -> dict:
  """Adds `describe(step)` to workdir/FILE and returns it. The file is rewritten whole (a
  temporary file renamed over it), so a line torn by a kill is dropped, not followed."""
  entry = describe(step)
  metrics_lib.write_jsonl(os.path.join(workdir, FILE), read(workdir) + [entry])
  return entry


def read(workdir: str) -> list[dict]:
  """The records of workdir/FILE in order ([] for a run from before it was written; a
  torn last line is dropped: `metrics.read_jsonl`)."""
  return metrics_lib.read_jsonl(os.path.join(workdir, FILE))


def summary(records: list[dict]) -> dict:
  """{"starts": [steps], "commits": [short commits, first-seen order], "dirty": any
  start from changed files, "cpus": ["model name (family F, model M)", ...]} of a run."""
  commits, cpus = [], []
  for r in records:
    short = (r.get("commit") or "unknown")[:7]
    cpu = cpu_name(r)
    commits += [short] if short not in commits else []
    cpus += [cpu] if cpu not in cpus else []
  return {
    "starts": [r.get("step") for r in records],
    "commits": commits,
    "dirty": any(bool(r.get("dirty")) for r in records),
    "cpus": cpus,
  }
