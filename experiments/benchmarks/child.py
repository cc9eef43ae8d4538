"""Running a benchmark's measurement in a fresh Python process (its own peak RSS, its own
device count) and reading back the JSON object it prints last."""

import json
import subprocess
import sys


def run_json(module: str, args, env=None) -> dict:
  """`python -m module *args` (with `env`), and the JSON object on its last stdout line.

  Raises RuntimeError with the child's stderr when it fails.
  """
  proc = subprocess.run(
    [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, check=False
  )
  if proc.returncode:
    raise RuntimeError(f"{module} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])
