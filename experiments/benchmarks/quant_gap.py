r"""How far the sampler's quantized copies move Gemma 3 270M's logprobs (issue 70).

On the reference prompts of `../shared/fixtures/gemma3_270m` (teacher-forced, every
prompt position), for each sampler copy of the packaged GGUF's weights: the mean and
max |logprob - float32 logprob| of the float32 reference engine's top-1 token, and
top-1 agreement with our float32 forward. Copies: "model" (float32, against the
fixtures' HF logprobs too), "int8" (`quant.quantize_for_sampling`, io:8 dots), "nf4"
(`quant4.for_sampling`: NF4 layers, int8 output rows), "gguf4" (the file's Q4 blocks
kept, `load_gguf(packed=True)`, int8 output rows); "nf4_native" and "gguf4_native": those
two laid out for `q4_native` (`for_decode`: the GGUF's other blocks as int8 rows) with
every row through its kernels, activations rounded to int8 per 32 inputs: what the
sampler's decode steps compute. Prints one JSON object.

  python -m experiments.benchmarks.quant_gap [--shared=../shared]
"""

import functools
import json
import pathlib

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from rlpost.models import decoder, families, q4_native, quant, quant4
from rlpost.models.weights import gguf

_SHARED = flags.DEFINE_string("shared", "../shared", "The shared reference data folder.")
_BUCKET = 128  # prompts padded at the end to a multiple of this (one program per bucket)


def _prompts():
  folder = pathlib.Path(_SHARED.value) / "fixtures" / "gemma3_270m"
  ids = [p["id"] for p in json.loads((folder / "manifest.json").read_text())["prompts"]]
  return [dict(np.load(folder / "prompts" / f"{i}.npz")) for i in ids]


def _logprobs_at(params, config, ids, top):
  """Logprobs [T, K] of `top` ids after each prompt position (causal, padded at the end)."""
  T = len(ids)
  S = -(-T // _BUCKET) * _BUCKET
  tokens = jnp.asarray(np.pad(ids, (0, S - T)))[None]
  top = jnp.asarray(np.pad(top, ((0, S - T), (0, 0))))
  return np.asarray(_forward(params, tokens, top, config))[:T]


@jax.jit
def _rows(params, h_NxD, top_NxK):
  logits = decoder.logits_from_hidden(params, h_NxD)
  lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  return jnp.take_along_axis(logits, top_NxK, axis=-1) - lse


@functools.partial(jax.jit, static_argnames=("config",))
def _hidden(params, tokens_1xS, config):
  S = tokens_1xS.shape[1]
  mask = jnp.tril(jnp.ones((S, S), bool))[None]
  positions = jnp.arange(S)[None]
  return decoder.forward(params, tokens_1xS, positions, mask, config=config, return_hidden=True)[0]


def _forward(params, tokens_1xS, top_SxK, config):
  hidden = _hidden(params, tokens_1xS, config)
  S = tokens_1xS.shape[1]
  parts = [_rows(params, hidden[0, a : a + 64], top_SxK[a : a + 64]) for a in range(0, S, 64)]
  return jnp.concatenate(parts)


def main(argv):
  del argv
  prompts = _prompts()
  path = families.packaged_gguf("gemma3_270m")
  loaded, info = gguf.load_gguf(path)
  config = families.config_from_info(info)
  params = jax.device_put(loaded)
  packed = jax.device_put(gguf.load_gguf(path, packed=True)[0])
  copies = {
    "model": params,
    "int8": jax.jit(quant.quantize_for_sampling)(params),
    "nf4": jax.jit(quant4.for_sampling)(params),
    "gguf4": jax.jit(quant4.for_sampling, static_argnums=1)(packed, False),
  }
  if q4_native.available()[0]:
    q4_native.MAX_ROWS = 1 << 30  # every row through the kernels, as a decode step's
    for name in ("nf4", "gguf4"):
      copies[f"{name}_native"] = jax.jit(q4_native.for_decode)(copies[name])
  ref = [p["hf_top_logprobs"] for p in prompts]
  out = {"benchmark": "quant_gap", "positions": int(sum(len(r) for r in ref))}
  base = None
  for name, weights in copies.items():
    lp = [_logprobs_at(weights, config, p["input_ids"], p["hf_top_ids"]) for p in prompts]
    lp = np.concatenate(lp)
    base = lp if base is None else base
    gap = np.abs(lp[:, 0] - base[:, 0])
    out[name] = {
      "mean_abs_dlogprob_vs_float32": float(gap.mean()),
      "max_abs_dlogprob_vs_float32": float(gap.max()),
      "top1_agreement_with_float32": float(np.mean(lp.argmax(-1) == base.argmax(-1))),
      "mean_abs_dlogprob_vs_hf": float(np.abs(lp[:, 0] - np.concatenate(ref)[:, 0]).mean()),
      "weight_bytes_layers": int(
        sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(weights["layers"]))
      ),
    }
  out["loadavg"] = open("/proc/loadavg").read().split()[:3]
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  app.run(main)
