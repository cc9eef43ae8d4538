r"""The endpoint's throughput against the batched sampler, and one streaming client.

Workload (flags): `--clients` concurrent agents, each a conversation of `--turns` turns
through the real `openai` client (each turn appends the reply and a new user message),
`--max_tokens` new tokens per turn (sampled, temperature 0.7, a seed per client). The
whole workload runs once, then `engine.warm_up` compiles every (rows, prompt width) bucket
it can meet, then it is timed. The reference replays
the same rows (the prompt ids the endpoint saw, the token counts it returned) through
`engine.generate`, one call per turn with every client's row, timed after a warm-up.
Prints ONE JSON object:

  endpoint   seconds, completion tokens/s, per-request latency p50/p95, sampler calls
  sampler    seconds, tokens/s (the same rows and lengths, batched per turn)
  ratio      endpoint tokens/s / sampler tokens/s (issue 68's goal: >= 0.8)
  stream     one streaming client alone: time to first content chunk, tokens/s

  python -m experiments.benchmarks.serve [--preset=tiny] [--clients=32 --turns=4]

The clients run in this process (threads sharing the GIL with the server); on a loaded
2-core machine a turn's 32 requests trickle in over tens of milliseconds. With the
scheduler's defaults (a 20 ms gap closes a batch, 200 ms at most) a turn is one or two
sampler calls; with a 5 ms gap and 50 ms cap it was two or three (7 calls, 0.45x).
"""

import concurrent.futures
import json
import logging as std_logging
import os
import statistics
import time

from absl import app
from absl import flags

from experiments.benchmarks import machine
import openai

from rlpost.models import loading
from rlpost.serve import engine as engine_lib
from rlpost.serve import scheduler
from rlpost.serve import server
from rlpost.train import runtime

_PRESET = flags.DEFINE_string("preset", "tiny", "Model preset (random weights for test presets).")
_CLIENTS = flags.DEFINE_integer("clients", 32, "Concurrent agents.")
_TURNS = flags.DEFINE_integer("turns", 4, "Turns per agent.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 32, "New tokens per turn (at most).")
_WINDOW = flags.DEFINE_float("batch_window_ms", 20.0, "Scheduler: the gap that closes a batch.")
_CACHE_DIR = flags.DEFINE_string("compilation_cache_dir", "~/.cache/rlpost/jax", "'': off.")
_MAX_WAIT = flags.DEFINE_float("max_wait_ms", 200.0, "Scheduler: a batch's longest wait.")


def _agent(client, index: int, turns: int, max_tokens: int) -> list[dict]:
  """One conversation; per turn its prompt ids, token count and latency."""
  messages, records = [{"role": "user", "content": f"Agent {index}: begin."}], []
  for turn in range(turns):
    start = time.perf_counter()
    r = client.chat.completions.create(
      model="served",
      messages=messages,
      max_tokens=max_tokens,
      temperature=0.7,
      seed=index * 100 + turn,
    )
    c = r.choices[0]
    records.append(
      {
        "prompt": r.model_extra["prompt_token_ids"],
        "tokens": len(c.model_extra["token_ids"]),
        "seconds": time.perf_counter() - start,
        "turn": turn,
      }
    )
    messages += [
      {"role": "assistant", "content": c.message.content or ""},
      {"role": "user", "content": f"Turn {turn + 1}: go on."},
    ]
  return records


def _workload(url: str) -> tuple[float, list[dict]]:
  client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=600)
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(_CLIENTS.value) as pool:
    runs = list(
      pool.map(lambda i: _agent(client, i, _TURNS.value, _MAX_TOKENS.value), range(_CLIENTS.value))
    )
  return time.perf_counter() - start, [r for run in runs for r in run]


def _sampler(engine, records: list[dict]) -> float:
  """Seconds to sample the same rows, one batched call per turn (every client's row)."""
  by_turn = {}
  for r in records:
    rows = by_turn.setdefault(r["turn"], [])
    seed = engine_lib.row_id(len(rows), r["turn"])
    rows.append(engine_lib.Row(tuple(r["prompt"]), max(r["tokens"], 1), seed))
  start = time.perf_counter()
  for rows in by_turn.values():
    engine_lib.generate(engine, rows, 0.7, 1.0)
  return time.perf_counter() - start


def _stream(url: str) -> dict:
  client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=600)
  start = time.perf_counter()
  first, tokens = None, 0
  for chunk in client.chat.completions.create(
    model="served",
    messages=[{"role": "user", "content": "Stream, please."}],
    max_tokens=_MAX_TOKENS.value,
    temperature=0.7,
    seed=1,
    stream=True,
  ):
    if chunk.choices and chunk.choices[0].model_extra.get("token_ids"):
      first = first or time.perf_counter() - start
      tokens += len(chunk.choices[0].model_extra["token_ids"])
  seconds = time.perf_counter() - start
  return {"time_to_first_token_s": first, "tokens": tokens, "tokens_per_s": tokens / seconds}


def main(argv):
  del argv
  for name in ("httpx", "httpx2"):  # a line per request otherwise
    std_logging.getLogger(name).setLevel(std_logging.WARNING)
  runtime.enable_compilation_cache(_CACHE_DIR.value, 4.0)  # a rerun skips the warm-up's compiles
  config, params, tok = loading.load_model(_PRESET.value, loading.default_weights(_PRESET.value))
  engine = engine_lib.Engine(params, config, tok, "served", 4096, _MAX_TOKENS.value)
  report = {
    "cpu": machine.cpu_model(),
    "cpus": os.cpu_count(),
    "load_average_before": os.getloadavg(),
    "preset": _PRESET.value,
    "clients": _CLIENTS.value,
    "turns": _TURNS.value,
    "max_tokens": _MAX_TOKENS.value,
  }
  batch = scheduler.BatchConfig(_CLIENTS.value, _WINDOW.value, _MAX_WAIT.value)
  with server.serve_in_thread(engine, server.ServerConfig(port=0), batch) as endpoint:
    url = endpoint.url
    _, first = _workload(url)  # compiles the shapes it meets
    longest = max(len(r["prompt"]) for r in first)
    report["warm_up_shapes"] = engine_lib.warm_up(engine, _CLIENTS.value, longest, 0.7)
    _stream(url)
    calls = endpoint.scheduler.calls[0]
    seconds, records = _workload(url)
    calls = endpoint.scheduler.calls[0] - calls
    report["stream"] = _stream(url)
  tokens = sum(r["tokens"] for r in records)
  latencies = sorted(r["seconds"] for r in records)
  report["endpoint"] = {
    "seconds": seconds,
    "tokens": tokens,
    "tokens_per_s": tokens / seconds,
    "latency_p50_s": statistics.median(latencies),
    "latency_p95_s": latencies[int(0.95 * (len(latencies) - 1))],
    "sampler_calls": calls,
  }
  _sampler(engine, records)  # compiles the reference's shapes
  sampler_seconds = _sampler(engine, records)
  report["sampler"] = {"seconds": sampler_seconds, "tokens_per_s": tokens / sampler_seconds}
  report["ratio"] = report["endpoint"]["tokens_per_s"] / report["sampler"]["tokens_per_s"]
  report["load_average_after"] = os.getloadavg()
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  app.run(main)
