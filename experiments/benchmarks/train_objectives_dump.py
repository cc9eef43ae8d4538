r"""rlpost's side of the independent SFT / DPO objective check (figures in
experiments/benchmarks/results/transformers_oracle.md): losses and full-parameter gradients
of the real model on GSM8K.

  python -m experiments.benchmarks.train_objectives_dump --out=/tmp/oracle/train_check \
      --data_dir=/path/to/gsm8k [--what=sft,dpo]

Needs the real Gemma 3 270M (the packaged GGUF) and GSM8K `train.jsonl`; no torch.
SFT: the first 4 training problems through the recipe's data path
(`recipes.sft.tokenized_examples`, `sft.next_examples`, `recipes.sft.local_batch`),
packed first fit into 2 rows of 512 (2 documents per row), micro-batches of 1 row.
DPO: 4 pairs (system prompt + question; chosen its worked solution, rejected the next
problem's), `chat.tokenize_dpo`, `dpo.make_pair_batch`, reference logprobs from
`dpo.make_reference_fn` on the loaded weights, the policy = those weights with every
norm weight moved by N(0, 0.02^2) (so margins are not 0), beta 0.1, label smoothing 0
and 0.2, micro-batches of 2 pairs. Both full-parameter, float32, the configs' remat and
chunk. Loss and gradient are the mean over micro-batches of the recipe's `loss_fn`
value and gradient (what `make_train_step` forms); one jitted train step (SGD, rate 1,
no clipping) reports its own loss and grad_norm, and its update of two leaves is kept.

Writes, under --out: `{sft,dpo}_batch.npz` (the batch arrays; DPO also the policy's
norm weights), `{sft,dpo}_grads.npz` (every gradient leaf, "/"-joined paths; DPO under
"ls0.0/" and "ls0.2/") and `{sft,dpo}_meta.json`; prints ONE JSON object of the
figures. An oracle reads these files; experiments/oracles/hf_train_objectives.py runs
transformers.
"""

import json
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import dpo as dpo_configs
from experiments.configs import sft as sft_configs
from rlpost.data import chat
from rlpost.data import cursor as cursor_lib
from rlpost.data import gsm8k
from rlpost.recipes import common
from rlpost.recipes import dpo as dpo_recipe
from rlpost.recipes import sft as sft_recipe
from rlpost.supervised import dpo
from rlpost.supervised import sft
from rlpost.train import step as step_lib

_OUT = flags.DEFINE_string("out", "/tmp/oracle/train_check", "Output directory.")
_DATA = flags.DEFINE_string("data_dir", "", "GSM8K jsonl directory ('': Hugging Face hub).")
_WHAT = flags.DEFINE_list("what", ["sft", "dpo"], "Which objectives: sft, dpo.")
NORMS = ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm", "q_norm", "k_norm")
UPDATED = ("final_norm", "layers/post_mlp_norm")  # leaves whose SGD update is kept


def flat(tree, prefix: str = "") -> dict[str, np.ndarray]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flat(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = np.asarray(v)
  return out


def rows(tree, start: int, stop: int):
  return jax.tree.map(lambda x: x[start:stop], tree)


def mean_value_and_grad(loss_fn, trainable, batch, micro: int):
  """(loss, float64 gradient pytree): means over micro-batches of `micro` rows."""
  num_rows = jax.tree.leaves(batch)[0].shape[0]
  vg = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
  n, loss, grads = num_rows // micro, 0.0, None
  for i in range(n):
    (value, _), g = vg(trainable, None, rows(batch, i * micro, (i + 1) * micro))
    g = jax.tree.map(lambda x: np.asarray(x, np.float64) / n, g)
    loss, grads = loss + float(value) / n, g if grads is None else jax.tree.map(np.add, grads, g)
  return loss, grads


def sgd_step(cfg, loss_fn, trainable, batch):
  """One jitted train step, SGD at rate 1, no clipping: (metrics, -update of UPDATED)."""
  t = cfg.train
  t.optimizer, t.learning_rate, t.warmup_fraction, t.max_grad_norm = "sgd", 1.0, 0.0, 0.0
  optimizer, mesh = common.make_optimizer(cfg, 1), common.make_mesh(cfg)
  before = {k: np.asarray(v, np.float64) for k, v in flat(trainable).items() if k in UPDATED}
  state = step_lib.place(step_lib.init_train_state(trainable, optimizer, jax.random.key(0)), mesh)
  step = step_lib.make_train_step(loss_fn, optimizer, mesh, t.micro_batch_size)
  state, metrics = step(state, None, batch)  # donates `trainable`
  after = flat(state.trainable)
  update = {f"update/{k}": before[k] - after[k] for k in UPDATED}
  return {k: float(v) for k, v in jax.device_get(metrics).items()}, update


def save(name: str, arrays: dict, grads: dict, meta: dict) -> None:
  np.savez(os.path.join(_OUT.value, f"{name}_batch.npz"), **arrays)
  np.savez(os.path.join(_OUT.value, f"{name}_grads.npz"), **flat(grads))
  with open(os.path.join(_OUT.value, f"{name}_meta.json"), "w") as f:
    json.dump(meta, f, indent=1)


def run_sft() -> dict:
  cfg = sft_configs.get_config("gemma3_270m")
  cfg.data.data_dir, cfg.data.num_examples, cfg.eval.num_examples = _DATA.value, 4, 0
  cfg.data.pack, cfg.data.seq_len, cfg.data.shuffle = True, 512, False
  cfg.lora.enabled, cfg.train.compute_dtype = False, "float32"
  cfg.train.batch_size, cfg.train.micro_batch_size = 2, 1
  fwd, t = sft_recipe.check_config(cfg), cfg.train
  _, params, tokenizer = common.load_model(cfg)
  examples, _ = sft_recipe.tokenized_examples(cfg, tokenizer)
  indices, _ = sft.next_examples(
    cursor_lib.Cursor(cfg.seed),
    [len(e[0]) for e in examples],
    rows=t.batch_size,
    seq_len=cfg.data.seq_len,
    pack=True,
    shuffle=False,
  )
  args = {"seq_len": cfg.data.seq_len, "pad_id": tokenizer.pad_id, "gather_bucket": t.gather_bucket}
  batch, stats = sft_recipe.local_batch(t, True, [examples[i] for i in indices], args)
  loss_fn = sft.make_loss_fn(fwd)
  loss, grads = mean_value_and_grad(loss_fn, params, batch, t.micro_batch_size)
  metrics, update = sgd_step(cfg, loss_fn, params, batch)
  keep = ("tokens", "loss_mask", "positions", "segment_ids", "targets", "target_mask")
  meta = {"loss": loss, "step_metrics": metrics, "stats": stats, "indices": indices}
  save("sft", {**{k: np.asarray(batch[k]) for k in keep}, **update}, grads, meta)
  return meta


def gsm8k_pairs(n: int) -> list[dict[str, str]]:
  problems = gsm8k.load_gsm8k("train", _DATA.value)[:n]
  return [
    {
      "system": gsm8k.SYSTEM_PROMPT,
      "prompt": p.question,
      "chosen": gsm8k.sft_completion(p),
      "rejected": gsm8k.sft_completion(problems[(i + 1) % n]),
    }
    for i, p in enumerate(problems)
  ]


def perturbed_norms(params, seed: int = 0, scale: float = 0.02):
  """`params` with every norm weight moved by N(0, scale^2) (a new tree; matrices shared)."""
  rng = np.random.default_rng(seed)
  noise = lambda x: x + jnp.asarray(rng.normal(0, scale, x.shape), x.dtype)
  layers = {**params["layers"], **{k: noise(params["layers"][k]) for k in NORMS}}
  return {**params, "final_norm": noise(params["final_norm"]), "layers": layers}


def run_dpo() -> dict:
  cfg = dpo_configs.get_config("gemma3_270m")
  cfg.data.source = "synthetic"  # only to pass check_config: the pairs are gsm8k_pairs
  cfg.lora.enabled, cfg.train.compute_dtype = False, "float32"
  cfg.train.batch_size, cfg.train.micro_batch_size = 4, 2
  fwd, _, dcfg = dpo_recipe.check_config(cfg)
  m = cfg.train.micro_batch_size
  _, reference, tokenizer = common.load_model(cfg)
  pairs = [chat.tokenize_dpo(r, tokenizer, cfg.data.seq_len) for r in gsm8k_pairs(4)]
  batch = dpo.make_pair_batch(
    pairs,
    seq_len=cfg.data.seq_len,
    pad_id=tokenizer.pad_id,
    micro_batch_size=m,
    gather_bucket=cfg.train.gather_bucket,
  )
  batch = dpo.make_reference_fn(fwd, m)(reference, batch)
  policy = perturbed_norms(reference)
  seq_fn = jax.jit(dpo._sequence_logprobs, static_argnums=3)
  seq = {  # per micro-batch: the gather layout is laid out per micro-batch of m rows
    half: np.concatenate(
      [
        np.asarray(seq_fn(policy, None, rows(batch[half], i, i + m), fwd))
        for i in range(0, len(pairs), m)
      ]
    ).tolist()
    for half in ("chosen", "rejected")
  }
  meta = {"beta": dcfg.beta, "policy_seq": seq}
  for half in ("chosen", "rejected"):
    meta[f"ref_{half}"] = np.asarray(batch[f"ref_{half}"]).tolist()
  arrays, grads = {}, {}
  for ls in (0.0, 0.2):
    loss_fn = dpo.make_loss_fn(fwd, beta=dcfg.beta, label_smoothing=ls)
    meta[f"loss_ls{ls}"], grads[f"ls{ls}"] = mean_value_and_grad(loss_fn, policy, batch, m)
  for half in ("chosen", "rejected"):
    for k in ("tokens", "loss_mask", "positions", "segment_ids", "target_mask"):
      arrays[f"{half}/{k}"] = np.asarray(batch[half][k])
  arrays.update({f"policy/{k}": v for k, v in flat(policy).items() if "norm" in k})
  loss_fn = dpo.make_loss_fn(fwd, beta=dcfg.beta, label_smoothing=0.2)
  meta["step_metrics_ls0.2"], update = sgd_step(cfg, loss_fn, policy, batch)
  save("dpo", {**arrays, **update}, grads, meta)
  return meta


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  runs = {"sft": run_sft, "dpo": run_dpo}
  print(json.dumps({what: runs[what]() for what in _WHAT.value}, indent=1))


if __name__ == "__main__":
  app.run(main)
