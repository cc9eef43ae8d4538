"""A reward model on preference pairs: `--config=experiments/configs/reward_model.py:VARIANT`.

VARIANT:
  gemma3_270m  real Gemma 3 270M trunk with LoRA adapters and a score head; needs
               `--config.data.path=FILE.jsonl` of {"prompt", "chosen", "rejected"[, "system"]}
               records (DPO's format)
  tiny         random tiny model + byte tokenizer on DPO's synthetic pairs (prompt "a+b=",
               chosen the sum, rejected a refusal); all parameters train

The score is a linear head on the trunk's hidden state at the response's last token,
trained with the Bradley-Terry loss; `eval/accuracy` is the held-out pairwise accuracy.
"""

import ml_collections

from experiments.configs import common
from experiments.configs import dpo


def get_config(variant: str = "gemma3_270m") -> ml_collections.ConfigDict:
  tiny = variant == "tiny"
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model = common.model_config(variant)
  c.lora = common.lora_config(enabled=not tiny, rank=16 if tiny else 32)
  c.data = ml_collections.ConfigDict(
    {
      "source": "synthetic" if tiny else "jsonl",  # jsonl | synthetic
      "path": "",  # JSONL of {"prompt", "chosen", "rejected"} records
      "eval_path": "",  # held-out pairs (else the last eval.num_examples pairs of path)
      "num_synthetic": 64,
      "num_examples": 0,
      "seq_len": 32 if tiny else 512,
      "shuffle": True,
      "on_too_long": "skip",  # skip | error: a record whose prompt fills seq_len
    }
  )
  c.train = dpo.train_block(tiny)  # as preference tuning's
  # held-out pairwise accuracy every N steps and at the end (0: never)
  c.eval = ml_collections.ConfigDict(
    {"every": 20 if tiny else 100, "num_examples": 16 if tiny else 100}
  )
  c.mesh = common.mesh_config()
  c.checkpoint = ml_collections.ConfigDict({"every": 20 if tiny else 100, "keep": 3})
  c.lock()
  return c
