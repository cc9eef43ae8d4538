r"""Seconds per GRPO iteration (rollout + train) and peak RSS, Gemma 3 270M architecture
(`--preset=gemma3_1b`: the 1B's, random weights, the tokenizer still the packaged 270M
GGUF's, `families`' packaged file of both: the same 262144-token vocabulary).

Workload (the peer benchmark's): 2 prompts x 4 generations, 32-token prompts,
64 new tokens (no early stop), random weights, beta > 0 (reference logprobs
computed every iteration), full-parameter and LoRA. Each mode runs in its own
subprocess so peak RSS is per mode. Prints ONE JSON object.

  python -m experiments.benchmarks.grpo_step [--preset=gemma3_1b] [--dtype=bfloat16]
      [--compute_dtype=bfloat16] [--remat=full] [--modes=full,lora,qlora] [--memory_report]

Mode "qlora": LoRA over a frozen NF4 base (`model.base_bits=4`, `quant4.frozen_base` of
the loaded weights: NF4 layers, the embedding in bfloat16 where the trainer's matmuls
are), the sampler reading the adapters merged into it, NF4 again (`sampling.weights=int4`,
TIS cap 2), whatever --sampler_weights says.

peak_rss_gib is the process's; setup_peak_rss_gib (loading: with random weights the
initialisation's temporaries, ~3.2 GiB for Gemma 3 270M in float32, set it), then
first_iteration_peak_rss_gib (compiling) and steady_peak_rss_gib (the later iterations)
split it, the peak reset between them (`_reset_peak_rss`); iteration_peak_rss_gib, the
larger of the last two, is what `rss_budget` checks.
"""

import contextlib
import dataclasses
import json
import resource
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from experiments.benchmarks import device_memory
from experiments.benchmarks import memory_probe
from experiments.benchmarks import rss_budget
from experiments.configs import grpo_gsm8k
from rlpost.data.cursor import Cursor
from rlpost.data.tasks import Task
from rlpost.data.gsm8k import Problem
from rlpost.models import loading
from rlpost.models import policy
from rlpost.models import quant4
from rlpost.recipes import common
from rlpost.recipes import rl
from rlpost.recipes import rollout as rollout_lib
from rlpost.rl import objectives
from rlpost.train import weight_sync

_PRESET = flags.DEFINE_enum(
  "preset",
  "gemma3_270m",
  ["gemma3_270m", "gemma3_1b"],
  "Architecture (random weights). Only gemma3_270m's peaks are checked (`rss_budget`).",
)
_MODE = flags.DEFINE_enum("mode", "", ["", "full", "lora", "qlora"], "Run one mode (internal).")
_ITERATIONS = flags.DEFINE_integer("iterations", 4, "Iterations per mode (first = compile).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Param dtype.")
_COMPUTE = flags.DEFINE_enum(
  "compute_dtype",
  None,
  ["float32", "bfloat16", "auto"],
  "Trainer matmul input dtype (default: the config's; auto: this machine's choice).",
)
_CHUNK = flags.DEFINE_integer("logprob_chunk", None, "Projection chunk (default: the config's).")
_REMAT = flags.DEFINE_enum(
  "remat", None, ["dots", "full"], "Trainer activation policy (default: the config's)."
)
_SAMPLER = flags.DEFINE_enum(
  "sampler_weights",
  "model",
  ["model", "int8", "int4"],
  "What the sampler reads (int8 / int4: a copy per weight sync, TIS cap 2; int8's dots "
  "calibrated).",
)
_MODES = flags.DEFINE_list(
  "modes", ["full", "lora", "qlora"], "Modes to run, each in its own process."
)
_MODEL_PATH = flags.DEFINE_string(
  "model_path",
  "",
  "GGUF whose tokenizer the random-weight model uses (default: the packaged model's; a "
  "copy with no tensors, rlpost.models.weights.gguf_file.write_metadata_only, will do).",
)
_MEMORY = flags.DEFINE_bool(
  "memory_report",
  False,
  "Also report where the peak RSS is reached: VmRSS sampled per phase (weight sync, "
  "fingerprints, rollout, reference logprobs, train step), the VmRSS each phase's "
  "maximum was entered at, and the live arrays at each phase's end (`memory_probe`).",
)
_FREE_LOADED = flags.DEFINE_bool(
  "free_loaded",
  False,
  "Drop this script's reference to the loaded params once the run is built, as `rl.run` "
  "does (off: the recorded figures, which hold a second float32 copy of the embedding: "
  "the loaded one beside the placed one).",
)
_CHECK_RSS = flags.DEFINE_bool(
  "check_rss",
  True,
  "Exit 1 after printing when a mode's peak RSS is above its expected figure "
  "(`rss_budget.EXPECTED`, XLA:CPU, default workload) plus the tolerance.",
)
_REWARD_MODEL = flags.DEFINE_string(
  "reward_model",
  "",
  "A reward-model run's --workdir over the same model (e.g. `experiments.reward_model "
  "--config=experiments/configs/reward_model.py:gemma3_270m --config.model.weights=random "
  "--config.data.source=synthetic --config.train.steps=1 --config.checkpoint.every=1`): its "
  "score joins each episode's reward, scored on device every iteration.",
)


def _random_reward(prompts, completions, answers):
  del prompts, answers
  return [float(hash(c) % 7) for c in completions]


def _run_mode(mode: str) -> dict:
  cfg = grpo_gsm8k.get_config(_PRESET.value)
  with cfg.unlocked():
    cfg.model.weights, cfg.model.dtype = "random", _DTYPE.value
    cfg.model.path = _MODEL_PATH.value  # gemma3_1b too: the packaged 270M GGUF (families)
    cfg.lora.enabled = mode in ("lora", "qlora")
    cfg.env.template, cfg.env.name = "plain", "arithmetic"  # problems are made below
    cfg.sampling.max_new_tokens, cfg.sampling.prompt_bucket = 64, 32
    cfg.train.batch_tasks, cfg.train.micro_batch_size = 2, 8
    cfg.train.steps = _ITERATIONS.value
    cfg.train.compute_dtype = _COMPUTE.value or cfg.train.compute_dtype
    cfg.train.logprob_chunk = _CHUNK.value or cfg.train.logprob_chunk
    cfg.train.remat = _REMAT.value or cfg.train.remat
    cfg.sampling.weights = "int4" if mode == "qlora" else _SAMPLER.value
    cfg.model.base_bits = 4 if mode == "qlora" else 32
    if cfg.sampling.weights != "model":
      cfg.algo.tis_cap = 2.0
    cfg.reward_model.path = _REWARD_MODEL.value
  probe = _probed() if _MEMORY.value else None
  mark = probe.mark if probe else lambda name, **how: None
  mark("imported")
  m = cfg.model
  loaded = loading.load_model(m.preset, m.weights, m.path, m.dtype, cfg.seed)
  jax.block_until_ready(loaded[1])
  mark("loaded")
  if m.base_bits == 4:  # as `recipes.common.load_model` does
    embed_dtype = common.qlora_embed_dtype(cfg)
    loaded = (loaded[0], quant4.frozen_base(loaded[1], embed_dtype), loaded[2])
    jax.block_until_ready(loaded[1])
    mark("frozen_base")
  pieces = rl.build(cfg, loaded)  # calibrates "auto" paths: nothing else may run meanwhile
  if _FREE_LOADED.value:  # as `rl.run`, which keeps no reference to the loaded params
    del loaded
  mark("built", trim=True)
  if probe:
    step = probe.wrap("train_step", pieces.learner.train_step)
    pieces = pieces._replace(learner=pieces.learner._replace(train_step=step))
  tok = pieces.tokenizer
  question = " ".join(["hello"] * 31)
  assert len(tok.encode(question)) == 32, len(tok.encode(question))
  task = Task([Problem(question, "", "0")] * 8, {"random": _random_reward}, {}, [])
  pieces = rl.with_task(pieces, task, "plain")
  sampling = dataclasses.replace(pieces.sampling, stop_ids=())  # every token sampled
  pieces = pieces._replace(sampling=sampling)
  setup_peak, first_peak = memory_probe.status_gib("VmHWM"), None
  _reset_peak_rss()
  state, cursor, times = pieces.state, Cursor(0), []
  for index in range(_ITERATIONS.value):
    start = time.perf_counter()
    with probe.phase(f"iteration_{min(index, 1)}") if probe else contextlib.nullcontext():
      state, cursor, metrics = rl.iteration(pieces, state, cursor, index)
      jax.block_until_ready(state)
    if index == 0:  # compilation and the first iteration: their peak, then reset
      first_peak = memory_probe.status_gib("VmHWM")
      _reset_peak_rss()
    times.append(
      {
        "total_s": time.perf_counter() - start,
        "rollout_s": float(metrics["time/rollout_s"]),
        "train_s": float(metrics["time/train_s"]),
        "completion_tokens": float(metrics["completion_len/mean"]) * 8,
        "reward_model_s": float(metrics.get("time/reward_model_s", 0.0)),
      }
    )
  mark("end", trim=True, clear=True)
  steady = times[1:]
  steady_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  peak_rss = round(max(setup_peak, first_peak, steady_peak), 2)
  iteration_peak = round(max(first_peak, steady_peak), 2)
  return {
    "mode": mode,
    "preset": _PRESET.value,
    "param_dtype": _DTYPE.value,
    "compute_dtype": cfg.train.compute_dtype,
    "compute_dtype_resolved": common.compute_dtype(cfg, ""),
    "logprob_chunk": cfg.train.logprob_chunk,
    "remat": cfg.train.remat,
    "sampler_weights": cfg.sampling.weights,
    "base_bits": m.base_bits,
    "frozen_embed_dtype": str(pieces.learner.frozen["embed"].dtype) if cfg.lora.enabled else None,
    "free_loaded": _FREE_LOADED.value,
    "reward_model": _REWARD_MODEL.value,
    "steady_reward_model_s_median": round(
      float(np.median([t["reward_model_s"] for t in steady])), 3
    ),
    "first_iteration_s": round(times[0]["total_s"], 2),
    "steady_iteration_s_median": round(float(np.median([t["total_s"] for t in steady])), 2),
    "steady_iteration_s_min": round(min(t["total_s"] for t in steady), 2),
    "steady_rollout_s_median": round(float(np.median([t["rollout_s"] for t in steady])), 2),
    "steady_train_s_median": round(float(np.median([t["train_s"] for t in steady])), 2),
    "completion_tokens_per_iteration": times[-1]["completion_tokens"],
    "peak_rss_gib": peak_rss,
    "iteration_peak_rss_gib": iteration_peak,
    "setup_peak_rss_gib": round(setup_peak, 2),
    "first_iteration_peak_rss_gib": round(first_peak, 2),
    "steady_peak_rss_gib": round(steady_peak, 2),
    "rss_check": rss_budget.check(_budget_key(mode, common.compute_dtype(cfg, "")), iteration_peak),
    "peak_device_gib": device_memory.peak_device_gib(),
    "backend": jax.default_backend(),
    **({"memory": probe.report()} if probe else {}),
  }


def _reset_peak_rss() -> None:
  """Sets the process's peak RSS (VmHWM, getrusage's ru_maxrss) to its RSS now (Linux:
  `clear_refs` 5), so the steady iterations' peak is measured apart from loading and
  compilation; the heap those left and malloc kept still counts."""
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")


def _budget_key(mode: str, compute_dtype: str) -> str | None:
  """`rss_budget`'s key for this run (`compute_dtype`: the trainer's, "auto" resolved):
  None off XLA:CPU, off the default workload or off the figures' compute dtype; the
  preset's name leads it off Gemma 3 270M (no expected figure: unchecked)."""
  defaults = jax.default_backend() == "cpu" and _DTYPE.value == "float32"
  defaults &= not (_COMPUTE.value or _CHUNK.value or _REMAT.value or _REWARD_MODEL.value)
  return rss_budget.key(mode, _SAMPLER.value, defaults, _PRESET.value, compute_dtype)


def _probed() -> memory_probe.Probe:
  """A probe with the GRPO iteration's phases wrapped (module attributes the recipe looks
  up at each call; this process only)."""
  probe = memory_probe.Probe(programs=True)
  for phase, name, modules in (
    ("weight_sync", "sampler_weights", [rollout_lib]),
    ("fingerprint", "fingerprint", [weight_sync]),
    ("rollout", "produce", [rl]),
    ("train", "train", [rl]),
    ("logprobs", "completion_logprobs_jit", [objectives, policy]),  # where it is now
  ):
    held = [m for m in modules if hasattr(m, name)]
    if not held:
      raise RuntimeError(
        f"--memory_report: no {name} in {[m.__name__ for m in modules]} to time the "
        f"{phase} phase by: name where it moved in grpo_step._probed"
      )
    for module in held:
      setattr(module, name, probe.wrap(phase, getattr(module, name)))
  return probe


def main(argv):
  del argv
  if _MODE.value:
    print(json.dumps(_run_mode(_MODE.value)))
    return
  results = {
    "benchmark": "grpo_step",
    "preset": _PRESET.value,
    "jax": jax.__version__,
    "workload": {
      "prompts": 2,
      "generations": 4,
      "prompt_len": 32,
      "new_tokens": 64,
      "beta": 0.08,
      "lora_rank": 32,
    },
    "loadavg_before": open("/proc/loadavg").read().split()[:3],
  }
  for mode in _MODES.value:
    out = subprocess.run(
      [
        sys.executable,
        "-m",
        "experiments.benchmarks.grpo_step",
        f"--mode={mode}",
        f"--iterations={_ITERATIONS.value}",
        f"--dtype={_DTYPE.value}",
      ]
      + [
        f"--{f.name}={f.value}"
        for f in (
          _PRESET,
          _COMPUTE,
          _CHUNK,
          _REMAT,
          _SAMPLER,
          _MODEL_PATH,
          _REWARD_MODEL,
          _MEMORY,
          _FREE_LOADED,
        )
        if f.value
      ],
      capture_output=True,
      text=True,
      check=True,
    )
    results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
  results["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
  print(json.dumps(results, indent=1))
  grown = rss_budget.failures({mode: results[mode] for mode in _MODES.value})
  if grown and _CHECK_RSS.value:
    sys.exit("\n".join(grown))


if __name__ == "__main__":
  app.run(main)
