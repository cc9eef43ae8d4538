r"""Outcome pairs from a model's own GSM8K solutions (a verifier's and ORPO's data).

Samples `--samples` solutions per problem of a GSM8K split with the config's model (an
SFT run's weights with `--config.model.init_from=SFT_WORKDIR`), checks each with the
answer reward and writes (rlpost.data.outcome_pairs):

  OUT/pairs.jsonl     a correct solution over each wrong one (DPO format: DPO, ORPO, SimPO,
                      `experiments.reward_model`)
  OUT/examples.jsonl  every sample with its label (KTO format; a verifier's classifier data)
  OUT/summary.json    problems, samples, the share correct, pairs by chosen source

  python -m experiments.outcome_pairs \
      --config=experiments/configs/grpo_gsm8k.py:gemma3_270m --config.env.template=chat \
      --config.env.data_dir=../shared/data/gsm8k --split=train --num_problems=512 \
      --samples=4 --out=/tmp/outcome_pairs

Batches are appended as they finish; an interrupted run started again with the same
flags continues after the last whole batch and writes what one uninterrupted run writes.
"""

import json
import os

from absl import flags
import jax
import tqdm

from experiments import cli
from rlpost import errors
from rlpost.data import gsm8k
from rlpost.data import outcome_pairs
from rlpost.recipes import eval as eval_recipe

_CONFIG = cli.define_config(None, "A GRPO or PPO config: model, sampling, env.template.")
_SPLIT = flags.DEFINE_enum("split", "train", gsm8k.SPLITS, "GSM8K split.")
_NUM = flags.DEFINE_integer("num_problems", 256, "The split's first N problems.")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Sampled solutions per problem.")
_BATCH = flags.DEFINE_integer("batch_problems", 8, "Problems per sampler call.")
_OUT = flags.DEFINE_string("out", "", "Output directory.")

FILES = ("pairs.jsonl", "examples.jsonl")
PROGRESS = "progress.json"  # {"problems": done, "bytes": {file: size after them}, "flags"}


def _flags() -> dict:
  cfg = _CONFIG.value
  return {
    "split": _SPLIT.value,
    "num_problems": _NUM.value,
    "samples": _SAMPLES.value,
    "batch_problems": _BATCH.value,
    "seed": cfg.seed,
    "model": cfg.model.to_dict(),
    "template": cfg.env.template,
    "temperature": cfg.sampling.temperature,
  }


def _resume(out: str) -> int:
  """Problems already written (0: a fresh start); files cut back to the last whole batch."""
  path = os.path.join(out, PROGRESS)
  if not os.path.exists(path):
    for name in FILES:
      open(os.path.join(out, name), "w", encoding="utf-8").close()
    return 0
  with open(path, encoding="utf-8") as f:
    progress = json.load(f)
  if progress["flags"] != _flags():
    raise errors.FlagError(
      f"--out={out}: holds the output of other settings ({progress['flags']}); use a new "
      "directory, or the same flags to continue it"
    )
  for name in FILES:
    with open(os.path.join(out, name), "r+", encoding="utf-8") as f:
      f.truncate(progress["bytes"][name])
  return progress["problems"]


def _append(out: str, rows: dict[str, list[dict]], done: int) -> None:
  sizes = {}
  for name in FILES:
    with open(os.path.join(out, name), "a", encoding="utf-8") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows[name])
      f.flush()
      os.fsync(f.fileno())
      sizes[name] = f.tell()
  tmp = os.path.join(out, PROGRESS + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"problems": done, "bytes": sizes, "flags": _flags()}, f)
  os.replace(tmp, os.path.join(out, PROGRESS))


def _summary(out: str) -> dict:
  rows = {}
  for name in FILES:
    with open(os.path.join(out, name), encoding="utf-8") as f:
      rows[name] = [json.loads(line) for line in f]
  examples, pairs = rows["examples.jsonl"], rows["pairs.jsonl"]
  return {
    **_flags(),
    "examples": len(examples),
    "correct": sum(e["label"] for e in examples) / max(len(examples), 1),
    "problems_with_a_correct_sample": len({e["problem"] for e in examples if e["label"]}),
    "pairs": len(pairs),
    "pairs_chosen_from_samples": sum(p["chosen_source"] == "sample" for p in pairs),
  }


def main(argv):
  del argv
  if _CONFIG.value is None:
    raise errors.FlagError("--config: give a GRPO or PPO config (its model, sampling, env)")
  if not _OUT.value:
    raise errors.FlagError("--out: give the output directory")
  for name, flag in (("samples", _SAMPLES), ("batch_problems", _BATCH), ("num_problems", _NUM)):
    if flag.value < 1:
      raise errors.FlagError(f"--{name}={flag.value}: must be >= 1")
  cfg = _CONFIG.value
  problems = gsm8k.load_gsm8k(_SPLIT.value, cfg.env.data_dir)[: _NUM.value]
  os.makedirs(_OUT.value, exist_ok=True)
  done = _resume(_OUT.value)
  sample = eval_recipe.solution_sampler(cfg)
  key, k, size = jax.random.key(cfg.seed), _SAMPLES.value, _BATCH.value
  for first in tqdm.trange(done, len(problems), size, desc="outcome pairs", dynamic_ncols=True):
    chunk = problems[first : first + size]
    completions = sample(chunk, jax.random.fold_in(key, first), k)
    pairs, examples = outcome_pairs.records(chunk, completions, k)
    for r in pairs + examples:
      r["problem"] += first
    _append(_OUT.value, {"pairs.jsonl": pairs, "examples.jsonl": examples}, first + len(chunk))
  summary = _summary(_OUT.value)
  with open(os.path.join(_OUT.value, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  print(json.dumps(summary, indent=1))


if __name__ == "__main__":
  cli.run(main)
