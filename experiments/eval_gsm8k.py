r"""GSM8K test accuracy of the base model and of a trained checkpoint (before/after).

  python -m experiments.eval_gsm8k --workdir=/tmp/grpo_run          # config from the run (GRPO or PPO)
  python -m experiments.eval_gsm8k --config=experiments/configs/grpo_gsm8k.py:gemma3_270m \
      --config.env.data_dir=../shared/data/gsm8k                   # base model only

Writes a JSON report (default: WORKDIR/eval_gsm8k.json) and prints it. With --workdir,
each batch of problems is kept as it finishes: killed and started again, an evaluation
samples only the batches it had not finished (`rlpost.recipes.eval_progress`).
"""

import json
import os

from absl import app
from absl import flags
import ml_collections

from experiments import cli
from rlpost import errors
from rlpost.data import gsm8k
from rlpost.recipes import eval as eval_recipe

_CONFIG = cli.define_config(None, "GRPO or PPO config (when no --workdir).")
_WORKDIR = flags.DEFINE_string(
  "workdir", "", "A GRPO or PPO run directory: evaluates base and trained."
)
_BASE = flags.DEFINE_bool("base", True, "Also evaluate the base model.")
_SPLIT = flags.DEFINE_enum("split", "test", gsm8k.SPLITS, "GSM8K split.")
_NUM = flags.DEFINE_integer("num_problems", None, "First N problems (default: config.eval).")
_PASS_K = flags.DEFINE_integer("pass_k", None, "Samples per problem for pass@k (0: off).")
_BATCH = flags.DEFINE_integer(
  "batch_size", None, "Problems sampled at once (default: config.eval.batch_size)."
)
_OUTPUT = cli.define_output("output", "", "Report path (default WORKDIR/eval_gsm8k.json).")


def _config():
  if _WORKDIR.value:
    path = os.path.join(_WORKDIR.value, "config.json")
    try:
      with open(path, encoding="utf-8") as f:
        return ml_collections.ConfigDict(json.load(f))
    except OSError as e:
      raise errors.FlagError(
        f"--workdir={_WORKDIR.value}: cannot read {path} ({e.strerror}); give a GRPO or PPO "
        "run's --workdir (it writes config.json at its start)"
      ) from None
    except ValueError as e:
      raise errors.DataError(f"{path}: not a JSON config ({e}); give a run's --workdir") from None
  if _CONFIG.value is None:
    raise app.UsageError("Pass --workdir (a GRPO or PPO run) or --config")
  return _CONFIG.value


def main(argv):
  del argv
  report = eval_recipe.evaluate_run(
    _config(),
    _WORKDIR.value,
    split=_SPLIT.value,
    num_problems=_NUM.value,
    pass_k=_PASS_K.value,
    base=_BASE.value,
    batch_size=_BATCH.value,
  )
  path = _OUTPUT.value or (
    os.path.join(_WORKDIR.value, "eval_gsm8k.json") if _WORKDIR.value else ""
  )
  text = json.dumps(report, indent=1)
  print(text)
  if path:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)


if __name__ == "__main__":
  cli.run(main)
