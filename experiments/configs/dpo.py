"""DPO, ORPO, SimPO, KTO: `--config=experiments/configs/dpo.py:VARIANT [--config.loss=orpo]`.

VARIANT:
  gemma3_270m  real Gemma 3 270M weights, LoRA; needs `--config.data.path=FILE.jsonl`
               of {"prompt", "chosen", "rejected"[, "system"]} records.
  tiny         random tiny model + byte tokenizer, a synthetic preference set
               (prompt "a+b=", chosen the sum, rejected a refusal); full params.

DPO's reference policy is the base params with adapters off (LoRA) or a copy of the
initial params (`--config.lora.enabled=False`); its logprobs are computed once per
batch outside the train step (KTO, Ethayarajh et al. 2024, uses it too). ORPO (Hong
et al. 2024) and SimPO (Meng et al. 2024) use none.
"""

import ml_collections

from experiments.configs import common


def get_config(variant: str = "gemma3_270m") -> ml_collections.ConfigDict:
  tiny = variant == "tiny"
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model = common.model_config(variant)
  c.lora = common.lora_config(enabled=not tiny, rank=16 if tiny else 32)
  # the preference loss: dpo | orpo | simpo (reference-free: no reference model, no
  # reference pass) | kto (unpaired examples); each reads its own block, under its
  # paper's names
  c.loss = "dpo"
  c.dpo = ml_collections.ConfigDict({"beta": 0.1, "label_smoothing": 0.0})
  c.orpo = ml_collections.ConfigDict({"lam": 0.1})  # lambda: weight of the odds-ratio term
  # beta: reward scale; gamma: target reward margin
  c.simpo = ml_collections.ConfigDict({"beta": 2.0, "gamma": 1.0})
  # KTO (unpaired {"prompt", "completion", "label": bool} records): the value's scale,
  # the weights of desirable and undesirable examples
  c.kto = ml_collections.ConfigDict({"beta": 0.1, "lambda_d": 1.0, "lambda_u": 1.0})
  c.data = ml_collections.ConfigDict(
    {
      "source": "synthetic" if tiny else "jsonl",  # jsonl | synthetic
      "path": "",  # JSONL of {"prompt", "chosen", "rejected"} records (KTO: "completion", "label")
      "num_synthetic": 32,
      "num_examples": 0,  # first N records only (0: all)
      "seq_len": 32 if tiny else 512,
      "shuffle": True,
      # a record whose prompt leaves no room for a response in seq_len: skip (left out,
      # counted in the log) | error (names its file and line)
      "on_too_long": "skip",
    }
  )
  c.train = train_block(tiny)
  c.eval = ml_collections.ConfigDict({"every": 0, "num_examples": 0})  # DPO: training metrics
  c.mesh = common.mesh_config()
  c.checkpoint = ml_collections.ConfigDict({"every": 20 if tiny else 100, "keep": 3})
  c.lock()
  return c


def train_block(tiny: bool) -> ml_collections.ConfigDict:
  """The `train` block of the pair recipes (preference tuning, reward models)."""
  return ml_collections.ConfigDict(
    {
      "steps": 40 if tiny else 300,
      "batch_size": 8 if tiny else 4,  # preference pairs per step
      "micro_batch_size": 4 if tiny else 1,
      "learning_rate": 3e-3 if tiny else 5e-5,
      "warmup_fraction": 0.05,
      "weight_decay": 0.0,
      "adam_b1": 0.9,
      "adam_b2": 0.99,
      "optimizer": "adamw",  # adamw | sgd (plain SGD: its update is the scheduled gradient)
      "max_grad_norm": 1.0,
      "max_bad_steps": 3,  # stop after this many consecutive non-finite steps
      "logprob_chunk": 512,  # tokens per output-projection chunk
      "remat": "dots",  # none | dots | full (activation memory policy)
      # matmul inputs (fp32 accumulation): float32 | bfloat16 | auto (the faster here)
      "compute_dtype": "float32" if tiny else "auto",
      "gather_bucket": 64,
    }
  )
