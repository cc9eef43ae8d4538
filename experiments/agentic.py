r"""Multi-turn agentic RL (FrozenLake; GSM8K with a calculator): GRPO family or PPO over trajectories.

  python -m experiments.agentic --config=experiments/configs/agentic.py:frozenlake_gemma3 \
      --workdir=/tmp/agentic_run

Resumes automatically from the newest checkpoint in --workdir. Transcripts of
sampled episodes go to --workdir/trajectories.jsonl. `--config.train.steps=0`
only evaluates (greedy, held-out tasks) and logs it as step 0.
"""

from absl import flags

from experiments import cli
from rlpost.recipes import rl

_CONFIG = cli.define_config(
  "experiments/configs/agentic.py:frozenlake_tiny", "Agentic RL config (path.py:variant)."
)
_WORKDIR = flags.DEFINE_string("workdir", "", "Checkpoints, metrics and transcripts go here.")


def main(argv):
  del argv
  rl.run(_CONFIG.value, _WORKDIR.value)  # config.learner picks the learner


if __name__ == "__main__":
  cli.run(main)
