r"""GSM8K greedy evaluation: the batched sampler against continuous batching, side by side.

The first `--problems` GSM8K test problems in the few-shot prompt, greedy, at most
`--max_new_tokens` each, on the real Gemma 3 270M (float32): once as batches of `--rows`
problems through `sampling.sample` (every batch decodes its longest row's tokens, cut at
"</answer>" afterwards), once through `--rows` slots of continuous batching
(`rlpost.recipes.eval._greedy_by_slots`: a row that wrote its answer frees its slot for
the next problem). Each path runs once to compile (on the first `--rows` problems) and is
then timed on all of them; the texts must agree (`same_texts`).

Prints ONE JSON object: the machine, the load before and after, seconds per path, the
speed-up, problems per second, the mean sampled tokens per problem, and same_texts.

  python -m experiments.benchmarks.gsm8k_eval [--problems=128 --rows=32]
"""

import json
import os
import time

from absl import app
from absl import flags
import jax

from experiments.benchmarks import machine
from rlpost.data import gsm8k
from rlpost.data import prompts as prompts_lib
from rlpost.models import loading
from rlpost.recipes import eval as evaluation
from rlpost import sampling

_PROBLEMS = flags.DEFINE_integer("problems", 128, "GSM8K test problems (the first N).")
_ROWS = flags.DEFINE_integer("rows", 32, "Problems per sampler batch = slots.")
_NEW = flags.DEFINE_integer("max_new_tokens", 192, "Greedy tokens per problem at most.")
_DATA = flags.DEFINE_string("data_dir", "../shared/data/gsm8k", "GSM8K jsonl directory.")


def main(argv):
  del argv
  config, params, tok = loading.load_model("gemma3_270m", "gguf", "", "float32", 0)
  problems = gsm8k.load_gsm8k("test", _DATA.value)[: _PROBLEMS.value]
  examples = gsm8k.load_gsm8k("train", _DATA.value)[:2]
  sc = sampling.SamplingConfig(
    temperature=0.0,
    stop_ids=(tok.eos_id, tok.end_of_turn_id),
    max_new_tokens=_NEW.value,
    pad_id=tok.pad_id,
    prompt_bucket=64,
  )
  rows = _ROWS.value

  def batched(items):
    texts = []
    for start in range(0, len(items), rows):
      chunk = items[start : start + rows]
      key = jax.random.key(0)
      texts += evaluation._completions(params, config, tok, chunk, "fewshot", examples, sc, key, 1)
    return texts

  def slots(items):
    texts = [None] * len(items)
    evaluation._greedy_by_slots(
      params,
      config,
      tok,
      items,
      "fewshot",
      examples,
      sc,
      list(range(len(items))),
      rows,
      texts.__setitem__,
    )
    return texts

  load_before = os.getloadavg()
  seconds, texts = {}, {}
  for name, run in (("batched", batched), ("slots", slots)):
    run(problems[:rows])  # compiles
    start = time.perf_counter()
    texts[name] = run(problems)
    seconds[name] = time.perf_counter() - start
  prefix = len(prompts_lib.completion_prefix("fewshot"))
  tokens = [len(tok.encode(t[prefix:], add_bos=False)) for t in texts["slots"]]
  print(
    json.dumps(
      {
        "benchmark": "gsm8k_eval",
        "cpu": machine.cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "problems": len(problems),
        "rows": rows,
        "max_new_tokens": _NEW.value,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "speedup": round(seconds["batched"] / seconds["slots"], 2),
        "problems_per_s": {k: round(len(problems) / v, 3) for k, v in seconds.items()},
        "mean_answer_tokens": round(sum(tokens) / len(tokens), 1),
        "same_texts": sum(a == b for a, b in zip(texts["batched"], texts["slots"])),
      }
    )
  )


if __name__ == "__main__":
  app.run(main)
