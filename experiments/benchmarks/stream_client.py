"""One streaming client against any OpenAI-compatible server: time to first token, tokens/s.

The same client code measures our endpoint (`python -m experiments.serve`) and llama.cpp's
server (`python -m llama_cpp.server`, started here with `--llama_cpp_gguf`, in the
environment where `llama-cpp-python[server]` is built), so the two figures differ only in
the server (issue 68: one streaming client at batch 1 beside llama.cpp's server). Standard
library only: it runs in either environment.

A request is `POST /v1/completions` with `stream=true`, a fixed prompt, greedy, `max_tokens`
new tokens and no stop; the time to first token is to the first SSE event carrying a
token, tokens/s is the tokens after it over the time from the first to the last event
(an event's `token_ids` when the server sends them, as ours does; else one per text chunk,
as llama.cpp's server sends one chunk per token). The best of
`--repeats` (after one warm-up) is reported, as one JSON object.

usage: python -m experiments.benchmarks.stream_client --base_url=http://127.0.0.1:8000/v1 [--model=NAME]
       python -m experiments.benchmarks.stream_client --llama_cpp_gguf=FILE [--threads=2]
"""

import argparse
import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse

from experiments.benchmarks import machine

PROMPT = (
  "Question: A farmer has 12 cows and buys 7 more, then sells 5. How many cows does the "
  "farmer have now? Explain each step of the reasoning carefully before answering.\nAnswer:"
)
READY_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 600


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _get(base: urllib.parse.ParseResult, path: str) -> dict:
  conn = http.client.HTTPConnection(base.hostname, base.port, timeout=10)
  try:
    conn.request("GET", base.path + path)
    return json.loads(conn.getresponse().read())
  finally:
    conn.close()


def wait_ready(base_url: str, proc=None) -> str:
  """Polls GET /v1/models until it answers (bounded); returns the first model's id."""
  base = urllib.parse.urlparse(base_url)
  deadline = time.monotonic() + READY_TIMEOUT_S
  while time.monotonic() < deadline:
    if proc is not None and proc.poll() is not None:
      raise RuntimeError(f"the server exited with status {proc.returncode}")
    try:
      return _get(base, "/models")["data"][0]["id"]
    except (OSError, KeyError, IndexError, ValueError):
      time.sleep(0.5)
  raise TimeoutError(f"{base_url} did not answer GET /models within {READY_TIMEOUT_S} s")


def stream_once(base_url: str, model: str, max_tokens: int) -> dict:
  """One streamed completion: seconds to the first token, tokens, seconds to the last."""
  base = urllib.parse.urlparse(base_url)
  body = {
    "model": model,
    "prompt": PROMPT,
    "max_tokens": max_tokens,
    "temperature": 0.0,
    "stream": True,
  }
  conn = http.client.HTTPConnection(base.hostname, base.port, timeout=REQUEST_TIMEOUT_S)
  start = time.perf_counter()
  first = last = None
  tokens, usage = 0, None
  try:
    conn.request(
      "POST", base.path + "/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = conn.getresponse()
    if response.status != 200:
      raise RuntimeError(f"status {response.status}: {response.read()[:500]!r}")
    for raw in response:
      line = raw.decode().strip()
      if not line.startswith("data:"):
        continue
      data = line[len("data:") :].strip()
      if data == "[DONE]":
        break
      event = json.loads(data)
      usage = event.get("usage") or usage
      for choice in event.get("choices", []):
        ids = choice.get("token_ids")  # ours (as vLLM): the event's tokens; else one per chunk
        count = len(ids) if ids is not None else int(bool(choice.get("text")))
        if count:
          now = time.perf_counter()
          first = now if first is None else first
          last, tokens = now, tokens + count
  finally:
    conn.close()
  if first is None:
    raise RuntimeError("the stream carried no tokens")
  return {"ttft_s": first - start, "tokens": tokens, "stream_s": last - first, "usage": usage}


def measure(base_url: str, model: str, max_tokens: int, repeats: int) -> dict:
  stream_once(base_url, model, max_tokens)  # warm-up (compilation, caches)
  runs = [stream_once(base_url, model, max_tokens) for _ in range(repeats)]
  best_ttft = min(r["ttft_s"] for r in runs)
  rates = [(r["tokens"] - 1) / r["stream_s"] for r in runs if r["tokens"] > 1 and r["stream_s"]]
  return {
    "ttft_s_best": round(best_ttft, 4),
    "tokens_per_s_best": round(max(rates), 2) if rates else None,
    "tokens": [r["tokens"] for r in runs],
    "usage_completion_tokens": [(r["usage"] or {}).get("completion_tokens") for r in runs],
  }


@contextlib.contextmanager
def llama_cpp_server(gguf: str, threads: int):
  """llama.cpp's OpenAI-compatible server on 127.0.0.1 (a free port) for the duration."""
  port = _free_port()
  args = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1"]
  args += ["--port", str(port), "--n_threads", str(threads), "--n_ctx", "1024"]
  proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    url = f"http://127.0.0.1:{port}/v1"
    wait_ready(url, proc)
    yield url
  finally:
    proc.terminate()
    try:
      proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      proc.kill()


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--base_url", default="")
  parser.add_argument("--model", default="")
  parser.add_argument("--llama_cpp_gguf", default="")
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--max_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  if bool(args.base_url) == bool(args.llama_cpp_gguf):
    parser.error("give one of --base_url (a running server) or --llama_cpp_gguf (start one)")
  with contextlib.ExitStack() as stack:
    url = args.base_url or stack.enter_context(llama_cpp_server(args.llama_cpp_gguf, args.threads))
    model = args.model or wait_ready(url)
    result = measure(url, model, args.max_tokens, args.repeats)
  server = (
    f"llama.cpp server ({os.path.basename(args.llama_cpp_gguf)})" if args.llama_cpp_gguf else url
  )
  print(
    json.dumps(
      {
        "benchmark": "stream_client",
        "server": server,
        "model": model,
        "max_tokens": args.max_tokens,
        "cpu": machine.cpu_model(),
        "loadavg": os.getloadavg(),
        **result,
      },
      indent=1,
    )
  )


if __name__ == "__main__":
  main()
