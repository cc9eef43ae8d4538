r"""GRPO-family RL on GSM8K (or the tiny toy task).

  python -m experiments.grpo --config=experiments/configs/grpo_gsm8k.py:gemma3_270m \
      --config.env.data_dir=../shared/data/gsm8k --workdir=/tmp/grpo_run

Resumes automatically from the newest checkpoint in --workdir.
"""

from absl import flags

from experiments import cli
from rlpost.recipes import rl

_CONFIG = cli.define_config(
  "experiments/configs/grpo_gsm8k.py:tiny", "GRPO config (path.py:variant)."
)
_WORKDIR = flags.DEFINE_string("workdir", "", "Checkpoints and metrics go here.")


def main(argv):
  del argv
  cli.check_learner(_CONFIG.value, "grpo", "experiments.grpo (trains GRPO)")
  rl.run(_CONFIG.value, _WORKDIR.value, learner="grpo")


if __name__ == "__main__":
  cli.run(main)
