#!/usr/bin/env bash
# Batch-1 decode, ours (4-bit GGUF blocks through the native kernels) against llama.cpp on
# the same GGUF file, in alternating rounds: per round and per model, llama.cpp, then ours.
# Issue 70's side-by-side figures. Pause every other busy process first (`kill -STOP`):
# the figures are only comparable within one run.
#
#   bash experiments/benchmarks/decode_rounds.sh OUT_DIR LLAMA_PYTHON [ROUNDS]
#
# LLAMA_PYTHON: the python of a venv with llama-cpp-python built (not an rlpost
# dependency: `CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python==0.3.36`).
# Writes OUT_DIR/{machine.txt,llamacpp_MODEL_rR.json,ours_MODEL_rR.json}; prints a summary.
set -euo pipefail
out=$1 llama_py=$2 rounds=${3:-3}
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
gemma=$($py -c "from rlpost.models.weights import packaged; print(packaged.default_gguf_path())")
smollm=$($py -c "from rlpost.models.weights import packaged; print(packaged.smollm2_gguf_path())")
{ lscpu | grep -E "Model name|^Model:|CPU family"; uptime; git rev-parse --short HEAD; } > "$out/machine.txt"
for r in $(seq 1 "$rounds"); do
  for m in smollm2 gemma; do
    if [ $m = smollm2 ]; then file=$smollm preset=--preset=smollm2_135m; else file=$gemma preset=; fi
    "$llama_py" experiments/benchmarks/llamacpp_decode.py "$file" --threads=2 > "$out/llamacpp_${m}_r$r.json"
    $py -m experiments.benchmarks.decode $preset --weights=int4 --int4=gguf --int4_matmul=native \
      > "$out/ours_${m}_r$r.json"
  done
done
uptime >> "$out/machine.txt"
$py - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
for f in sorted(glob.glob(os.path.join(out, "*_r*.json"))):
  text = open(f).read()
  d = json.loads(text[text.index("{"):])
  line = {"single_stream_tokens_per_s": round(d["single_stream"]["tokens_per_s"], 1)}
  if "batched" in d:
    line["batch8_tokens_per_s"] = d["batched"]["tokens_per_s"]
    line["fraction_of_limit"] = d["bandwidth"]["single_stream_fraction_of_limit"]
  print(os.path.basename(f), json.dumps(line))
PY
