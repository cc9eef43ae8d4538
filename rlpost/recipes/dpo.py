"""Preference tuning over pairs from a ConfigDict (experiments/configs/dpo.py).

Per step: the next preference pairs from the resumable cursor; for DPO their reference
sequence logprobs (base params with adapters off under LoRA, a copy of the initial
params otherwise; never differentiated); one jitted train step of the loss `cfg.loss`
names (dpo; kto over unpaired examples, `supervised.dpo.make_kto_batch`; or the
reference-free orpo and simpo, which load and run no reference), through the one run
loop (`rlpost.train.loop`).
"""

import dataclasses
import functools
import math

import jax

from rlpost.data import chat
from rlpost.data import jsonl
from rlpost.recipes import common
from rlpost.recipes import supervised_run
from rlpost.supervised import dpo
from rlpost.train import loop as loop_lib
from rlpost.train import sharding
from rlpost.train import step as step_lib

SOURCES = ("jsonl", "synthetic")


@dataclasses.dataclass(frozen=True)
class DPOConfig:
  """The `dpo` block: inverse temperature `beta` of the implicit reward, label smoothing."""

  beta: float = 0.1
  label_smoothing: float = 0.0

  def __post_init__(self):
    if not (math.isfinite(self.beta) and self.beta > 0):
      raise ValueError(f"DPOConfig.beta={self.beta!r}: must be a finite number > 0 (typical: 0.1)")
    if not 0 <= self.label_smoothing < 0.5:
      raise ValueError(f"DPOConfig.label_smoothing={self.label_smoothing!r}: must be in [0, 0.5)")


@dataclasses.dataclass(frozen=True)
class ORPOConfig:
  """The `orpo` block: `lam`, the paper's lambda (weight of the odds-ratio term)."""

  lam: float = 0.1

  def __post_init__(self):
    if not (math.isfinite(self.lam) and self.lam >= 0):
      raise ValueError(f"ORPOConfig.lam={self.lam!r}: must be a finite number >= 0 (paper: 0.1)")


@dataclasses.dataclass(frozen=True)
class SimPOConfig:
  """The `simpo` block: the reward scale `beta` and target reward margin `gamma`."""

  beta: float = 2.0
  gamma: float = 1.0

  def __post_init__(self):
    if not (math.isfinite(self.beta) and self.beta > 0):
      raise ValueError(
        f"SimPOConfig.beta={self.beta!r}: must be a finite number > 0 (paper: 2-2.5)"
      )
    if not math.isfinite(self.gamma):
      raise ValueError(f"SimPOConfig.gamma={self.gamma!r}: must be finite (paper: 0.5-1.5)")


@dataclasses.dataclass(frozen=True)
class KTOConfig:
  """The `kto` block: the value's scale `beta`, the desirable / undesirable weights."""

  beta: float = 0.1
  lambda_d: float = 1.0
  lambda_u: float = 1.0

  def __post_init__(self):
    for name in ("beta", "lambda_d", "lambda_u"):
      value = getattr(self, name)
      if not (math.isfinite(value) and value > 0):
        raise ValueError(f"KTOConfig.{name}={value!r}: must be a finite number > 0")


LOSS_CONFIGS = {"dpo": DPOConfig, "orpo": ORPOConfig, "simpo": SimPOConfig, "kto": KTOConfig}
CURVES = {  # the progress bar's and curves' metrics per loss
  "dpo": ["loss", "reward_margin", "reward_accuracy"],
  "orpo": ["loss", "nll", "log_odds_ratio", "reward_accuracy"],
  "simpo": ["loss", "reward_margin", "reward_accuracy"],
  "kto": ["loss", "kl", "desirable_reward", "undesirable_reward"],
}


def check_config(cfg):
  """The SFT checks with DPO's sources, then `loss` and its block. Returns (forward, loss
  name, its hyper-parameters: the block's dataclass)."""
  fwd = supervised_run.check_config(cfg, SOURCES)
  if cfg.loss not in LOSS_CONFIGS:
    common.fail("loss", cfg.loss, f"use one of {', '.join(LOSS_CONFIGS)}")
  if cfg.loss == "kto" and cfg.train.batch_size // jax.process_count() < 2:
    common.fail(
      "train.batch_size",
      cfg.train.batch_size,
      "KTO estimates its KL reference point from each process's examples under each "
      "other's prompts: use >= 2 examples per process",
    )
  return fwd, cfg.loss, common.from_block(LOSS_CONFIGS[cfg.loss], cfg[cfg.loss], cfg.loss)


def records(cfg) -> list[dict]:
  """The preference pairs of `data.source` (KTO: unpaired examples; the first
  `data.num_examples`; 0: all)."""
  d, out = cfg.data, supervised_run.load_pairs(cfg, kto=cfg.loss == "kto")
  return out[: d.num_examples] if d.num_examples else out


def run(cfg, workdir: str, stop_after: int | None = None):
  """Runs DPO (or ORPO, SimPO, KTO: `cfg.loss`) from a configs/dpo.py ConfigDict; returns
  (state, last metrics record)."""
  cfg = common.with_compute_dtype(cfg, workdir)
  fwd, loss, hparams = check_config(cfg)
  reference_free = loss in dpo.REFERENCE_FREE
  pair_records = records(cfg)  # a bad data file fails before the model is loaded
  _, params, tokenizer, state, frozen, optimizer = supervised_run.setup(cfg, fwd)
  d, t = cfg.data, cfg.train
  where = (lambda i: jsonl.where_of(d.path, i)) if d.source == "jsonl" else None
  kto = loss == "kto"
  tokenize = chat.tokenize_kto if kto else chat.tokenize_dpo
  pairs = supervised_run.tokenize_records(
    pair_records, lambda r: tokenize(r, tokenizer, d.seq_len), cfg, where
  )
  if reference_free:  # no reference copy, no reference pass
    reference, ref_fn = None, lambda _, batch: batch
  else:
    reference = params if fwd.lora else dpo.initial_reference(params)
    ref_fn = dpo.make_reference_fn(fwd, t.micro_batch_size)
  mesh = common.make_mesh(cfg)
  make_loss_fn = dpo.make_kto_loss_fn if kto else functools.partial(dpo.make_loss_fn, loss=loss)
  loss_fn = make_loss_fn(sharding.train_forward(fwd, mesh), **dataclasses.asdict(hparams))
  make_batch = dpo.make_kto_batch if kto else dpo.make_pair_batch
  train_step = step_lib.make_train_step(loss_fn, optimizer, mesh, t.micro_batch_size)

  pairs_batch = supervised_run.pair_batches(pairs, make_batch, cfg, tokenizer.pad_id, mesh)

  def next_batch(cursor):
    batch, cursor, stats = pairs_batch(cursor)
    return ref_fn(reference, batch), cursor, stats

  step_fn = functools.partial(
    supervised_run.supervised_step, train_step, frozen, next_batch, None, cfg
  )
  loop = loop_lib.loop_config(cfg, loss, CURVES[loss])
  return loop_lib.run_loop(workdir, cfg, state, step_fn, loop, stop_after=stop_after)
