"""llama.cpp on a GGUF file, for the decode benchmark's side-by-side figures (issue 37).

Runs in an environment of its own with `llama-cpp-python` (built from source; not a
dependency of rlpost). llama.cpp runs the file as it is stored: its quantized blocks
(SmolLM2's Q4_1), 8-bit activations inside the matmuls, a float16 KV cache. Prints one
JSON object: the single-stream workload of `experiments.benchmarks.decode` (a 64-token
prompt, 128 new tokens, greedy; tokens/s over the new tokens, the prompt's evaluation
included as in ours) and a 512-token prefill (tokens/s: the time to the first token of a
512-token prompt), the best of `--repeats`.

usage: python llamacpp_decode.py GGUF_FILE [--threads=2] [--repeats=3]
"""

import argparse
import json
import os
import time

import llama_cpp


def _best(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("gguf")
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  model = llama_cpp.Llama(
    args.gguf, n_ctx=1024, n_threads=args.threads, n_batch=512, verbose=False, seed=0
  )
  prompt = list(range(1000, 1064))  # 64 ordinary token ids

  def single_stream():
    model.reset()
    out = []
    for token in model.generate(prompt, temp=0.0, top_k=1, reset=True):
      out.append(token)
      if len(out) == 128:
        break

  def prefill():  # the prompt's evaluation, then one greedy token (reset: no cached prefix)
    model.reset()
    next(iter(model.generate(list(range(1000, 1512)), temp=0.0, top_k=1, reset=True)))

  single_stream()  # warm-up
  single = _best(single_stream, args.repeats)
  fill = _best(prefill, args.repeats)
  print(
    json.dumps(
      {
        "benchmark": "llamacpp_decode",
        "engine": f"llama-cpp-python {llama_cpp.__version__}",
        "gguf": os.path.basename(args.gguf),
        "threads": args.threads,
        "loadavg": os.getloadavg(),
        "single_stream": {"prompt_len": 64, "new_tokens": 128, "tokens_per_s": 128 / single},
        "prefill_512": {"tokens_per_s": 512 / fill},
      },
      indent=1,
    )
  )


if __name__ == "__main__":
  main()
