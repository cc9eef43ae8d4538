r"""Seconds per PPO iteration by phase and peak RSS, Gemma 3 270M architecture, beside GRPO.

Workload (issue 13): 8 prompts x 1 sample, 32-token prompts, 64 new tokens (no
early stop), random weights, beta > 0 (reference logprobs every iteration), one
epoch, one mini-batch (so GAE runs in the train step: no separate value pass).
Modes: `lora` (LoRA actor, `lora` critic: adapters + a
head on the shared frozen trunk) and `full` (full-parameter actor, `full`
critic: a second trunk). Each mode runs in its own subprocess (peak RSS is per
mode); then, unless --grpo=false, `experiments.benchmarks.grpo_step` runs the
GRPO iteration (2 prompts x 4, the same sequence shapes, dtype and remat) the
same way, and the ratios PPO / GRPO are reported. Prints ONE JSON object.

  python -m experiments.benchmarks.ppo_step [--modes=lora,full] [--critic_mode=shared]
      [--separate_value_pass]   (time the value pass the default workload skips)
"""

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

from experiments.configs import ppo_gsm8k
from rlpost.data.cursor import Cursor
from rlpost.data.tasks import Task
from rlpost.data.gsm8k import Problem
from rlpost.models import loading
from rlpost.recipes import rl

_MODE = flags.DEFINE_enum("mode", "", ["", "full", "lora"], "Run one mode (internal).")
_MODES = flags.DEFINE_list("modes", ["lora", "full"], "Modes to run, each in its own process.")
_CRITIC = flags.DEFINE_enum(
  "critic_mode", None, ["lora", "full", "shared"], "Critic layout (default: the mode's)."
)
_ITERATIONS = flags.DEFINE_integer("iterations", 4, "Iterations per mode (first = compile).")
_GRPO = flags.DEFINE_bool("grpo", True, "Also run the GRPO iteration benchmark and compare.")
_SEPARATE = flags.DEFINE_bool(
  "separate_value_pass",
  False,
  "Time the no-gradient value pass even when GAE could run in the step.",
)


def _random_reward(prompts, completions, answers):
  del prompts, answers
  return [float(hash(c) % 7) for c in completions]


def _run_mode(mode: str) -> dict:
  cfg = ppo_gsm8k.get_config("gemma3_270m")
  with cfg.unlocked():
    cfg.model.weights = "random"
    cfg.lora.enabled = mode == "lora"
    cfg.critic.mode = _CRITIC.value
    cfg.env.template, cfg.env.name = "plain", "arithmetic"  # problems are made below
    cfg.sampling.max_new_tokens, cfg.sampling.prompt_bucket = 64, 32
    cfg.train.batch_tasks, cfg.train.micro_batch_size = 8, 8
    cfg.train.steps = _ITERATIONS.value
    cfg.algo.critic_warmup_steps = 0  # time the actor's update too
  m = cfg.model
  loaded = loading.load_model(m.preset, m.weights, m.path, m.dtype, cfg.seed)
  pieces = rl.build(cfg, loaded)
  question = " ".join(["hello"] * 31)
  assert len(pieces.tokenizer.encode(question)) == 32
  task = Task([Problem(question, "", "0")] * 8, {"random": _random_reward}, {}, [])
  pieces = rl.with_task(pieces, task, "plain")
  sampling = dataclasses.replace(pieces.sampling, stop_ids=())  # every token sampled
  pieces = pieces._replace(sampling=sampling)
  settings = pieces.learner.settings
  settings = dataclasses.replace(settings, gae_in_step=settings.gae_in_step and not _SEPARATE.value)
  pieces = pieces._replace(learner=pieces.learner._replace(settings=settings))
  state, cursor, times = pieces.state, Cursor(0), []
  for index in range(_ITERATIONS.value):
    start = time.perf_counter()
    state, cursor, metrics = rl.iteration(pieces, state, cursor, index)
    jax.block_until_ready(state)
    times.append(
      {
        "total_s": time.perf_counter() - start,
        **{k: float(metrics[f"time/{k}"]) for k in ("rollout_s", "forward_s", "train_s")},
        "completion_tokens": float(metrics["completion_len/mean"]) * 8,
      }
    )
  steady = times[1:]
  median = lambda k: round(float(np.median([t[k] for t in steady])), 2)
  return {
    "mode": mode,
    "critic_mode": settings.critic.mode,
    "gae_in_step": settings.gae_in_step,
    "param_dtype": cfg.model.dtype,
    "compute_dtype": cfg.train.compute_dtype,
    "remat": cfg.train.remat,
    "first_iteration_s": round(times[0]["total_s"], 2),
    "steady_iteration_s_median": median("total_s"),
    "steady_iteration_s_min": round(min(t["total_s"] for t in steady), 2),
    "steady_rollout_s_median": median("rollout_s"),
    "steady_forward_s_median": median(
      "forward_s"
    ),  # reference pass [+ critic value pass and GAE unless gae_in_step]
    "steady_train_s_median": median("train_s"),
    "completion_tokens_per_iteration": times[-1]["completion_tokens"],
    "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
  }


def _subprocess_json(args) -> dict:
  out = subprocess.run(
    [sys.executable, "-m", *args], capture_output=True, text=True, check=True
  ).stdout
  return json.loads(out[out.index("{") :])


def main(argv):
  del argv
  if _MODE.value:
    print(json.dumps(_run_mode(_MODE.value)))
    return
  results = {
    "benchmark": "ppo_step",
    "jax": jax.__version__,
    "workload": {"prompts": 8, "samples": 1, "prompt_len": 32, "new_tokens": 64, "beta": 0.05},
    "loadavg_before": open("/proc/loadavg").read().split()[:3],
  }
  extra = [f"--critic_mode={_CRITIC.value}"] if _CRITIC.value else []
  extra.append(f"--separate_value_pass={_SEPARATE.value}")
  for mode in _MODES.value:
    results[mode] = _subprocess_json(
      ["experiments.benchmarks.ppo_step", f"--mode={mode}", f"--iterations={_ITERATIONS.value}"]
      + extra
    )
  if _GRPO.value:
    grpo = _subprocess_json(
      [
        "experiments.benchmarks.grpo_step",
        f"--modes={','.join(_MODES.value)}",
        f"--iterations={_ITERATIONS.value}",
      ]
    )
    results["grpo"] = {mode: grpo[mode] for mode in _MODES.value}
    results["ppo_over_grpo"] = {
      mode: {
        "time": round(
          results[mode]["steady_iteration_s_median"] / grpo[mode]["steady_iteration_s_median"], 3
        ),
        "peak_rss": round(results[mode]["peak_rss_gib"] / grpo[mode]["peak_rss_gib"], 3),
      }
      for mode in _MODES.value
    }
  results["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
  print(json.dumps(results, indent=1))


if __name__ == "__main__":
  app.run(main)
