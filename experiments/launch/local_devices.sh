#!/usr/bin/env bash
# One machine, N simulated CPU devices (or the GPUs it has): one process, a (data, fsdp) mesh.
#   bash experiments/launch/local_devices.sh 4 sft.py:tiny --config.mesh.fsdp=2 \
#     --config.train.micro_batch_size=2 --workdir=/tmp/run
# Args: N, CONFIG (path under experiments/configs, with its variant), then any flags.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)  # the repository: configs are read from there
n=$1 config=$2
shift 2
recipe=${config%%.py*}                              # sft.py:tiny -> sft
recipe=${recipe%_gsm8k}                             # grpo_gsm8k -> grpo
XLA_FLAGS="--xla_force_host_platform_device_count=${n}" \
  exec python -m "experiments.${recipe}" --config="${root}/experiments/configs/${config}" "$@"
