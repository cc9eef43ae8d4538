r"""Seconds per real agentic iteration by phase, for one or more checkouts side by side.

Runs `experiments.agentic` (default: FrozenLake 4x4 with PPO on the real Gemma 3 270M,
16 episodes per iteration, no evaluation) for `--steps` iterations in each tree given,
one after the other in fresh processes, and reads the run's metrics.jsonl: rollout,
forward (reference / value passes) and train seconds per iteration. The first
iterations compile; `steady` is the median of those after the first `--skip`. Issue
38's "cheaper iterations" compares this tree with the checkout before a change on one CPU:

  python -m experiments.benchmarks.frozenlake_iteration --trees=/tmp/before,. \
      [--variant=frozenlake_gemma3,ppo] [--steps=3] [--set=train.batch_tasks=16] \
      [--tree_set=1:algo.credit=token]   (an override for the second tree only)

Issue 38's comparison with e160d23 (one PPO update per iteration, GAE over tokens, the
episode's reward on its last token) overrides the newer trees' defaults to match it:
  --set=algo.critic_warmup_steps=1 --tree_set=1:algo.credit=token
  --tree_set=1:per_turn_rewards=False --tree_set=1:algo.mini_batch_size=16
  --tree_set=1:algo.num_iterations=1   (since dd62ee5 the default is two epochs; the value
  head's own rate and normalised values, also defaults since then, cost no trunk pass)

A tree may appear twice (e.g. with and without an override). Run the trees once before
timing them when their compilation caches are cold: a later tree would find programs
an earlier one compiled.

Prints ONE JSON object: the CPU model, the load average before each run, and per tree
its commit, per-iteration phase seconds and the steady-state medians.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from experiments.benchmarks import machine


_TREES = flags.DEFINE_list("trees", ["."], "Checkouts to time, in this order.")
_VARIANT = flags.DEFINE_string("variant", "frozenlake_gemma3,ppo", "agentic.py variant.")
_STEPS = flags.DEFINE_integer("steps", 3, "Iterations per tree (the first one compiles).")
_SKIP = flags.DEFINE_integer(
  "skip", 1, "Leading iterations left out of `steady` (compiling: rollouts meet new shapes)."
)
_SET = flags.DEFINE_multi_string("set", [], "Extra config overrides, FIELD=VALUE.")
_TREE_SET = flags.DEFINE_multi_string(
  "tree_set", [], "An override for one run only, I:FIELD=VALUE (I: its place in --trees)."
)
PHASES = ("time/rollout_s", "time/forward_s", "time/train_s")


def _commit(tree: str) -> str:
  out = subprocess.run(
    ["git", "-C", tree, "log", "-1", "--format=%h %s"], capture_output=True, text=True
  )
  return out.stdout.strip()[:100]


def _run(tree: str, workdir: str, extra: list[str]) -> dict:
  command = [
    sys.executable,
    "-m",
    "experiments.agentic",
    f"--config=experiments/configs/agentic.py:{_VARIANT.value}",
    f"--config.train.steps={_STEPS.value}",
    "--config.eval.every=0",
    f"--workdir={workdir}",
    *[f"--config.{kv}" for kv in (*_SET.value, *extra)],
  ]
  load = os.getloadavg()[0]
  start = time.perf_counter()
  done = subprocess.run(command, cwd=tree, capture_output=True, text=True)
  wall = time.perf_counter() - start
  if done.returncode != 0:
    raise RuntimeError(f"{tree}: exit {done.returncode}\n{done.stderr[-3000:]}")
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  rows = [r for r in rows if "time/train_s" in r]
  per_iteration = [{p: r.get(p, 0.0) for p in PHASES} for r in rows]
  for it in per_iteration:
    it["total_s"] = sum(it[p] for p in PHASES)
  later = per_iteration[_SKIP.value :] or per_iteration
  steady = {k: statistics.median(it[k] for it in later) for k in (*PHASES, "total_s")}
  return {
    "commit": _commit(tree),
    "overrides": [*_SET.value, *extra],
    "load_before": load,
    "wall_s": wall,
    "iterations": per_iteration,
    "steady": steady,
  }


def main(argv):
  del argv
  report = {
    "cpu": machine.cpu_model(),
    "variant": _VARIANT.value,
    "steps": _STEPS.value,
    "runs": {},
  }
  for i, tree in enumerate(_TREES.value):
    extra = [kv.split(":", 1)[1] for kv in _TREE_SET.value if kv.split(":", 1)[0] == str(i)]
    with tempfile.TemporaryDirectory() as workdir:
      report["runs"][f"{i}:{tree}"] = _run(os.path.abspath(tree), workdir, extra)
      print(json.dumps({f"{i}:{tree}": report["runs"][f"{i}:{tree}"]["steady"]}), file=sys.stderr)
  runs = list(report["runs"].values())
  report["steady_total_ratio_to_first"] = [
    run["steady"]["total_s"] / runs[0]["steady"]["total_s"] for run in runs
  ]
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  app.run(main)
