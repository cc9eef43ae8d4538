r"""Samples completions for prompts given by flags, the config, or a file.

  python -m experiments.sample --config=experiments/configs/sample.py:gemma3_270m \
      --prompt="The capital of France is" --config.sampling.temperature=0.7
"""

import json
import math
import os
import time
import types

from absl import app
from absl import flags
import jax

from experiments import cli
from rlpost import sampling
from rlpost.text import chat_formats
from rlpost.models import loading
from rlpost.recipes import common

_CONFIG = cli.define_config(
  "experiments/configs/sample.py:tiny", "Sampling config (path.py:variant)."
)
_PROMPT = flags.DEFINE_multi_string(
  "prompt", [], "Prompt text; repeat for several. Overrides config.prompts and config.prompt_file."
)
_OUTPUT = cli.define_output("output", "", "Optional JSONL file for the completions.")


def check_config(cfg) -> None:
  """Raises ValueError naming the first invalid field, its value and the fix (before the
  model loads)."""
  s = cfg.sampling
  if cfg.num_samples < 1:
    common.fail("num_samples", cfg.num_samples, "must be >= 1 completion per prompt")
  if cfg.prompt_file and not os.path.isfile(cfg.prompt_file):
    common.fail("prompt_file", cfg.prompt_file, "no such file (one prompt per line)")
  if not (math.isfinite(s.temperature) and s.temperature >= 0):
    common.fail("sampling.temperature", s.temperature, "must be a finite number >= 0 (0: greedy)")
  if s.top_k < 0:
    common.fail("sampling.top_k", s.top_k, "must be >= 0 tokens (0: no top-k)")
  if s.temperature == 0 and (s.top_p < 1 or s.top_k):
    common.fail(
      "sampling.temperature",
      s.temperature,
      f"greedy decoding ignores sampling.top_p={s.top_p} and sampling.top_k={s.top_k}: set "
      "a temperature > 0 (e.g. 0.7) to sample, or leave top_p=1.0 and top_k=0",
    )
  sampling_config(cfg, _STAND_IN_TOKENIZER)  # top_p, max_new_tokens, prompt_bucket


# Token ids for checking the sampling block before the tokenizer loads (any will do).
_STAND_IN_TOKENIZER = types.SimpleNamespace(eos_id=1, end_of_turn_id=106, pad_id=0)


def sampling_config(cfg, tokenizer) -> sampling.SamplingConfig:
  """ConfigDict `sampling` block -> validated SamplingConfig (errors name config.sampling.*)."""
  s = cfg.sampling
  stops = (tokenizer.eos_id, tokenizer.end_of_turn_id) if s.stop_at_eos else ()
  fields = ("temperature", "top_k", "top_p", "max_new_tokens", "prompt_bucket")
  return common.renaming_errors(
    sampling.SamplingConfig,
    {name: "sampling" for name in fields},
    temperature=s.temperature,
    top_k=s.top_k or None,
    top_p=s.top_p,
    stop_ids=stops,
    max_new_tokens=s.max_new_tokens,
    pad_id=tokenizer.pad_id,
    prompt_bucket=s.prompt_bucket,
  )


def read_prompts(cfg, flag_prompts=()) -> list[str]:
  """`flag_prompts` (--prompt), else config.prompt_file's non-blank lines (UTF-8, a
  byte-order mark and CRLF line ends allowed), else config.prompts."""
  if flag_prompts:
    return list(flag_prompts)
  if cfg.prompt_file:
    try:
      with open(cfg.prompt_file, encoding="utf-8-sig") as f:
        return [line.rstrip("\r\n") for line in f if line.strip()]
    except UnicodeDecodeError as e:
      common.fail(
        "prompt_file", cfg.prompt_file, f"is not UTF-8 text ({e.reason}); save it as UTF-8"
      )
  return list(cfg.prompts)


def main(argv):
  del argv
  cfg = _CONFIG.value
  check_config(cfg)
  texts = read_prompts(cfg, _PROMPT.value)  # a bad prompt file fails before the model loads
  if not texts:
    raise app.UsageError("No prompts: pass --prompt, config.prompts or config.prompt_file")
  m = cfg.model
  model_config, params, tokenizer = loading.load_model(
    m.preset, m.weights, m.path, m.dtype, cfg.seed
  )
  sc = sampling_config(cfg, tokenizer)
  if cfg.chat:  # the model's chat format; the prompt text stays text
    prompts = [
      chat_formats.conversation_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts
    ]
  else:
    prompts = [tokenizer.encode(t) for t in texts]
  tokens, lengths = sampling.pad_prompts(prompts, sc)
  start = time.perf_counter()
  out = sampling.sample(
    params,
    tokens,
    lengths,
    jax.random.key(cfg.seed),
    model_config=model_config,
    config=sc,
    num_samples=cfg.num_samples,
  )
  out = jax.device_get(out)
  seconds = time.perf_counter() - start
  records = []
  for row in range(out.tokens.shape[0]):
    ids = out.tokens[row, : out.lengths[row]].tolist()
    prompt = texts[row // cfg.num_samples]
    records.append(
      {
        "prompt": prompt,
        "sample": row % cfg.num_samples,
        "completion": tokenizer.decode(ids),
        "tokens": ids,
        "logprob": float(out.logprobs[row].sum()),
      }
    )
    print(f"--- [{row}] {prompt!r}\n{records[-1]['completion']}")
  print(f"({int(out.lengths.sum())} tokens in {seconds:.1f} s, compile included)")
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w", encoding="utf-8") as f:
      for r in records:
        f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
  cli.run(main)
