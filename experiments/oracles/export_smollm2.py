"""Our half of the export check (issue 37, deliverable 7): SmolLM2-135M with LoRA
adapters merged, written as a Hugging Face directory, and our logits on a few prompts.

Loads the packaged SmolLM2 GGUF, draws rank-8 adapters on every projection with B != 0
(a trained adapter's shape and scale: B ~ N(0, 0.02)), merges them
(`lora.merge`), writes `OUT/model` with `export_hf_checkpoint` and our float32 logits of
the prompts to `OUT/ours.npz`. `hf_export_check.py` (torch + transformers) loads the
directory and compares.

usage: python -m experiments.oracles.export_smollm2 OUT_DIR
"""

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.models import decoder, lora, loading
from rlpost.models.weights import safetensors
from rlpost.ops.masks import causal_attention_mask
from rlpost.text import chat_formats

PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "What is 2+2?"]


def main():
  out = pathlib.Path(sys.argv[1])
  config, params, tok = loading.load_model("smollm2_135m", "gguf")
  lcfg = lora.LoraConfig(rank=8, alpha=16.0)
  fresh = lora.init_adapters(jax.random.key(0), params, lcfg)["layers"]
  keys = jax.random.split(jax.random.key(1), len(fresh))
  adapters = {
    "layers": {
      name: {"a": ab["a"], "b": 0.02 * jax.random.normal(k, ab["b"].shape)}
      for k, (name, ab) in zip(keys, fresh.items())
    }
  }
  merged = lora.merge(params, adapters, lcfg)
  safetensors.export_hf_checkpoint(
    merged, config, out / "model", bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id
  )
  ids = [tok.encode(PROMPTS[0]), tok.encode(PROMPTS[1])]
  ids.append(chat_formats.conversation_ids(tok, [{"role": "user", "content": PROMPTS[2]}]))
  arrays = {}
  for k, row in enumerate(ids):
    T = len(row)
    logits, _ = decoder.forward(
      merged,
      jnp.asarray([row]),
      jnp.arange(T)[None],
      causal_attention_mask(jnp.ones((1, T), bool)),
      config=config,
    )
    arrays[f"ids_{k}"] = np.asarray(row, np.int32)
    arrays[f"logits_{k}"] = np.asarray(logits[0], np.float32)
  np.savez_compressed(out / "ours.npz", **arrays)
  print(f"wrote {out / 'model'} and {out / 'ours.npz'}")


if __name__ == "__main__":
  main()
