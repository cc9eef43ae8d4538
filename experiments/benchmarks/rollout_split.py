r"""Sampler throughput with its rows split over the rollout devices, against the same
devices each sampling every row (the sampler before rows were split) and one device.

Workload: the `--preset` architecture with random weights, `--prompts` prompts x
`--samples` samples (one prefill per prompt), `--new_tokens` new tokens, on `--devices`
simulated CPU devices (a child process with that device count). Modes:
  one         the weights on one device
  replicated  the weights replicated on every device, the rows whole on each
  split       the weights replicated, each device sampling its block of rows
              (`sampling.row_sharding`, what the RL recipes do)
Per mode: first-call seconds (compilation), steady seconds (median of `--repeats`) and
sampled tokens/s. The split samples equal one device's (tokens; logprobs within 1e-5).
Prints ONE JSON object.

  python -m experiments.benchmarks.rollout_split [--devices=4] [--preset=gemma3_270m]
"""

import json
import os
import sys
import time

from absl import app
from absl import flags

from experiments.benchmarks import child

_DEVICES = flags.DEFINE_integer("devices", 4, "Simulated sampler devices.")
_PRESET = flags.DEFINE_string("preset", "gemma3_270m", "Model preset (random weights).")
_PROMPTS = flags.DEFINE_integer("prompts", 4, "Prompts.")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Samples per prompt.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Prompt tokens.")
_NEW = flags.DEFINE_integer("new_tokens", 32, "New tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions.")
_CHILD = flags.DEFINE_bool("child", False, "Internal: run with the devices already set.")


def _child() -> dict:
  import jax
  import numpy as np

  from rlpost import continuation, sampling
  from rlpost.models import decoder, families

  config = families.get_config(_PRESET.value)
  params = decoder.init_params(jax.random.key(0), config)
  sc = sampling.SamplingConfig(max_new_tokens=_NEW.value, stop_ids=(), pad_id=0)
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(3, 1000, size=_PROMPT_LEN.value)) for _ in range(_PROMPTS.value)]
  tokens, lengths = sampling.pad_prompts(prompts, sc)
  rows = _PROMPTS.value * _SAMPLES.value
  ids = np.arange(rows, dtype=np.int32)
  key = jax.random.key(1)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("data",))
  on = {
    "one": jax.device_put(params, jax.devices()[0]),
    "replicated": jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.P())),
  }
  on["split"] = on["replicated"]
  out, results = {}, {}
  for mode, weights in on.items():
    args, G = (tokens, lengths, ids), _SAMPLES.value
    if mode == "split":
      split = sampling.row_sharding(weights, rows)
      assert split is not None, "rows do not split over the devices"
      if _PROMPTS.value % len(jax.devices()):
        args, G = (np.repeat(tokens, G, 0), np.repeat(lengths, G), ids), 1
      args = jax.device_put(args, split)

    def call():
      return continuation.start(
        weights,
        args[0],
        args[1],
        key,
        None,
        args[2],
        model_config=config,
        config=sc,
        num_samples=G,
        keep_cache=False,
      )[0]

    start = time.perf_counter()
    results[mode] = jax.device_get(jax.block_until_ready(call()))
    first = time.perf_counter() - start
    times = []
    for _ in range(_REPEATS.value):
      start = time.perf_counter()
      jax.block_until_ready(call())
      times.append(time.perf_counter() - start)
    steady = float(np.median(times))
    out[mode] = {
      "first_s": round(first, 3),
      "steady_s": round(steady, 3),
      "tokens_per_s": round(rows * _NEW.value / steady, 1),
    }
  for mode in ("replicated", "split"):
    out[mode]["tokens_equal_one_device"] = bool(
      np.array_equal(results[mode].tokens, results["one"].tokens)
    )
    a, b = results[mode].logprobs, results["one"].logprobs
    out[mode]["max_logprob_diff"] = float(np.where(a == b, 0.0, np.abs(a - b)).max())
  out["split_over_replicated"] = round(
    out["split"]["tokens_per_s"] / out["replicated"]["tokens_per_s"], 3
  )
  return out


def main(argv):
  del argv
  if _CHILD.value:
    print(json.dumps(_child()))
    return
  env = {
    **os.environ,
    "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
    f"--xla_force_host_platform_device_count={_DEVICES.value}",
    "JAX_PLATFORMS": "cpu",
  }
  started = time.time()
  result = child.run_json("experiments.benchmarks.rollout_split", ["--child", *sys.argv[1:]], env)
  result.update(
    {
      "benchmark": "rollout_split",
      "workload": f"{_PRESET.value} random weights, {_PROMPTS.value} prompts x {_SAMPLES.value} "
      f"samples, {_PROMPT_LEN.value} prompt + {_NEW.value} new tokens, {_DEVICES.value} "
      "simulated CPU devices",
      "cores": os.cpu_count(),
      "load_before": os.getloadavg()[0],
      "wall_s": round(time.time() - started, 1),
      "date": time.strftime("%Y-%m-%d %H:%M"),
    }
  )
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  app.run(main)
