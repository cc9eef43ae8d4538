r"""Peak memory and speed of chunked `token_logprobs` at Gemma 3 vocab size.

The chunked path runs in a fresh subprocess so that its peak RSS
(`getrusage(RUSAGE_SELF).ru_maxrss`) covers nothing else; the naive path's
logits size `batch * seq * vocab * 4` bytes is computed, not run (8.6 GB at the
default sizes). Prints ONE JSON object:

  python -m experiments.benchmarks.logprobs_memory [--with_grad] [--chunk=256]
"""

import json
import os
import resource
import time

from absl import app
from absl import flags

from experiments.benchmarks import child

_BATCH = flags.DEFINE_integer("batch", 8, "Sequences per call.")
_SEQ = flags.DEFINE_integer("seq", 1024, "Tokens per sequence.")
_VOCAB = flags.DEFINE_integer("vocab", 262_144, "Vocabulary size (Gemma 3).")
_DIM = flags.DEFINE_integer("dim", 640, "Model dim (Gemma 3 270M).")
_CHUNK = flags.DEFINE_integer("chunk", 256, "Tokens per scan step.")
_ITERS = flags.DEFINE_integer("iters", 2, "Timed calls after the first one.")
_DTYPE = flags.DEFINE_enum(
  "dtype", "float32", ["float32", "bfloat16"], "dtype of hidden states and embedding."
)
_WITH_GRAD = flags.DEFINE_bool(
  "with_grad",
  False,
  "Time value_and_grad w.r.t. hidden and embed instead of the forward pass alone.",
)
_WORKER = flags.DEFINE_bool("worker", False, "Internal: run the measurement.")


def _rss_bytes():
  """(current RSS, peak RSS) of this process in bytes (Linux)."""
  with open("/proc/self/statm") as f:
    current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _worker():
  """Builds inputs in place, times the chunked call, prints a JSON line."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from rlpost.ops import logprobs  # pylint: disable=g-import-not-at-top

  batch, seq, vocab, dim = _BATCH.value, _SEQ.value, _VOCAB.value, _DIM.value
  dtype = jnp.dtype(_DTYPE.value)

  @jax.jit
  def make_inputs():
    # Deterministic, fused elementwise fills: no temporaries of input size.
    v_VxD = jax.lax.broadcasted_iota(jnp.float32, (vocab, dim), 0)
    d_VxD = jax.lax.broadcasted_iota(jnp.float32, (vocab, dim), 1)
    embed_VxD = (0.05 * jnp.sin(0.37 * v_VxD + 1.3 * d_VxD)).astype(dtype)
    t_BxTxD = jax.lax.broadcasted_iota(jnp.float32, (batch, seq, dim), 1)
    hidden_BxTxD = jnp.cos(
      0.11 * t_BxTxD + 0.7 * jax.lax.broadcasted_iota(jnp.float32, (batch, seq, dim), 2)
    ).astype(dtype)
    pos_BxT = jax.lax.broadcasted_iota(jnp.int32, (batch, seq), 1)
    row_BxT = jax.lax.broadcasted_iota(jnp.int32, (batch, seq), 0)
    tokens_BxT = (pos_BxT * 7919 + row_BxT) % vocab
    return hidden_BxTxD, embed_VxD, tokens_BxT, jnp.ones((batch, seq), bool)

  inputs = jax.block_until_ready(make_inputs())
  chunk = _CHUNK.value
  if _WITH_GRAD.value:

    def loss(h, e, t, m):
      return jnp.sum(logprobs.token_logprobs(h, e, t, m, chunk=chunk))

    call = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  else:
    call = jax.jit(lambda h, e, t, m: logprobs.token_logprobs(h, e, t, m, chunk=chunk))
  rss_before, peak_before = _rss_bytes()
  start = time.perf_counter()
  jax.block_until_ready(call(*inputs))
  first_s = time.perf_counter() - start
  times = []
  for _ in range(_ITERS.value):
    start = time.perf_counter()
    jax.block_until_ready(call(*inputs))
    times.append(time.perf_counter() - start)
  _, peak = _rss_bytes()
  print(
    json.dumps(
      {
        "rss_before_call_bytes": rss_before,
        "peak_rss_before_call_bytes": peak_before,
        "chunked_peak_rss_bytes": peak,
        "first_call_s": round(first_s, 3),
        "seconds_per_call": round(sum(times) / max(len(times), 1), 3),
        "jax_version": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
      }
    )
  )


def main(argv):
  del argv
  if _WORKER.value:
    _worker()
    return
  passed = [f"--{f.name}={f.value}" for f in (_BATCH, _SEQ, _VOCAB, _DIM, _CHUNK, _ITERS, _DTYPE)]
  passed.append("--with_grad" if _WITH_GRAD.value else "--nowith_grad")
  result = child.run_json("experiments.benchmarks.logprobs_memory", ["--worker", *passed])
  batch, seq, vocab, dim = _BATCH.value, _SEQ.value, _VOCAB.value, _DIM.value
  itemsize = 2 if _DTYPE.value == "bfloat16" else 4
  naive = batch * seq * vocab * 4
  result.update(
    {
      "benchmark": "logprobs_memory",
      "batch": batch,
      "seq": seq,
      "vocab": vocab,
      "dim": dim,
      "chunk": _CHUNK.value,
      "dtype": _DTYPE.value,
      "with_grad": _WITH_GRAD.value,
      "inputs_bytes": (vocab * dim + batch * seq * dim) * itemsize,
      "chunk_logits_bytes": min(_CHUNK.value, batch * seq) * vocab * 4,
      "naive_logits_bytes": naive,
      "naive_logits_gb": round(naive / 1e9, 2),
      "chunked_peak_rss_gb": round(result["chunked_peak_rss_bytes"] / 1e9, 2),
      "chunked_call_extra_gb": round(
        (result["chunked_peak_rss_bytes"] - result["rss_before_call_bytes"]) / 1e9, 2
      ),
      "cpu_count": os.cpu_count(),
    }
  )
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
