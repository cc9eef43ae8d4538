r"""SFT step benchmark: full-parameter AdamW on the Gemma 3 270M architecture (random weights).

  python -m experiments.benchmarks.sft_step [--dtype=float32] [--compute_dtype=bfloat16]
      [--steps=4]

Prints ONE JSON object: the machine's matmul peak (float32, bfloat16), then for a
loss mask on every target and for one on half of them (the second half of each
row, like a prompt/response split): compile + first step seconds, steady step
seconds (min / median), tokens/s, useful FLOP/s = 6 * params * tokens / step
and its fraction of the float32 peak, and the process's peak RSS after each part.
"""

import json
import resource
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import device_memory
from rlpost.models import decoder, families
from rlpost.models import policy
from rlpost.supervised import sft
from rlpost.train import compute_paths
from rlpost.train import step as train

_BATCH = flags.DEFINE_integer("batch", 4, "Rows per step.")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Tokens per row.")
_STEPS = flags.DEFINE_integer("steps", 4, "Timed steps after the first (compile) step.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Param dtype.")
_MICRO = flags.DEFINE_integer("micro_batch_size", 4, "Rows per micro-batch.")
_CHUNK = flags.DEFINE_integer("chunk", 512, "Tokens per output-projection chunk.")
_COMPUTE = flags.DEFINE_enum(
  "compute_dtype",
  "bfloat16",
  ["float32", "bfloat16", "auto"],
  "Matmul input dtype, float32 accumulation (the configs' train.compute_dtype; auto: "
  "this machine's choice, rlpost.train.compute_paths).",
)
_REMAT = flags.DEFINE_enum("remat", "dots", ["none", "dots", "full"], "Activation policy.")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 2048, "Size of the square matmul peak probe.")
_PRESET = flags.DEFINE_string("preset", "gemma3_270m", "Model preset.")


def peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def matmul_peak(n: int, repeats: int = 5) -> dict:
  """Best GFLOP/s of a jitted n x n @ n x n matmul per dtype."""
  out, f = {}, jax.jit(jnp.dot)
  for dtype in ("float32", "bfloat16"):
    a = jax.random.normal(jax.random.key(0), (n, n)).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n)).astype(dtype)
    f(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      f(a, b).block_until_ready()
      times.append(time.perf_counter() - start)
    out[dtype] = {
      "gflops_best": 2 * n**3 / min(times) / 1e9,
      "gflops_median": 2 * n**3 / statistics.median(times) / 1e9,
    }
  return out


def random_batch(rng, vocab: int, rows: int, seq_len: int, micro: int, loss_fraction: float):
  """Random tokens (BOS first); the loss mask covers the last `loss_fraction` of each row."""
  tokens = rng.integers(3, vocab, size=(rows, seq_len)).astype(np.int32)
  tokens[:, 0] = 2
  first = seq_len - int(round(loss_fraction * (seq_len - 1)))
  mask = np.arange(seq_len) >= first
  return sft.make_batch(
    [(t, mask) for t in tokens], seq_len=seq_len, pad_id=0, micro_batch_size=micro
  )


def _compute_dtype() -> str:
  return compute_paths.resolve()[0] if _COMPUTE.value == "auto" else _COMPUTE.value


def time_steps(config, params, loss_fraction: float, param_count: int, peak_f32: float) -> dict:
  """Compile + first step, then `--steps` timed steps, of full-parameter SFT."""
  rows, seq_len = _BATCH.value, _SEQ.value
  optimizer = train.make_optimizer(
    learning_rate=1e-5, total_steps=1000, warmup_fraction=0.0, max_grad_norm=None
  )
  fwd = policy.ForwardConfig(
    model=config, compute_dtype=_compute_dtype(), remat=_REMAT.value, logprob_chunk=_CHUNK.value
  )
  loss_fn = sft.make_loss_fn(fwd)
  mesh = train.make_mesh()
  step = train.make_train_step(loss_fn, optimizer, mesh, _MICRO.value)
  state = train.place(train.init_train_state(params, optimizer, jax.random.key(0)), mesh)
  rng = np.random.default_rng(3)
  times, losses = [], []
  for _ in range(_STEPS.value + 1):
    batch = random_batch(rng, config.vocab_size, rows, seq_len, _MICRO.value, loss_fraction)
    start = time.perf_counter()
    state, metrics = step(state, None, batch)
    losses.append(float(metrics["loss"]))  # host transfer: the sync point
    times.append(time.perf_counter() - start)
  steady = times[1:]
  flops = 6 * param_count * rows * seq_len
  return {
    "loss_fraction": loss_fraction,
    "loss_tokens_per_step": int(batch["target_mask"].sum()),
    "compile_plus_first_step_s": times[0],
    "steady_step_s": {
      "min": min(steady),
      "median": statistics.median(steady),
      "all": [round(t, 4) for t in steady],
    },
    "tokens_per_s_median": rows * seq_len / statistics.median(steady),
    "useful_gflops_per_s": flops / statistics.median(steady) / 1e9,
    "fraction_of_f32_peak": flops / statistics.median(steady) / 1e9 / peak_f32,
    "loss_history": losses,
    "peak_rss_mib_after": peak_rss_mib(),
  }, state


def main(argv):
  del argv
  result = {
    "library": "rlpost",
    "model": f"{_PRESET.value}, random init",
    "param_dtype": _DTYPE.value,
    "compute_dtype": _compute_dtype(),
    "compute_dtype_setting": _COMPUTE.value,
    "batch": _BATCH.value,
    "seq_len": _SEQ.value,
    "logprob_chunk": _CHUNK.value,
    "remat": _REMAT.value,
    "optimizer": "optax adamw(1e-5) (rlpost.train.step.make_optimizer, no clipping)",
    "loadavg_start": open("/proc/loadavg", encoding="utf-8").read().strip(),
    "devices": [str(d) for d in jax.devices()],
  }
  result["matmul_peak"] = matmul_peak(_MATMUL_N.value)
  peak = result["matmul_peak"]["float32"]["gflops_best"]
  config = families.get_config(_PRESET.value)
  params = decoder.init_params(jax.random.key(0), config, jnp.dtype(_DTYPE.value))
  param_count = sum(x.size for x in jax.tree.leaves(params))
  result["params"] = param_count
  result["rss_mib_after_init"] = peak_rss_mib()
  full, state = time_steps(config, params, 1.0, param_count, peak)
  result["full_mask"] = full
  del state
  params = decoder.init_params(jax.random.key(0), config, jnp.dtype(_DTYPE.value))
  result["half_mask"], _ = time_steps(config, params, 0.5, param_count, peak)
  result["half_over_full_step"] = (
    result["half_mask"]["steady_step_s"]["median"] / full["steady_step_s"]["median"]
  )
  result["peak_rss_mib"] = peak_rss_mib()
  result["peak_device_gib"] = device_memory.peak_device_gib()
  result["loadavg_end"] = open("/proc/loadavg", encoding="utf-8").read().strip()
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  app.run(main)
