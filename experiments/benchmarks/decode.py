r"""Decode throughput of the sampler on the Gemma 3 270M architecture (random weights).

Prints ONE JSON object:
  ceiling      a jitted step doing only this architecture's weight matmuls at the
               decode batch, each weight read once in the sampler's layout (the
               memory-bandwidth bound of a decode step); scan_ceiling: the same
               matmuls scanned over the stacked weights (the issue's probe)
  batch        B prompts x P tokens, N new tokens: compile seconds, steady tokens/s,
               and tokens/s as a fraction of the ceiling
  single       batch 1, 64-token prompt, 128 new tokens
  prefill      one 512-token prompt: prompt tokens/s

  bandwidth    bytes of weights a decode step reads (layer matrices and the output
               projection in the sampler's copy), memory bandwidth measured by a 1 GiB
               numpy copy (bytes read + written / s), and batch 1's tokens/s as a fraction
               of their quotient (the bandwidth limit)

  python -m experiments.benchmarks.decode --dtype=float32 [--weights=int8|int4]

With --weights=int8 the sampler (batch, single, prefill) reads the int8 copy
(`rlpost.models.quant.quantize_for_sampling`), its dots formed as --int8_paths says
("auto": calibrated on this machine, `compute_paths.resolve_int8`; or LAYOUT:ROWS);
the ceilings stay the float ones. With --weights=int4 it reads `quant4.for_sampling`'s
copy: --int4=nf4, every layer matrix NF4; --int4=gguf, the preset's packaged GGUF loaded
with its Q4_0 / Q4_1 / Q4_K blocks kept (`load_gguf(packed=True)`; other types float32);
the output projection int8 in both.
"""

import dataclasses
import json
import platform
import resource
import time

from absl import app
from absl import flags

from experiments.benchmarks import machine
import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import device_memory
from rlpost import sampling
from rlpost.models import decoder, families
from rlpost.models import q4_native, quant, quant4
from rlpost.models.weights import gguf
from rlpost.train import compute_paths

_PRESET = flags.DEFINE_string("preset", "gemma3_270m", "Model preset.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Param dtype.")
_BATCH = flags.DEFINE_integer("batch", 8, "Prompts in the batched workload.")
_PROMPT = flags.DEFINE_integer("prompt_len", 32, "Prompt tokens (batched workload).")
_NEW = flags.DEFINE_integer("new_tokens", 64, "New tokens (batched workload).")
_WEIGHTS = flags.DEFINE_enum(
  "weights",
  "model",
  ["model", "int8", "int4"],
  "What the sampler reads: the params, or their int8 or 4-bit copy.",
)
_INT4 = flags.DEFINE_enum(
  "int4", "nf4", ["nf4", "gguf"], "With --weights=int4: NF4, or the packaged GGUF's Q4 blocks."
)
_INT4_MATMUL = flags.DEFINE_enum(
  "int4_matmul",
  "xla",
  ["xla", "native"],
  "With --weights=int4: XLA's dequantise-then-dot, or the native kernel (`q4_native`).",
)
_INT8_PATHS = flags.DEFINE_string(
  "int8_paths", "auto", "With --weights=int8: auto (calibrated) or LAYOUT:ROWS, e.g. io:8."
)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions (min and median reported).")


def _timed(fn, repeats):
  """(first-call seconds, [steady seconds]) with block_until_ready as the sync point."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, times


def _ceiling(params, config, batch, repeats):
  """Seconds of one step doing only the weight matmuls, in the sampler's decode layout.

  The layers are unrolled over per-layer weights with q/k/v and gate/up
  concatenated (`decoder.unstack_layers`, prepared outside the timed call), then
  the output embedding in its fastest layout: every weight is read exactly once.
  """
  layers = decoder.unstack_layers(params)["layers"]
  q_dim, mlp = config.num_heads * config.head_dim, config.mlp_dim

  @jax.jit
  def step(layers, embed, x):
    for layer in layers:
      qkv = x @ layer["q+k+v"]
      gate_up = x @ layer["gate+up"]
      x = x + qkv[:, :q_dim] @ layer["o"] + qkv[:, q_dim:].sum()
      x = (x + (gate_up[:, :mlp] * gate_up[:, mlp:]) @ layer["down"]).astype(x.dtype)
    return jnp.einsum("vd,bd->vb", embed, x)  # the faster layout on XLA:CPU

  x = jnp.ones((batch, params["embed"].shape[1]), params["embed"].dtype)
  _, times = _timed(lambda: step(layers, params["embed"], x), repeats + 2)
  return min(times)


def _scan_ceiling(params, batch, repeats):
  """The same matmuls over the stacked [L, ...] weights under `lax.scan`.

  This is the probe the decode issue quotes (~87 ms at batch 8 on the CI
  machine): the scan slices each weight out of its stack, a copy per layer and
  step, so it is slower than `_ceiling`; reported for comparison only.
  """

  @jax.jit
  def step(params, x):
    def body(x, layer):
      h = x @ layer["q"] @ layer["o"] + (x @ layer["k"]).sum() + (x @ layer["v"]).sum()
      return (h + (x @ layer["gate"] * (x @ layer["up"])) @ layer["down"]).astype(x.dtype), None

    x, _ = jax.lax.scan(body, x, params["layers"])
    return jnp.einsum("vd,bd->vb", params["embed"], x)

  x = jnp.ones((batch, params["embed"].shape[1]), params["embed"].dtype)
  _, times = _timed(lambda: step(params, x), repeats + 2)
  return min(times)


def _bandwidth_gb_s(repeats: int = 3) -> float:
  """GB/s of a 1 GiB numpy copy, counting the bytes read and written (best of `repeats`)."""
  src = np.ones(1 << 28, np.float32)
  dst = np.empty_like(src)
  best = min(_timed(lambda: np.copyto(dst, src), repeats)[1])
  return 2 * src.nbytes / best / 1e9


def _bytes_per_token(sampled) -> int:
  """Bytes of the weights one decode step reads: the layer matrices and norms, and the
  output projection ("unembed" when there is one; the input rows are a few)."""
  nbytes = lambda tree: sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(tree))
  output = sampled.get("unembed", sampled.get("output", sampled["embed"]))
  return nbytes(sampled["layers"]) + nbytes(output) + nbytes(sampled["final_norm"])


def _sampler_weights(config, dtype, int8_paths):
  """(float params for the ceilings, what the sampler reads)."""
  if _WEIGHTS.value == "int4" and _INT4.value == "gguf":
    loaded, _ = gguf.load_gguf(families.packaged_gguf(_PRESET.value), packed=True)
    params = jax.device_put(loaded)
    return quant4.dequantized(params), jax.jit(quant4.for_sampling, static_argnums=1)(params, False)
  params = decoder.init_params(jax.random.key(0), config, dtype)
  if _WEIGHTS.value == "int4":
    return params, jax.jit(quant4.for_sampling)(params)
  if int8_paths is not None:
    quantize = jax.jit(quant.quantize_for_sampling, static_argnames=("paths",))
    return params, quantize(params, paths=int8_paths)
  return params, params


def _decode(params, config, batch, prompt_len, new_tokens, repeats):
  sc = sampling.SamplingConfig(
    temperature=1.0, max_new_tokens=new_tokens, stop_ids=(), prompt_bucket=prompt_len
  )
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(3, config.vocab_size, (batch, prompt_len)), jnp.int32)
  lengths = jnp.full((batch,), prompt_len, jnp.int32)
  run = lambda: sampling.sample(
    params, tokens, lengths, jax.random.key(0), model_config=config, config=sc
  )
  first, times = _timed(run, repeats)
  out = run()
  assert int(out.lengths.min()) == new_tokens, "every row must generate all tokens"
  # Prefill time of this workload, to report decode-only throughput too.
  pre = jax.jit(
    lambda p, t, l: sampling.prefill(
      p, t, l, model_config=config, cache_size=prompt_len + new_tokens
    )[0]
  )
  _, pre_times = _timed(lambda: pre(params, tokens, lengths), repeats)
  steady = min(times)
  generated = batch * new_tokens
  return {
    "batch": batch,
    "prompt_len": prompt_len,
    "new_tokens": new_tokens,
    "compile_plus_first_run_s": round(first, 3),
    "steady_s_min": round(steady, 4),
    "steady_s_median": round(float(np.median(times)), 4),
    "tokens_per_s": round(generated / steady, 2),
    "decode_only_tokens_per_s": round(generated / max(steady - min(pre_times), 1e-9), 2),
    "decode_step_ms": round(1000 * (steady - min(pre_times)) / new_tokens, 2),
  }


def main(argv):
  del argv
  config = families.get_config(_PRESET.value)
  dtype = jnp.dtype(_DTYPE.value)
  # Calibrated before the weights exist: their (asynchronous) initialization would run
  # beside the probes and skew them.
  int8_paths = compute_paths.int8_paths(_INT8_PATHS.value)[0] if _WEIGHTS.value == "int8" else None
  params, sampled = _sampler_weights(config, dtype, int8_paths)
  if _WEIGHTS.value == "int4" and _INT4_MATMUL.value == "native":
    sampled = jax.jit(q4_native.for_decode)(sampled)
  load_before = open("/proc/loadavg").read().split()[:3]
  ceiling_s = _ceiling(params, config, _BATCH.value, _REPEATS.value)
  batched = _decode(sampled, config, _BATCH.value, _PROMPT.value, _NEW.value, _REPEATS.value)
  batched["ceiling_step_ms"] = round(1000 * ceiling_s, 2)
  batched["ceiling_tokens_per_s"] = round(_BATCH.value / ceiling_s, 2)
  batched["fraction_of_ceiling"] = round(
    batched["tokens_per_s"] / batched["ceiling_tokens_per_s"], 3
  )
  batched["decode_only_fraction_of_ceiling"] = round(
    batched["decode_only_tokens_per_s"] / batched["ceiling_tokens_per_s"], 3
  )
  scan_s = _scan_ceiling(params, _BATCH.value, _REPEATS.value)
  batched["scan_ceiling_step_ms"] = round(1000 * scan_s, 2)
  batched["fraction_of_scan_ceiling"] = round(batched["tokens_per_s"] * scan_s / _BATCH.value, 3)
  single = _decode(sampled, config, 1, 64, 128, _REPEATS.value)
  single["ceiling_tokens_per_s"] = round(1 / _ceiling(params, config, 1, _REPEATS.value), 2)
  pre = jax.jit(lambda p, t, l: sampling.prefill(p, t, l, model_config=config, cache_size=513)[0])
  tokens = jnp.asarray(np.random.default_rng(1).integers(3, config.vocab_size, (1, 512)), jnp.int32)
  pre_first, pre_times = _timed(
    lambda: pre(sampled, tokens, jnp.array([512], jnp.int32)), _REPEATS.value
  )
  bandwidth = {"weight_bytes_per_token": _bytes_per_token(sampled)}
  bandwidth["memory_gb_s"] = round(_bandwidth_gb_s(), 2)
  limit = bandwidth["memory_gb_s"] * 1e9 / bandwidth["weight_bytes_per_token"]
  bandwidth["limit_tokens_per_s"] = round(limit, 1)
  bandwidth["single_stream_fraction_of_limit"] = round(single["tokens_per_s"] / limit, 3)
  print(
    json.dumps(
      {
        "benchmark": "decode",
        "preset": _PRESET.value,
        "param_dtype": _DTYPE.value,
        "sampler_weights": _WEIGHTS.value,
        "int8_paths": None if int8_paths is None else dataclasses.asdict(int8_paths),
        "int4": _INT4.value if _WEIGHTS.value == "int4" else None,
        "int4_matmul": _INT4_MATMUL.value if _WEIGHTS.value == "int4" else None,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "machine": platform.processor() or platform.machine(),
        "cpu": machine.cpu_model(),
        "loadavg_before": load_before,
        "loadavg_after": open("/proc/loadavg").read().split()[:3],
        "batched": batched,
        "single_stream": single,
        "bandwidth": bandwidth,
        "prefill_512": {
          "compile_plus_first_run_s": round(pre_first, 3),
          "tokens_per_s": round(512 / min(pre_times), 1),
        },
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "peak_device_gib": device_memory.peak_device_gib(),
      },
      indent=1,
    )
  )


if __name__ == "__main__":
  app.run(main)
