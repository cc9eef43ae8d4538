"""The test suite's time, cold: a fresh compilation cache, README's test command, JSON out.

  python -m experiments.benchmarks.suite_time                  # the whole suite
  python -m experiments.benchmarks.suite_time --marker="not slow"   # the fast tier

Prints one JSON object: the CPU (model name, family/model numbers, whether it has
AVX-512 and AMX), the load average before the run, pytest's wall seconds, its summary
line, and the ten slowest tests. The compilation cache is an empty temporary directory
(JAX_COMPILATION_CACHE_DIR, which tests/conftest.py and the subprocesses the tests start
use), so every program compiles once, as on a fresh clone in CI.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_MARKER = flags.DEFINE_string("marker", "", "pytest -m expression ('' = every test)")
_WORKERS = flags.DEFINE_integer("workers", 2, "pytest-xdist workers")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_description() -> dict:
  """Model name, family and model numbers and the feature flags that matter here."""
  info = {}
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return info
  for key in ("model name", "cpu family", "model"):
    match = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
    if match:
      info[key.replace(" ", "_")] = match.group(1).strip()
  flags_line = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
  present = set(flags_line.group(1).split()) if flags_line else set()
  info["avx512f"] = "avx512f" in present
  info["amx"] = "amx_tile" in present
  info["cores"] = os.cpu_count()
  return info


def slowest(output: str, count: int = 10) -> list[dict]:
  """The `count` slowest phases `--durations=0` printed."""
  rows = re.findall(r"^([0-9.]+)s (call|setup|teardown)\s+(\S+)$", output, re.M)
  rows = sorted(((float(s), phase, test) for s, phase, test in rows), reverse=True)
  return [{"seconds": s, "phase": p, "test": t} for s, p, t in rows[:count]]


def main(argv):
  del argv
  load = os.getloadavg()[0]
  command = [sys.executable, "-m", "pytest", "-q", "-rs", "--durations=0", "-p", "no:cacheprovider"]
  command += ["-n", str(_WORKERS.value), "--dist", "loadscope", "--no-loadscope-reorder"]
  if _MARKER.value:
    command += ["-m", _MARKER.value]
  with tempfile.TemporaryDirectory(prefix="rlpost_cold_cache_") as cache:
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache}
    start = time.time()
    out = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    wall = time.time() - start
  summary = [line for line in out.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
  report = {
    "cpu": cpu_description(),
    "load_average_before": load,
    "marker": _MARKER.value,
    "workers": _WORKERS.value,
    "returncode": out.returncode,
    "wall_s": round(wall, 1),
    "summary": summary[-1] if summary else "",
    "slowest": slowest(out.stdout),
  }
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  app.run(main)
