"""Every recipe's tiny run through its main, its metrics as JSON: did a change alter a run?

  python -m experiments.benchmarks.recipe_metrics --out=before.json      # on one commit
  python -m experiments.benchmarks.recipe_metrics --compare=before.json  # on another

Runs GRPO, GRPO with 2 passes per batch, DAPO, PPO, agentic GRPO and PPO (FrozenLake),
SFT, DPO and the reward model on their `tiny` variants for `--steps` iterations, each as
`python -m experiments.MAIN` in a fresh workdir, and prints one JSON object: the CPU, and
per run every metrics.jsonl record less its timings (`time/*`, `*tokens_per_s`,
`step_seconds`). With --compare, each value is checked against the other file's (same
machine: the runs are deterministic) and the object says which runs and keys differ and
by how much; the exit status is 1 when any does.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from experiments.benchmarks import suite_time

_OUT = flags.DEFINE_string("out", "", "write the JSON here too")
_COMPARE = flags.DEFINE_string("compare", "", "a JSON file of an earlier run to compare with")
_STEPS = flags.DEFINE_integer("steps", 4, "iterations per run (PPO's critic warm-up is 2)")
_ROOT = flags.DEFINE_string(
  "root", "", "keep the runs' workdirs here (a later commit resumes them); '': a temporary one"
)

RUNS = {
  "grpo": ("experiments.grpo", "grpo_gsm8k.py:tiny", []),
  "grpo_2_passes": ("experiments.grpo", "grpo_gsm8k.py:tiny", ["--config.algo.num_iterations=2"]),
  "dapo": ("experiments.grpo", "grpo_gsm8k.py:tiny,dapo", []),
  "ppo": ("experiments.ppo", "ppo_gsm8k.py:tiny", []),
  "agentic_grpo": ("experiments.agentic", "agentic.py:frozenlake_tiny", []),
  "agentic_ppo": ("experiments.agentic", "agentic.py:frozenlake_tiny,ppo", []),
  "sft": ("experiments.sft", "sft.py:tiny", []),
  "dpo": ("experiments.dpo", "dpo.py:tiny", []),
  "reward_model": ("experiments.reward_model", "reward_model.py:tiny", []),
}
_TIMING = ("time/", "step_seconds")


def _untimed(record: dict) -> dict:
  return {
    k: v for k, v in record.items() if not k.startswith(_TIMING) and not k.endswith("tokens_per_s")
  }


def run_metrics(name: str, steps: int, root: str) -> list[dict]:
  """The metrics records of run `name` (RUNS), `steps` iterations in `root`/name."""
  main, config, extra = RUNS[name]
  workdir = os.path.join(root, name)
  args = [f"--config=experiments/configs/{config}", f"--config.train.steps={steps}", *extra]
  subprocess.run(
    [sys.executable, "-m", main, *args, f"--workdir={workdir}", "--compilation_cache_dir="],
    cwd=suite_time.REPO_ROOT,
    check=True,
    capture_output=True,
    timeout=900,
  )
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [_untimed(json.loads(line)) for line in f]


def _nan(value) -> bool:
  return isinstance(value, float) and math.isnan(value)


def differences(before: dict, after: dict) -> dict:
  """{run: {key: max |difference| (or "missing" / "added")}} over runs in both."""
  out = {}
  for name in sorted(set(before) & set(after)):
    diff = {}
    old, new = before[name], after[name]
    if len(old) != len(new):
      diff["records"] = f"{len(old)} -> {len(new)}"
    for a, b in zip(old, new):
      for key in set(a) | set(b):
        if key not in b or key not in a:
          diff[key] = "missing" if key not in b else "added"
        elif a[key] != b[key] and not (_nan(a[key]) and _nan(b[key])):
          gap = abs(a[key] - b[key]) if isinstance(a[key], (int, float)) else "changed"
          diff[key] = max(diff.get(key, 0), gap) if isinstance(gap, float) else gap
    if diff:
      out[name] = diff
  return out


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as scratch:
    root = _ROOT.value or scratch
    runs = {name: run_metrics(name, _STEPS.value, root) for name in RUNS}
  result = {"cpu": suite_time.cpu_description(), "steps": _STEPS.value, "runs": runs}
  if _COMPARE.value:
    with open(_COMPARE.value, encoding="utf-8") as f:
      result["differences"] = differences(json.load(f)["runs"], runs)
  text = json.dumps(result, sort_keys=True)
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      f.write(text + "\n")
  print(json.dumps({k: v for k, v in result.items() if k != "runs"}, sort_keys=True))
  if result.get("differences"):
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
