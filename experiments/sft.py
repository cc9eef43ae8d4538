r"""Supervised fine-tuning (loss on assistant tokens only).

  python -m experiments.sft --config=experiments/configs/sft.py:gemma3_270m \
      --config.data.data_dir=../shared/data/gsm8k --workdir=/tmp/sft_run
  python -m experiments.sft --config=experiments/configs/sft.py:tiny --workdir=/tmp/sft_tiny
"""

from absl import flags

from experiments import cli
from rlpost.recipes import sft

_CONFIG = cli.define_config("experiments/configs/sft.py:tiny", "SFT config (path.py:variant).")
_WORKDIR = flags.DEFINE_string("workdir", "", "Checkpoints and metrics; resumes from it.")


def main(argv):
  del argv
  _, record = sft.run(_CONFIG.value, _WORKDIR.value)
  print({k: v for k, v in record.items() if isinstance(v, (int, float))})


if __name__ == "__main__":
  cli.run(main)
