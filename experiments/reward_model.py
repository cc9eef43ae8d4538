r"""A reward model (Bradley-Terry score head) on preference pairs.

  python -m experiments.reward_model --config=experiments/configs/reward_model.py:gemma3_270m \
      --config.data.path=prefs.jsonl --workdir=/tmp/rm_run
  python -m experiments.reward_model --config=experiments/configs/reward_model.py:tiny \
      --workdir=/tmp/rm_tiny
"""

from absl import flags

from experiments import cli
from rlpost.recipes import reward_model

_CONFIG = cli.define_config(
  "experiments/configs/reward_model.py:tiny", "Reward-model config (path.py:variant)."
)
_WORKDIR = flags.DEFINE_string("workdir", "", "Checkpoints and metrics; resumes from it.")


def main(argv):
  del argv
  _, record = reward_model.run(_CONFIG.value, _WORKDIR.value)
  print({k: v for k, v in record.items() if isinstance(v, (int, float))})


if __name__ == "__main__":
  cli.run(main)
