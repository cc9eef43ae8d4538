r"""Soak test (not in CI): a tiny GRPO run killed with SIGKILL at random moments, restarted
each time, compared step by step with an uninterrupted run. Prints ONE JSON object.

  python -m experiments.benchmarks.soak [--steps=300] [--kills=20] [--seed=0]

Checkpoints are written every step, so kills land in checkpoint writes too. A kill comes
after a random wait of `--min_wait`..`--max_wait` seconds from the moment the process has
resumed (its first new metrics line); the run is then restarted with the same command. The
metrics of every step (timings excluded) must equal the uninterrupted run's.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

_STEPS = flags.DEFINE_integer("steps", 300, "Steps of the tiny GRPO run.")
_KILLS = flags.DEFINE_integer("kills", 20, "SIGKILLs before the run may finish.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the kill times.")
_MIN_WAIT = flags.DEFINE_float("min_wait", 0.0, "Shortest wait before a kill, seconds.")
_MAX_WAIT = flags.DEFINE_float("max_wait", 3.0, "Longest wait before a kill, seconds.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where the two runs go (default: a temp dir).")

_TIMING = ("time/", "tokens_per_s")


def _command(workdir: str) -> list[str]:
  return [
    sys.executable,
    "-m",
    "experiments.grpo",
    "--config=experiments/configs/grpo_gsm8k.py:tiny",
    f"--config.train.steps={_STEPS.value}",
    "--config.checkpoint.every=1",
    f"--workdir={workdir}",
  ]


def _lines(workdir: str) -> int:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path, encoding="utf-8") as f:
    return sum(1 for _ in f)


def _metrics(workdir: str) -> dict[int, dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  return {r["step"]: {k: v for k, v in r.items() if not k.startswith(_TIMING)} for r in records}


def main(argv):
  del argv
  root = _WORKDIR.value or tempfile.mkdtemp(prefix="rlpost_soak_")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(root, "jax_cache"))
  quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
  started = time.time()
  reference = os.path.join(root, "reference")
  subprocess.run(_command(reference), check=True, **quiet)
  reference_s = time.time() - started

  killed = os.path.join(root, "killed")
  rng, kills, restarts = np.random.default_rng(_SEED.value), 0, 0
  while kills < _KILLS.value and _lines(killed) < _STEPS.value:
    proc = subprocess.Popen(_command(killed), **quiet)
    restarts += 1
    before = _lines(killed)
    while proc.poll() is None and _lines(killed) <= before:  # wait until it has resumed
      time.sleep(0.02)
    time.sleep(rng.uniform(_MIN_WAIT.value, _MAX_WAIT.value))
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
      kills += 1
    proc.wait()
  final = subprocess.run(_command(killed), **quiet)
  restarts += 1
  if final.returncode != 0:
    raise RuntimeError(f"the final restart failed with status {final.returncode}")

  want, got = _metrics(reference), _metrics(killed)
  differing = sorted(s for s in want if got.get(s) != want[s])
  print(
    json.dumps(
      {
        "benchmark": "soak",
        "steps": _STEPS.value,
        "kills": kills,
        "restarts": restarts,
        "steps_compared": len(want),
        "steps_missing": sorted(set(want) - set(got)),
        "steps_differing": len(differing),
        "first_differing": differing[:5],
        "quarantined": sorted(os.listdir(os.path.join(killed, "quarantine")))
        if os.path.isdir(os.path.join(killed, "quarantine"))
        else [],
        "reference_run_s": round(reference_s, 1),
        "total_s": round(time.time() - started, 1),
        "workdir": root,
      },
      indent=1,
    )
  )


if __name__ == "__main__":
  app.run(main)
