"""Sampling from a model: `--config=experiments/configs/sample.py:gemma3_270m` (or `:tiny`)."""

import ml_collections

from experiments.configs import common


def get_config(variant: str = "gemma3_270m") -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.model = common.model_config(variant)
  config.sampling = ml_collections.ConfigDict(
    {
      "temperature": 0.0,  # 0 = greedy
      "top_k": 0,  # 0 = no top-k
      "top_p": 1.0,
      "max_new_tokens": 48,
      "prompt_bucket": 32,
      "stop_at_eos": True,  # stop at <eos> and <end_of_turn>
    }
  )
  config.num_samples = 1  # completions per prompt (prefilled once, shared cache)
  config.chat = False  # wrap each prompt in the model's chat format (one user turn)
  config.prompts = ("The capital of France is", "def fibonacci(n):")
  config.prompt_file = ""  # one prompt per line; replaces `prompts` when set
  config.lock()
  return config
