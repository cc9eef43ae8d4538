"""Where a profiled test run's time went: per module, per compiled program, slowest tests.

  RLPOST_TEST_PROFILE=/tmp/prof python -m pytest ...   # tests/conftest.py writes DIR/<worker>.jsonl
  python -m experiments.benchmarks.suite_profile --profile=/tmp/prof [--top=15]

Prints one JSON object: totals (wall, CPU of the test processes and of their subprocesses,
XLA compile, tracing, lowering, cache-read seconds over every test), per test module the
same sums and its test count (most wall first), per program name (`jit_sample`,
`jit_jitted_step`, ...) its compile seconds and how many times XLA compiled one of that
name, and the slowest tests. Seconds are each test's own (wall includes its module
fixtures when it builds them, and its subprocesses).
"""

import collections
import glob
import json
import os

from absl import app
from absl import flags

_PROFILE = flags.DEFINE_string("profile", None, "the RLPOST_TEST_PROFILE directory of a run")
_TOP = flags.DEFINE_integer("top", 15, "programs and tests listed")

SECONDS = ("wall_s", "cpu_s", "child_cpu_s", "compile_s", "trace_s", "lower_s", "cache_read_s")


def read_records(directory: str) -> list[dict]:
  """Every test's record from DIR/<worker>.jsonl (one JSON object per line)."""
  paths = sorted(glob.glob(os.path.join(directory, "*.jsonl")))
  if not paths:
    raise FileNotFoundError(f"--profile={directory}: no *.jsonl (set RLPOST_TEST_PROFILE=DIR)")
  records = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      records.extend(json.loads(line) for line in f if line.strip())
  return records


def summarize(records: list[dict], top: int = 15) -> dict:
  """Totals, per-module sums, per-program compile seconds and the `top` slowest tests."""
  totals = {key: 0.0 for key in SECONDS}
  modules = collections.defaultdict(lambda: {"tests": 0, **{key: 0.0 for key in SECONDS}})
  programs = collections.defaultdict(lambda: {"compile_s": 0.0, "programs": 0})
  for record in records:
    module = modules[record["test"].split("::")[0]]
    module["tests"] += 1
    for key in SECONDS:
      totals[key] += record.get(key, 0.0)
      module[key] += record.get(key, 0.0)
    counts = record.get("compiles", {})  # older profiles: one compilation per name and test
    for name, seconds in record.get("programs", {}).items():
      programs[name]["compile_s"] += seconds
      programs[name]["programs"] += counts.get(name, 1)
  rounded = lambda d: {k: round(v, 1) if isinstance(v, float) else v for k, v in d.items()}
  by = lambda key: lambda item: -item[1][key]
  return {
    "tests": len(records),
    "totals": rounded(totals),
    "modules": {m: rounded(v) for m, v in sorted(modules.items(), key=by("wall_s"))},
    "programs": {p: rounded(v) for p, v in sorted(programs.items(), key=by("compile_s"))[:top]},
    "slowest": [
      {"test": r["test"], **{k: round(r.get(k, 0.0), 1) for k in SECONDS}}
      for r in sorted(records, key=lambda r: -r["wall_s"])[:top]
    ],
  }


def main(argv):
  del argv
  print(json.dumps(summarize(read_records(_PROFILE.value), _TOP.value), indent=1))


if __name__ == "__main__":
  flags.mark_flag_as_required("profile")
  app.run(main)
