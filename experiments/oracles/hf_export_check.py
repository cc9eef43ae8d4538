"""transformers' half of the export check (issue 37, deliverable 7): loads the directory
`export_smollm2.py` wrote with `AutoModelForCausalLM` (float32, eager attention) and
compares its logprobs with ours. Prints JSON: per prompt the largest |logprob difference|
over the whole vocabulary at every position, and whether the argmax tokens agree.

usage: python hf_export_check.py OUT_DIR   (torch + transformers environment)
"""

import json
import pathlib
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def _logprobs(logits):
  logits = logits.astype(np.float64)
  top = logits.max(-1, keepdims=True)
  return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def main():
  out = pathlib.Path(sys.argv[1])
  model = AutoModelForCausalLM.from_pretrained(
    out / "model", dtype=torch.float32, attn_implementation="eager"
  ).train(False)
  ours = np.load(out / "ours.npz")
  report = {"model_class": type(model).__name__, "prompts": []}
  k = 0
  while f"ids_{k}" in ours:
    ids = ours[f"ids_{k}"]
    with torch.no_grad():
      theirs = model(torch.tensor(ids[None].astype(np.int64))).logits[0].numpy()
    a, b = _logprobs(ours[f"logits_{k}"]), _logprobs(theirs)
    report["prompts"].append(
      {
        "tokens": int(len(ids)),
        "max_abs_logprob_diff": float(np.abs(a - b).max()),
        "argmax_agree": bool((a.argmax(-1) == b.argmax(-1)).all()),
      }
    )
    k += 1
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
