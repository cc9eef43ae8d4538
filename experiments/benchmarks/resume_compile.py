r"""Compile time of a real-model GRPO run: a cold start against its resume.

Two fresh processes run the real Gemma 3 270M GRPO recipe (GGUF weights; the arithmetic
task, so no dataset is needed; 2 prompts x 4 samples, 64 new tokens, LoRA) in one
workdir with one compilation cache directory, both empty at first:
  cold    iteration 1 (the cache fills), then stops;
  resume  the same command again: restores the checkpoint and runs iteration 2.
Each child sums JAX's compile events (`jax.monitoring` durations: tracing, lowering to
MLIR, and backend compilation, the last including persistent-cache reads) and times
its start to the end of its first finished iteration. Prints ONE JSON object with
both and the resume/cold ratios.

  python -m experiments.benchmarks.resume_compile [--out=F.json]
"""

import collections
import json
import os
import platform
import tempfile
import time

from absl import app
from absl import flags

from experiments.benchmarks import child

_OUT = flags.DEFINE_string("out", "", "Also write the JSON here.")
_DIR = flags.DEFINE_string("dir", "", "Workdir and cache parent ('' = a new temp dir).")
_COMPUTE = flags.DEFINE_string("compute_dtype", "auto", "train.compute_dtype of the run.")
_PHASE = flags.DEFINE_enum("phase", "", ["", "cold", "resume"], "Internal: one child run.")

_EVENTS = (
  "/jax/core/compile/jaxpr_trace_duration",
  "/jax/core/compile/jaxpr_to_mlir_module_duration",
  "/jax/core/compile/backend_compile_duration",
)


def _child(base: str) -> dict:
  """One run of the recipe until one iteration is done; compile seconds by event."""
  start = time.perf_counter()
  import jax  # pylint: disable=g-import-not-at-top

  from experiments.configs import grpo_gsm8k  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top
  from rlpost.train import runtime  # pylint: disable=g-import-not-at-top

  seconds = collections.defaultdict(float)
  counts = collections.Counter()

  def listen(event, duration, **_):
    seconds[event] += duration
    counts[event] += 1

  jax.monitoring.register_event_duration_secs_listener(listen)
  runtime.enable_compilation_cache(os.path.join(base, "cache"), 4.0)
  runtime.quiet_checkpoint_logs()
  cfg = grpo_gsm8k.get_config("gemma3_270m")
  cfg.env.name, cfg.env.template = "arithmetic", "plain"
  cfg.sampling.max_new_tokens, cfg.sampling.prompt_bucket = 64, 32
  cfg.train.batch_tasks, cfg.train.micro_batch_size = 2, 8
  cfg.train.steps, cfg.checkpoint.every = 2, 1
  cfg.train.compute_dtype = _COMPUTE.value
  imported = time.perf_counter() - start
  rl.run(cfg, os.path.join(base, "run"), stop_after=1)
  return {
    "phase": _PHASE.value,
    "compute_dtype": cfg.train.compute_dtype,
    "imports_s": round(imported, 2),
    "to_first_iteration_s": round(time.perf_counter() - start, 2),
    "compile_s": {name.rsplit("/", 1)[1]: round(seconds[name], 2) for name in _EVENTS},
    "compile_total_s": round(sum(seconds[name] for name in _EVENTS), 2),
    "persistent_cache_hits_s_saved": round(
      seconds["/jax/compilation_cache/compile_time_saved_sec"], 2
    ),
    "backend_compiles": counts["/jax/core/compile/backend_compile_duration"],
  }


def main(argv):
  del argv
  if _PHASE.value:
    print(json.dumps(_child(_DIR.value)))
    return
  base = _DIR.value or tempfile.mkdtemp(prefix="resume_compile_")
  load_before = open("/proc/loadavg").read().split()[:3]
  args = [f"--dir={base}", f"--compute_dtype={_COMPUTE.value}"]
  module = "experiments.benchmarks.resume_compile"
  cold = child.run_json(module, ["--phase=cold", *args])
  resume = child.run_json(module, ["--phase=resume", *args])
  result = {
    "benchmark": "resume_compile",
    "machine": platform.processor() or platform.machine(),
    "loadavg_before": load_before,
    "loadavg_after": open("/proc/loadavg").read().split()[:3],
    "cold": cold,
    "resume": resume,
    "resume_over_cold": {
      "compile_total": round(resume["compile_total_s"] / cold["compile_total_s"], 3),
      "backend_compile": round(
        resume["compile_s"]["backend_compile_duration"]
        / cold["compile_s"]["backend_compile_duration"],
        3,
      ),
      "to_first_iteration": round(resume["to_first_iteration_s"] / cold["to_first_iteration_s"], 3),
    },
  }
  text = json.dumps(result, indent=1)
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      f.write(text)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
