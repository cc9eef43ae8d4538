"""Supervised fine-tuning: `--config=experiments/configs/sft.py:VARIANT`.

VARIANT:
  gemma3_270m  real Gemma 3 270M weights, GSM8K train as the SFT set (reasoning/answer
               format, rlpost.data.chat.gsm8k_sft_records), GSM8K test for eval; LoRA.
  tiny         random tiny model + byte tokenizer, synthetic "a+b=" records; full params.

Data: `--config.data.source=jsonl --config.data.path=FILE.jsonl` trains on a JSONL of
{"messages": [...]} or {"prompt", "completion"[, "system"]} records (the loss is
taken on assistant tokens only); records in the OpenAI message shape, with `tool_calls`,
`tool` messages and `tools`, are laid out by the model's chat template (`data.layout`,
`model.chat_template`) and trained on the assistant spans; `data.eval_path` gives a
held-out file, else the last `eval.num_examples` records are held out.
`data.source=gsm8k_tools --config.tools.format=native` writes the calculator traces as such
conversations, the calls in the template's own format. `--config.lora.enabled=False` trains
all parameters.
"""

import ml_collections

from experiments.configs import common


def get_config(variant: str = "gemma3_270m") -> ml_collections.ConfigDict:
  tiny = variant == "tiny"
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model = common.model_config(variant)
  c.lora = common.lora_config(enabled=not tiny, rank=16 if tiny else 32)
  c.data = ml_collections.ConfigDict(
    {
      "source": "synthetic" if tiny else "gsm8k",  # gsm8k | gsm8k_tools | jsonl | synthetic
      "path": "",  # JSONL of SFT records (data.source=jsonl)
      "eval_path": "",  # optional held-out JSONL (else the last records)
      "data_dir": "",  # GSM8K jsonl dir; "" = Hugging Face hub
      "num_synthetic": 64,  # records of the synthetic set
      "num_examples": 0,  # train on the first N records only (0: all)
      # how conversations are laid out: template (the model's chat template: model.chat_template,
      # else the model file's) | chat (the family's hand-written format) | auto (template when
      # the run has one, else chat). Tool calls and tool messages need the template.
      "layout": "auto",
      "seq_len": 48 if tiny else 384,
      "pack": False,  # first-fit pack several examples per row
      "shuffle": True,
      # a record whose prompt leaves no room for a response in seq_len: skip (left out,
      # counted in the log) | error (names its file and line)
      "on_too_long": "skip",
    }
  )
  # data.source=gsm8k_tools: the calculator calls' syntax, library (<tool>calculator: ...</tool>
  # in the plain scaffold) | native (the model's chat template's format) | a format by name
  c.tools = ml_collections.ConfigDict({"format": "library"})
  c.train = ml_collections.ConfigDict(
    {
      "steps": 60 if tiny else 500,
      "batch_size": 8 if tiny else 4,  # rows per step (packed rows hold several examples)
      "micro_batch_size": 4 if tiny else 2,
      "learning_rate": 3e-3 if tiny else 1e-4,
      "warmup_fraction": 0.05,
      "weight_decay": 0.0,
      "adam_b1": 0.9,
      "adam_b2": 0.99,
      "optimizer": "adamw",  # adamw | sgd (plain SGD: its update is the scheduled gradient)
      "max_grad_norm": 1.0,  # 0: no clipping
      "max_bad_steps": 3,  # stop after this many consecutive non-finite steps
      "logprob_chunk": 512,  # tokens per output-projection chunk
      "remat": "dots",  # none | dots | full (activation memory policy)
      # matmul inputs (fp32 accumulation): float32 | bfloat16 | auto (the faster here)
      "compute_dtype": "float32" if tiny else "auto",
      "gather_bucket": 64,  # loss-token gather size is a multiple of this
    }
  )
  c.eval = ml_collections.ConfigDict(
    {
      "every": 20 if tiny else 100,  # 0: never
      "num_examples": 16 if tiny else 64,
    }
  )
  c.mesh = common.mesh_config()
  c.checkpoint = ml_collections.ConfigDict({"every": 20 if tiny else 100, "keep": 3})
  c.lock()
  return c
