r"""Each preference loss (DPO, ORPO, SimPO, KTO) and a reward model, trained side by side
from one base: held-out preference accuracy before and after, and each run's peak RSS
(a fresh process per run, so the figure covers that run alone: a reference-free loss
holds no reference copy). Prints ONE JSON object:

  python -m experiments.benchmarks.preference_losses                      # tiny, synthetic pairs
  python -m experiments.benchmarks.preference_losses --variant=gemma3_270m \
      --data=pairs.jsonl --steps=20 --lora=False                           # full-parameter

Held-out accuracy: the fraction of held-out pairs (`--eval_pairs`, never trained on; the
tiny variant's synthetic pairs of another seed, else the last pairs of `--data`) whose
chosen answer the trained policy prefers over the rejected one more than the base does
(log-likelihood margin, per token for ORPO/SimPO, summed for DPO/KTO, as each loss
measures it); for the reward model, its pairwise accuracy.
"""

import json
import os
import resource
import tempfile

from absl import app
from absl import flags
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import child

LOSSES = ("dpo", "orpo", "simpo", "kto", "reward_model")
_VARIANT = flags.DEFINE_string("variant", "tiny", "Config variant of configs/dpo.py.")
_DATA = flags.DEFINE_string("data", "", "JSONL pairs (empty: the tiny synthetic pairs).")
_STEPS = flags.DEFINE_integer("steps", 40, "Optimizer steps per run.")
_LORA = flags.DEFINE_bool("lora", False, "LoRA (True) or all parameters (False).")
_EVAL_PAIRS = flags.DEFINE_integer("eval_pairs", 32, "Held-out pairs.")
_WORKER = flags.DEFINE_string("worker", "", "Internal: run this loss and print its JSON.")


def _configs(loss: str, workdir: str):
  from experiments.configs import dpo as dpo_configs  # pylint: disable=g-import-not-at-top
  from experiments.configs import reward_model as rm_configs  # pylint: disable=g-import-not-at-top

  cfg = (rm_configs if loss == "reward_model" else dpo_configs).get_config(_VARIANT.value)
  if loss != "reward_model":
    cfg.loss = loss
  cfg.train.steps, cfg.lora.enabled = _STEPS.value, _LORA.value
  cfg.checkpoint.every = 10**9
  if _DATA.value:
    cfg.data.source = "jsonl"
    cfg.data.path = train_file(_DATA.value, _EVAL_PAIRS.value, loss == "kto", workdir)
  return cfg


def train_file(data: str, held_out: int, kto: bool, workdir: str) -> str:
  """The pairs of `data` less its last `held_out` ones, written to `workdir`; `kto`:
  unpaired (`dpo.unpaired`), as `dpo.synthetic_kto` does for the synthetic pairs."""
  from rlpost.data import chat  # pylint: disable=g-import-not-at-top
  from rlpost.supervised import dpo  # pylint: disable=g-import-not-at-top

  pairs = chat.load_dpo_jsonl(data)
  if len(pairs) <= held_out:
    raise ValueError(
      f"--data: {len(pairs)} pairs leave none to train on after the last --eval_pairs="
      f"{held_out} held out; give more pairs or a smaller --eval_pairs"
    )
  records = pairs[: len(pairs) - held_out]
  if kto:
    records = dpo.unpaired(records)
  path = os.path.join(workdir, "train.jsonl")
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  return path


def _pairs(cfg, tokenizer):
  """The held-out pairs, tokenized: the last `--eval_pairs` of `--data`, or synthetic pairs
  of another seed."""
  from rlpost.data import chat  # pylint: disable=g-import-not-at-top
  from rlpost.supervised import dpo  # pylint: disable=g-import-not-at-top

  n = _EVAL_PAIRS.value
  if _DATA.value:
    records = chat.load_dpo_jsonl(_DATA.value)[-n:]
  else:
    records = dpo.synthetic_pairs(n, cfg.seed + 1)
  return dpo.tokenize_pairs(records, tokenizer, cfg.data.seq_len)


def _margins(params, adapters, batch, fwd, per_token: bool) -> np.ndarray:
  from rlpost.supervised import sft  # pylint: disable=g-import-not-at-top

  out = {}
  for half in ("chosen", "rejected"):
    logp = sft.target_logprobs(params, adapters, batch[half], fwd)
    mask = batch[half]["target_mask"]
    total = jnp.sum(jnp.where(mask, logp, 0.0), -1)
    out[half] = total / mask.sum(-1) if per_token else total
  return np.asarray(out["chosen"] - out["rejected"])


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(loss: str) -> dict:
  """Trains with `loss` (its peak RSS read right after, before anything else loads), then
  compares the held-out margins of the trained policy with the base's."""
  from rlpost.models import policy  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import common  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import dpo as dpo_recipe  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import reward_model as rm_recipe  # pylint: disable=g-import-not-at-top
  from rlpost.supervised import dpo  # pylint: disable=g-import-not-at-top

  workdir = tempfile.mkdtemp()
  cfg = _configs(loss, workdir)
  if loss == "reward_model":
    _, record = rm_recipe.run(cfg, workdir)
    return {
      "loss": loss,
      "held_out_accuracy": record.get("eval/accuracy"),
      "peak_rss_mb": _peak_rss_mb(),
    }
  fwd = dpo_recipe.check_config(cfg)[0]
  state, record = dpo_recipe.run(cfg, workdir)
  peak = _peak_rss_mb()
  _, base, tokenizer = common.load_model(cfg)
  pairs = _pairs(cfg, tokenizer)
  batch = dpo.make_pair_batch(
    pairs, seq_len=cfg.data.seq_len, pad_id=tokenizer.pad_id, micro_batch_size=len(pairs)
  )
  per_token = loss in ("orpo", "simpo")
  before = _margins(base, None, batch, fwd, per_token)
  after = _margins(*policy.policy_params(state.trainable, base, fwd), batch, fwd, per_token)
  return {
    "loss": loss,
    "held_out_accuracy": float(np.mean(after > before)),
    "held_out_margin_before": float(before.mean()),
    "held_out_margin_after": float(after.mean()),
    "final_train_loss": record["loss"],
    "peak_rss_mb": peak,
  }


def main(argv):
  del argv
  if _WORKER.value:
    print(json.dumps(_worker(_WORKER.value)))
    return
  args = [f"--{f.name}={f.value}" for f in (_VARIANT, _DATA, _STEPS, _LORA, _EVAL_PAIRS)]
  module = "experiments.benchmarks.preference_losses"
  runs = [child.run_json(module, [*args, f"--worker={loss}"]) for loss in LOSSES]
  print(
    json.dumps(
      {"variant": _VARIANT.value, "steps": _STEPS.value, "lora": _LORA.value, "runs": runs}
    )
  )


if __name__ == "__main__":
  app.run(main)
