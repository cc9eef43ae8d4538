r"""Direct preference optimisation (sigmoid DPO against a frozen reference).

  python -m experiments.dpo --config=experiments/configs/dpo.py:gemma3_270m \
      --config.data.path=prefs.jsonl --workdir=/tmp/dpo_run
  python -m experiments.dpo --config=experiments/configs/dpo.py:tiny --workdir=/tmp/dpo_tiny
"""

from absl import flags

from experiments import cli
from rlpost.recipes import dpo

_CONFIG = cli.define_config("experiments/configs/dpo.py:tiny", "DPO config (path.py:variant).")
_WORKDIR = flags.DEFINE_string("workdir", "", "Checkpoints and metrics; resumes from it.")


def main(argv):
  del argv
  _, record = dpo.run(_CONFIG.value, _WORKDIR.value)
  print({k: v for k, v in record.items() if isinstance(v, (int, float))})


if __name__ == "__main__":
  cli.run(main)
