r"""Serves a policy over an OpenAI-compatible endpoint until interrupted.

  python -m experiments.serve --config=experiments/configs/serve.py:tiny --config.port=8000

Then any OpenAI client: `openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-")`.
"""

import threading

from absl import logging

from experiments import cli
from rlpost import errors
from rlpost.models import families
from rlpost.recipes import common
from rlpost.serve import chat
from rlpost.text import chat_template
from rlpost.serve import engine as engine_lib
from rlpost.serve import pool
from rlpost.serve import scheduler
from rlpost.serve import server

_CONFIG = cli.define_config(
  "experiments/configs/serve.py:tiny", "Serving config (path.py:variant)."
)
_SERVER_FIELDS = (
  "host",
  "port",
  "api_key",
  "allow_remote",
  "max_body_bytes",
  "max_concurrent",
  "request_timeout_s",
)


def _settings(cls, cfg, names):
  """`cls` from the top-level fields `names`; its ValueError `Cls.field=...` becomes a
  ConfigError `config.field=...`."""
  try:
    return cls(**{name: cfg[name] for name in names})
  except ValueError as e:
    raise errors.ConfigError(str(e).replace(f"{cls.__name__}.", "config.")) from None


def check_config(cfg) -> tuple[server.ServerConfig, scheduler.BatchConfig, int]:
  """(server settings, batch settings, context) from the config, before the model loads;
  errors name config.FIELD, its value and the fix."""
  served = _settings(server.ServerConfig, cfg, _SERVER_FIELDS)
  batch = _settings(
    scheduler.BatchConfig, cfg, ("max_batch", "batch_window_ms", "max_wait_ms", "chunk_steps")
  )
  if not cfg.max_tokens >= 1:
    common.fail("max_tokens", cfg.max_tokens, "must be >= 1 new token")
  if cfg.context <= cfg.max_tokens:
    common.fail("context", cfg.context, f"must exceed config.max_tokens={cfg.max_tokens}")
  limit = families.context_tokens(cfg.model.preset) or cfg.context
  return served, batch, min(cfg.context, limit)


def main(argv):
  del argv
  cfg = _CONFIG.value
  served, batch, context = check_config(cfg)
  model_config, params, tokenizer = common.load_model(cfg)
  name = cfg.model_name or cfg.model.preset
  template = chat_template.for_tokenizer(tokenizer, cfg.model.chat_template)
  try:
    layout = chat.setup(template, cfg.tool_format, cfg.model.date_string)
  except ValueError as e:
    common.fail("tool_format", cfg.tool_format, str(e))
  engine = engine_lib.Engine(
    params, model_config, tokenizer, name, context, cfg.max_tokens, chat=layout
  )
  if cfg.warm_up_prompt_tokens > 0:  # greedy and OpenAI's default temperature, 1
    for temperature in (0.0, 1.0):
      shapes = pool.warm_up(
        engine, batch.max_batch, cfg.warm_up_prompt_tokens, temperature, steps=batch.chunk_steps
      )
    logging.info("compiled %d admission shapes per temperature", shapes)
  with server.serve_in_thread(engine, served, batch) as endpoint:
    url = endpoint.url
    logging.info("serving %r at %s", name, url)
    print(f"serving {name!r} at {url} (Ctrl-C stops)", flush=True)
    try:
      threading.Event().wait()
    except KeyboardInterrupt:
      pass


if __name__ == "__main__":
  cli.run(main)
