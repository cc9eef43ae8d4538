"""Which library files one RL iteration's calls pass through: what a reader opens to follow it.

  python -m experiments.benchmarks.call_trail                         # GRPO, tiny digit task
  python -m experiments.benchmarks.call_trail --config=agentic.py:frozenlake_tiny,ppo

Builds the run from the config (`rlpost.recipes.rl.build`, not traced), then runs its first
iteration (`rl.iteration`: rollout, rewards, advantages, the train step, the optimizer
update) under `sys.setprofile`, and prints one JSON object: every file under rlpost/ a
Python-level call entered (JAX traces the model, sampler and losses in Python the first
time, so they count), grouped by package, and the count. The main and its config module
are the two files a reader opens before these.
"""

import collections
import importlib
import json
import os
import sys

from absl import app
from absl import flags

_CONFIG = flags.DEFINE_string(
  "config", "grpo_gsm8k.py:tiny", "FILE:VARIANT under experiments/configs/"
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(ROOT, "rlpost") + os.sep


def library_files(run) -> list[str]:
  """The rlpost/ files (relative to the repository) whose functions `run()` calls."""
  seen = set()

  def profile(frame, event, arg):
    del arg
    if event == "call" and frame.f_code.co_filename.startswith(LIBRARY):
      seen.add(frame.f_code.co_filename)

  sys.setprofile(profile)
  try:
    run()
  finally:
    sys.setprofile(None)
  return sorted(os.path.relpath(f, ROOT) for f in seen)


def main(argv):
  del argv
  from rlpost.data.cursor import Cursor  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top

  name, _, variant = _CONFIG.value.partition(":")
  module = importlib.import_module(f"experiments.configs.{name.removesuffix('.py')}")
  cfg = module.get_config(variant)
  p = rl.build(cfg, learner="ppo" if name == "ppo_gsm8k.py" else None)
  files = library_files(lambda: rl.iteration(p, p.state, Cursor(0, 0, 0), 0))
  by_package = collections.defaultdict(list)
  for f in files:
    parts = f.split(os.sep)
    by_package[parts[1] if len(parts) > 2 else "(top)"].append(parts[-1])
  print(
    json.dumps(
      {
        "benchmark": "call_trail",
        "config": _CONFIG.value,
        "library_files": len(files),
        "by_package": dict(sorted(by_package.items())),
      }
    )
  )


if __name__ == "__main__":
  app.run(main)
