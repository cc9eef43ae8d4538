#!/usr/bin/env bash
# GRPO, SFT and decode benchmarks on one accelerator, rlpost then Tunix 0.1.7, one after the other,
# each JSON written to $OUT as soon as it exists (a part that fails or overruns its time
# limit leaves the end of its stderr in $OUT/log.txt, and the next part runs).
#
#   OUT=DIR TOKENIZER_GGUF=tok.gguf [TUNIX_BENCH=tunix_bench.py] \
#     [TUNIX_PYTHONPATH=DIR] [ONLY="rlpost_sft tunix_sft ..."] bash experiments/benchmarks/gpu_suite.sh
#
# TOKENIZER_GGUF: a GGUF holding the Gemma 3 tokenizer (the packaged model's metadata
# without its tensors is enough: rlpost.models.weights.gguf_file.write_metadata_only),
# for machines the 245 MB packaged model cannot reach. TUNIX_PYTHONPATH: where Tunix
# and the packages it adds to this machine's are installed (empty: skip Tunix).
set -u
: "${OUT:?set OUT to the results directory}" "${TOKENIZER_GGUF:?set TOKENIZER_GGUF}"
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxcache}"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
work=$(mktemp -d)

part() {  # part NAME SECONDS COMMAND...: stdout's last JSON object to $OUT/NAME.json
  local name=$1 limit=$2
  shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  log "start $name (limit ${limit}s)"
  local start=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$work/$name.stdout" 2>"$work/$name.stderr"
  local rc=$?
  log "end $name rc=$rc after $((SECONDS - start))s"
  if [ $rc -eq 0 ]; then
    python3 -c 'import json,sys; t=open(sys.argv[1]).read(); print(json.dumps(json.loads(t[t.index("{"):]), indent=1))' \
      "$work/$name.stdout" >"$OUT/$name.json"
  else
    tail -n 30 "$work/$name.stderr" | tee -a "$OUT/log.txt"
  fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/log.txt"
python3 -c 'import jax; print(jax.__version__, jax.devices())' 2>&1 | tail -n 1 | tee -a "$OUT/log.txt"

grpo=(python3 -m experiments.benchmarks.grpo_step --iterations=6 "--model_path=$TOKENIZER_GGUF")
part rlpost_grpo_lora 130 "${grpo[@]}" --modes=lora
part rlpost_grpo_full 110 "${grpo[@]}" --modes=full
part rlpost_sft 70 python3 -m experiments.benchmarks.sft_step --steps=6

if [ -n "${TUNIX_PYTHONPATH:-}" ]; then
  tunix=(env "PYTHONPATH=$TUNIX_PYTHONPATH" python3 "${TUNIX_BENCH:?}" --grpo-steps=5)
  part tunix_grpo_lora 110 "${tunix[@]}" --parts=grpo_step --lora --lora-rank=32 --lora-alpha=32
  part tunix_grpo_full 90 "${tunix[@]}" --parts=grpo_step
  part tunix_sft 60 "${tunix[@]}" --parts=sft_step --sft-steps=6
fi
part rlpost_decode 150 python3 -m experiments.benchmarks.decode
log done
