#!/usr/bin/env bash
# P processes on this machine talking through jax.distributed (gloo on CPU), D devices each:
#   bash experiments/launch/local_processes.sh 2 2 sft.py:tiny --config.train.micro_batch_size=2 \
#     --workdir=/tmp/run
# Pipelined (off-policy by one step, TIS-corrected): each process samples its block of rows on
# 2 devices of its own while the trainer trains on the other 2, a producer thread ahead:
#   bash experiments/launch/local_processes.sh 2 4 grpo_gsm8k.py:tiny --config.mesh.rollout=2 \
#     --config.rollout.max_staleness=1 --config.algo.tis_cap=2.0 \
#     --config.train.micro_batch_size=2 --workdir=/tmp/run_pipelined
# Logs: ./process<i>.log; every process gets the same flags.
# If one process dies the others exit non-zero after --dist.heartbeat_timeout_s.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)  # the repository: configs are read from there
processes=$1 devices=$2 config=$3
shift 3
recipe=${config%%.py*}
recipe=${recipe%_gsm8k}
port=${PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}
pids=()
for ((i = 0; i < processes; i++)); do
  XLA_FLAGS="--xla_force_host_platform_device_count=${devices}" \
  JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo \
    python -m "experiments.${recipe}" --config="${root}/experiments/configs/${config}" \
      --dist.coordinator_address="localhost:${port}" --dist.num_processes="${processes}" \
      --dist.process_id="${i}" "$@" > "process${i}.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "${pid}" || status=$?; done
exit "${status}"
