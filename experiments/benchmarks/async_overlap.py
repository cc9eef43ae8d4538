r"""Synchronous against pipelined (one-step off-policy) GRPO on the same workload.

Workload: the tiny GRPO task (`grpo_gsm8k.py:tiny`, all weights trained), the trainer on `--trainer`
simulated CPU devices (data parallel) and the sampler on `--rollout` others
(`mesh.rollout`), `--steps` iterations per run, `--seeds` seeds, synchronous
(`rollout.max_staleness` None) and pipelined (`max_staleness` 1, `algo.tis_cap` 2).
Steady state: the first `--warmup` iterations (compilation) are left out of the
times. Per mode: seconds per iteration (wall time between iterations, median), steps/s,
trained tokens/s, the mean rollout and train phase times, and the overlap efficiency
`(t_rollout + t_train - t_step) / min(t_rollout, t_train)` (0: no overlap, 1: the
shorter phase hidden entirely; negative when the step has time outside both phases,
`t_other_s`: loop, logging, weight copies), `overlap_vs_sync` (the synchronous step
time the pipelined run saved, over the synchronous run's shorter phase); plus each
run's reward curve. Prints ONE JSON object.

  python -m experiments.benchmarks.async_overlap [--steps=30] [--seeds=0,1,2] [--out=F.json]
  python -m experiments.benchmarks.async_overlap --processes=2 --max_new_tokens=32

`--processes=P`: P local processes (jax.distributed over gloo), each with trainer/P +
rollout/P of the simulated devices: the trainer's mesh spans all processes, each samples
its block of rows on its own rollout devices (pipelined: in its producer thread).
`--max_new_tokens` sets the sampler's budget, to balance the two phases.

On a CPU the simulated devices share the same cores, so the phases compete for them and
little overlap is possible; the JSON says which machine it ran on.
"""

import json
import os
import platform
import subprocess
import sys
import time

from absl import app
from absl import flags

from experiments import cli
from experiments.benchmarks import child

_STEPS = flags.DEFINE_integer("steps", 30, "Iterations per run.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Iterations left out of the times (compilation).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Config seeds, one run per mode each.")
_TRAINER = flags.DEFINE_integer("trainer", 4, "Trainer devices.")
_ROLLOUT = flags.DEFINE_integer("rollout", 4, "Sampler devices.")
_PROCESSES = flags.DEFINE_integer("processes", 1, "Local processes (jax.distributed, gloo).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "Sampler budget (None: the config's).")
_OUT = flags.DEFINE_string("out", "", "Also write the JSON here.")
_CHILD = flags.DEFINE_bool("child", False, "Internal: run with the devices already set.")
_ROOT = flags.DEFINE_string("root", "", "Internal: the runs' directory (every process's).")


def _run(mode: str, seed: int, workdir: str) -> dict | None:
  import jax
  import numpy as np

  sys.path.insert(0, "tests")
  from conftest import run_metrics, with_overrides
  from experiments.configs import grpo_gsm8k
  from rlpost.recipes import rl, rollout

  overrides = {
    "seed": seed,
    "train.steps": _STEPS.value,
    "checkpoint.every": _STEPS.value,
    "mesh.data": _TRAINER.value,
    "mesh.rollout": _ROLLOUT.value // _PROCESSES.value,  # each process's own
    "algo.tis_cap": 2.0,
    "train.micro_batch_size": 4,
    "rollout.max_staleness": 1 if mode == "async" else None,
  }
  if _MAX_NEW.value:
    overrides["sampling.max_new_tokens"] = _MAX_NEW.value
  ends = []
  inner = rollout.loop_step

  def timed_loop_step(*args, **kwargs):
    step, close, carry = inner(*args, **kwargs)

    def timed(*a):
      out = step(*a)
      ends.append(time.perf_counter())
      return out

    return timed, close, carry

  rollout.loop_step = timed_loop_step
  try:
    rl.run(with_overrides(grpo_gsm8k.get_config("tiny"), overrides), workdir)
  finally:
    rollout.loop_step = inner
  if jax.process_index():  # process 0 writes the metrics
    return None
  records = run_metrics(workdir)
  steady = records[_WARMUP.value :]
  t_step = float(np.median(np.diff(ends[_WARMUP.value - 1 :])))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    timed = [json.loads(line) for line in f][_WARMUP.value :]
  t_rollout = float(np.mean([r["time/rollout_s"] for r in timed]))
  t_train = float(np.mean([r["time/train_s"] for r in timed]))
  tokens = float(
    np.mean([r["tokens_per_s"] * (r["time/rollout_s"] + r["time/train_s"]) for r in timed])
  )
  return {
    "seed": seed,
    "t_step_s": t_step,
    "steps_per_s": 1.0 / t_step,
    "tokens_per_s": tokens / t_step,
    "t_rollout_s": t_rollout,
    "t_train_s": t_train,
    "overlap_efficiency": (t_rollout + t_train - t_step) / min(t_rollout, t_train),
    "t_other_s": t_step - t_rollout - t_train,  # step time outside both phases
    "rewards": [r["reward/mean"] for r in records],
    "final_reward": float(np.mean([r["reward/mean"] for r in records[-4:]])),
    "staleness": sorted({r.get("staleness") for r in steady if "staleness" in r}),
  }


def _summary(runs):
  import numpy as np

  keys = (
    "t_step_s",
    "steps_per_s",
    "tokens_per_s",
    "t_rollout_s",
    "t_train_s",
    "overlap_efficiency",
    "final_reward",
  )
  return {k: float(np.mean([r[k] for r in runs])) for k in keys}


def _child() -> dict | None:
  import jax

  assert jax.device_count() == _TRAINER.value + _ROLLOUT.value, jax.devices()
  out = {"modes": {}}
  for mode in ("sync", "async"):
    runs = [_run(mode, int(s), f"{_ROOT.value}/{mode}{s}") for s in _SEEDS.value]
    if jax.process_index():
      continue
    out["modes"][mode] = {"mean": _summary(runs), "runs": runs}
  if jax.process_index():
    return None
  sync, pipelined = (out["modes"][m]["mean"] for m in ("sync", "async"))
  out["async_over_sync_steps_per_s"] = pipelined["steps_per_s"] / sync["steps_per_s"]
  # the share of the synchronous run's shorter phase that pipelining hid
  out["overlap_vs_sync"] = (sync["t_step_s"] - pipelined["t_step_s"]) / min(
    sync["t_rollout_s"], sync["t_train_s"]
  )
  return out


def _cpu() -> str:
  try:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if "Model name" in line)
  except Exception:
    return platform.processor()


def _children(args, root: str) -> dict:
  """Runs `_child` in `--processes` processes (jax.distributed on a free local port, gloo),
  each with its share of the devices; returns process 0's JSON."""
  import socket
  import tempfile

  P = _PROCESSES.value
  devices = _TRAINER.value + _ROLLOUT.value
  if devices % P or _ROLLOUT.value % P:
    raise app.UsageError(f"--trainer and --rollout must split over --processes={P}")
  caller_flags = os.environ.get("XLA_FLAGS", "")  # kept: the child adds its device count
  env = {
    **os.environ,
    "XLA_FLAGS": f"{caller_flags} --xla_force_host_platform_device_count={devices // P}",
    "JAX_PLATFORMS": "cpu",
    "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
  }
  args = ["--child", f"--root={root}", *args]
  if P == 1:
    return child.run_json("experiments.benchmarks.async_overlap", args, env)
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  logs = [tempfile.TemporaryFile("w+") for _ in range(P)]
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        "-m",
        "experiments.benchmarks.async_overlap",
        *args,
        f"--dist.coordinator_address=localhost:{port}",
        f"--dist.num_processes={P}",
        f"--dist.process_id={i}",
      ],
      env=env,
      stdout=logs[i],
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(P)
  ]
  codes = [p.wait() for p in procs]
  texts = []
  for log in logs:
    log.seek(0)
    texts.append(log.read())
  if any(codes):
    raise RuntimeError(f"exit codes {codes}:\n" + "\n".join(t[-3000:] for t in texts))
  return json.loads(texts[0].strip().splitlines()[-1])


def main(argv):
  del argv
  if _CHILD.value:
    result = _child()
    if result is not None:
      print(json.dumps(result))
    return
  import tempfile

  args = [a for a in sys.argv[1:] if not a.startswith("--out")]
  started = time.time()
  with tempfile.TemporaryDirectory() as root:
    result = _children(args, root)
  result.update(
    {
      "benchmark": "async_overlap",
      "workload": f"GRPO tiny, all weights, {_TRAINER.value} trainer + {_ROLLOUT.value} sampler "
      f"simulated CPU devices over {_PROCESSES.value} process(es), "
      f"max_new_tokens {_MAX_NEW.value or 'the config default'}, {_STEPS.value} iterations "
      f"({_WARMUP.value} warm-up)",
      "cpu": _cpu(),
      "cores": os.cpu_count(),
      "load_before": os.getloadavg()[0],
      "wall_s": time.time() - started,
      "date": time.strftime("%Y-%m-%d %H:%M"),
    }
  )
  text = json.dumps(result, indent=2)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write(text + "\n")
  print(text)


if __name__ == "__main__":
  cli.run(main)
