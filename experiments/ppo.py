r"""PPO with a learned critic on GSM8K (or the tiny toy task).

  python -m experiments.ppo --config=experiments/configs/ppo_gsm8k.py:gemma3_270m \
      --config.env.data_dir=../shared/data/gsm8k --workdir=/tmp/ppo_run

Resumes automatically from the newest checkpoint in --workdir.
"""

from absl import flags

from experiments import cli
from rlpost.recipes import rl

_CONFIG = cli.define_config(
  "experiments/configs/ppo_gsm8k.py:tiny", "PPO config (path.py:variant)."
)
_WORKDIR = flags.DEFINE_string("workdir", "", "Checkpoints and metrics go here.")


def main(argv):
  del argv
  cli.check_learner(_CONFIG.value, "ppo", "experiments.ppo (trains PPO)")
  rl.run(_CONFIG.value, _WORKDIR.value, learner="ppo")


if __name__ == "__main__":
  cli.run(main)
