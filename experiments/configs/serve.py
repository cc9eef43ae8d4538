"""Serving a policy over an OpenAI-compatible endpoint (rlpost.serve):

  python -m experiments.serve --config=experiments/configs/serve.py:tiny --config.port=8000
  python -m experiments.serve --config=experiments/configs/serve.py:gemma3_270m \\
      --config.model.init_from=/tmp/grpo_run      # a run's newest weights

Variants: tiny (random weights, byte tokenizer), gemma3_270m, smollm2 (SmolLM2-135M).
Conversations are laid out by the model file's chat template (or
`--config.model.chat_template=FILE`), else by the family's hand-written layout.
"""

import ml_collections

from experiments.configs import common

PRESETS = {"tiny": "tiny", "gemma3_270m": "gemma3_270m", "smollm2": "smollm2_135m"}


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
  if variant not in PRESETS:
    raise ValueError(f"Unknown config variant {variant!r}; valid variants: {sorted(PRESETS)}")
  config = ml_collections.ConfigDict()
  config.seed = 0  # random weights (tiny) are drawn with it
  config.model = common.model_config(PRESETS[variant])
  config.model_name = ""  # what clients send as `model` ("": the preset's name)
  # how completions' tool calls are read: native (the chat template's own format; the
  # library's <tool>NAME: ARG</tool> without a template or tool section) or a format name
  config.tool_format = "native"
  config.host = "127.0.0.1"  # a non-loopback host needs allow_remote=True
  config.port = 8000
  config.api_key = ""  # "": no key checked; else clients send Authorization: Bearer KEY
  config.allow_remote = False
  config.context = 4096  # prompt + completion tokens, at most (capped at the preset's context)
  config.max_tokens = 512  # new tokens per choice: the cap and the default
  config.max_batch = 32  # row slots per sampler setting (a request's n choices are rows)
  config.batch_window_ms = 20.0  # when idle, a first request waits this long for others
  config.max_wait_ms = 200.0  # and at most this long
  config.chunk_steps = 8  # decode steps per jitted call: rows join and tokens stream between
  config.warm_up_prompt_tokens = 0  # > 0: compile every admission shape up to this prompt first
  config.max_body_bytes = 1 << 20
  config.max_concurrent = 256  # requests in flight (429 beyond)
  config.request_timeout_s = 600.0
  config.lock()
  return config
