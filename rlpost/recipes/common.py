"""ConfigDict -> static dataclasses, shared by the recipes (the only modules reading ConfigDicts).

A config block whose fields are a dataclass's fields is built with
`from_block(Dataclass, cfg.block, "block")`: an unknown field lists the valid
ones, a renamed field names its new place, and a dataclass's own validation
error names the config field (`block.field`), not the class.
"""

import copy
import dataclasses
import json
import math
import os

from absl import logging as absl_logging
import jax
import ml_collections

from rlpost import errors
from rlpost.models import families
from rlpost.models import loading
from rlpost.models import lora as lora_lib
from rlpost.models import policy
from rlpost.models import quant
from rlpost.models import q4_native
from rlpost.models import quant4
from rlpost.supervised import reward_model as reward_model_lib
from rlpost.train import checkpoint
from rlpost.train import compute_paths
from rlpost.train import shares
from rlpost.train import sharding
from rlpost.train import step as step_lib


def fail(field: str, value, fix: str):
  """Raises ConfigError `config.<field>=<value>: <fix>`."""
  raise errors.ConfigError(f"config.{field}={value!r}: {fix}")


def check_renamed(block, prefix: str, renamed: dict[str, str]) -> None:
  """Raises ConfigError for a field of `block` that `renamed` maps to its new name."""
  for name in block:
    if f"{prefix}.{name}" in renamed:
      raise errors.ConfigError(
        f"config.{prefix}.{name} is no longer a field: use config.{renamed[f'{prefix}.{name}']}"
      )


def from_block(cls, block, prefix: str, renamed: dict[str, str] | None = None):
  """`cls(**block)`, with errors that name `prefix.field` and the fix."""
  block = dict(block)
  check_renamed(block, prefix, renamed or {})
  valid = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(block) - set(valid))
  if unknown:
    names = ", ".join(f"config.{prefix}.{name}" for name in unknown)
    raise errors.ConfigError(f"{names}: no such field; valid fields of config.{prefix}: {valid}")
  return renaming_errors(cls, {n: prefix for n in valid}, **block)


def renaming_errors(cls, where: dict[str, str], **kwargs):
  """`cls(**kwargs)`; a ValueError `Cls.field=...` is re-raised as `config.<where>.field=...`."""
  try:
    return cls(**kwargs)
  except ValueError as e:
    message = str(e)
    for name, prefix in where.items():
      message = message.replace(f"{cls.__name__}.{name}=", f"config.{prefix}.{name}=")
    raise errors.ConfigError(message) from None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The `train` block of every recipe: the run's length, its batch, the optimizer and the
  trainer's forward settings (`compute_dtype`, `remat`, `logprob_chunk`: checked by
  `policy.ForwardConfig`). The batch field is the recipe's: `batch_size` (SFT, DPO, with
  `gather_bucket`), `batch_tasks` (RL: tasks per step, a dataset's prompts or an environment's).
  `optimizer` is one of step.OPTIMIZERS; `max_grad_norm` None or 0: no clipping."""

  steps: int = 1
  micro_batch_size: int = 1
  learning_rate: float = 1e-5
  warmup_fraction: float = 0.0
  weight_decay: float = 0.0
  adam_b1: float = 0.9
  adam_b2: float = 0.999
  optimizer: str = "adamw"
  max_grad_norm: float | None = None
  max_bad_steps: int = 3
  logprob_chunk: int = 256
  compute_dtype: str = "float32"
  remat: str = "dots"
  batch_size: int | None = None
  batch_tasks: int | None = None
  gather_bucket: int | None = None

  def __post_init__(self):
    """Finite and in range: a negative clip norm would flip every gradient; a warm-up
    fraction above 1 would never reach the peak rate."""
    bad = lambda field, fix: field_error(TrainConfig, field, getattr(self, field), fix)
    if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
      bad("learning_rate", "must be a finite number > 0")
    if self.optimizer not in step_lib.OPTIMIZERS:
      bad("optimizer", f"use one of {step_lib.OPTIMIZERS}")
    if not 0 <= self.warmup_fraction <= 1:
      bad("warmup_fraction", "must be in [0, 1] (a share of the steps)")
    if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
      bad("weight_decay", "must be a finite number >= 0")
    for field in ("adam_b1", "adam_b2"):
      if not 0 <= getattr(self, field) < 1:
        bad(field, "must be in [0, 1) (e.g. 0.9 and 0.999)")
    norm = self.max_grad_norm
    if norm is not None and not (math.isfinite(norm) and norm >= 0):
      bad("max_grad_norm", "must be a finite norm > 0, or 0 for no clipping")
    if self.max_bad_steps < 1:
      bad("max_bad_steps", "must be >= 1 (3 is a good default)")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """The `checkpoint` block: save every `every` steps, keep the newest `keep`."""

  every: int = 10
  keep: int = 3

  def __post_init__(self):
    if self.every < 1:
      field_error(CheckpointConfig, "every", self.every, "must be >= 1 step")
    if self.keep < 1:
      field_error(CheckpointConfig, "keep", self.keep, "must be >= 1 checkpoint")


def check_context(cfg, tokens: int, field: str, value, what: str) -> None:
  """Refuses `tokens` (what a sequence of this run can hold: `what`) above the model
  preset's context (`families.context_tokens`), naming `field`."""
  preset = cfg.model.preset
  context = families.context_tokens(preset)
  if context is not None and tokens > context:
    fail(
      field,
      value,
      f"{what} = {tokens} tokens, above {preset}'s context of {context}: lower it",
    )


def check_one_of(cls, field: str, value, choices) -> None:
  """`field_error` unless `value` is one of `choices`."""
  if value not in choices:
    field_error(cls, field, value, f"use one of {tuple(choices)}")


def field_error(cls, field: str, value, fix: str):
  """Raises the ValueError a config dataclass's `__post_init__` gives for a bad field,
  "Cls.field=value: fix" (`from_block` turns it into "config.block.field=value: fix")."""
  raise ValueError(f"{cls.__name__}.{field}={value!r}: {fix}")


def train_config(cfg) -> TrainConfig:
  """The `train` block as a TrainConfig (errors name `config.train.<field>`; an RLConfig's
  is typed already)."""
  if isinstance(cfg.train, TrainConfig):
    return cfg.train
  return from_block(TrainConfig, cfg.train, "train")


def check_loop_settings(cfg, min_steps: int = 1, steps_fix: str = "") -> None:
  """The `train` and `checkpoint` blocks (their own checks) and the steps and seed every
  recipe's loop needs."""
  train = train_config(cfg)
  if train.steps < min_steps:
    fail("train.steps", train.steps, steps_fix or f"must be >= {min_steps}")
  if getattr(cfg, "seed", None) is not None and cfg.seed < 0:
    fail("seed", cfg.seed, "must be >= 0")
  from_block(CheckpointConfig, cfg.checkpoint, "checkpoint")


def lora_config(cfg, always: bool = False) -> lora_lib.LoraConfig | None:
  """The `lora` block: None when disabled (unless `always`: a PPO critic's adapters)."""
  if not (cfg.lora.enabled or always):
    return None
  targets = tuple(s.strip() for s in cfg.lora.targets.split(",") if s.strip())
  try:
    return lora_lib.LoraConfig(rank=cfg.lora.rank, alpha=cfg.lora.alpha, targets=targets)
  except ValueError as e:
    raise errors.ConfigError(f"config.{e}") from None


def compute_dtype(cfg, workdir: str) -> str:
  """`train.compute_dtype`, with "auto" resolved to this machine's choice (or, on resume,
  the one in the run's config.json; `compute_paths`), logged. Every process takes
  process 0's choice."""
  setting = cfg.train.compute_dtype
  if setting != "auto":
    return setting
  dtype, why = compute_paths.resolve_for_run(setting, workdir, compute_paths.resolve)
  dtype = compute_paths.CHOICES[shares.from_first_process(compute_paths.CHOICES.index(dtype))]
  absl_logging.info("train.compute_dtype=auto -> %s (%s)", dtype, why)
  return dtype


def with_compute_dtype(cfg, workdir: str):
  """The run's resolved config: a copy of `cfg` with `compute_dtype(cfg, workdir)` in
  place of "auto" (what config.json records); `cfg` itself is never written."""
  if cfg.train.compute_dtype != "auto":
    return cfg
  resolved = copy.deepcopy(cfg)
  resolved.train.compute_dtype = compute_dtype(cfg, workdir)
  return resolved


def with_int8_paths(cfg, workdir: str):
  """A copy of `cfg` with `sampling.int8_paths="auto"` replaced by this machine's choice
  (or, on resume, the one in the run's config.json), as "LAYOUT:ROWS", logged; only when
  the sampler reads int8 weights. Every process takes process 0's choice."""
  s = cfg.get("sampling", {})
  if s.get("weights") != "int8" or s.get("int8_paths", "auto") != "auto":
    return cfg
  paths, why = compute_paths.int8_paths_for_run("auto", workdir)
  layout = quant.LAYER_LAYOUTS[
    shares.from_first_process(quant.LAYER_LAYOUTS.index(paths.layer_layout))
  ]
  rows = shares.from_first_process(paths.activations_left_max_rows)
  resolved = copy.deepcopy(cfg)
  resolved.sampling.int8_paths = quant.paths_text(quant.Int8Paths(layout, rows))
  absl_logging.info("sampling.int8_paths=auto -> %s (%s)", resolved.sampling.int8_paths, why)
  return resolved


def with_int4_matmul(cfg, workdir: str):
  """A copy of `cfg` with `sampling.int4_matmul="auto"` replaced by "native" or "xla"
  (`q4_native.resolve`; on resume, the run's config.json), logged; only when the sampler
  reads 4-bit weights. The two round differently, so a resumed run keeps its choice and
  every process takes process 0's."""
  s = cfg.get("sampling", {})
  if s.get("weights") != "int4" or s.get("int4_matmul", "auto") != "auto":
    return cfg
  recorded = compute_paths.recorded_setting(workdir, "sampling", "int4_matmul")
  if recorded in ("native", "xla"):
    choice, why = recorded, "recorded in the run's config.json (resumed run)"
  else:
    choice, why = q4_native.resolve("auto")
  choice = ("xla", "native")[shares.from_first_process(int(choice == "native"))]
  resolved = copy.deepcopy(cfg)
  resolved.sampling.int4_matmul = choice
  absl_logging.info("sampling.int4_matmul=auto -> %s (%s)", choice, why)
  return resolved


def forward_config(cfg, temperature: float) -> policy.ForwardConfig:
  """The trainer's forward: model preset, `lora`, `train.{compute_dtype, remat, logprob_chunk}`
  (compute_dtype "auto" not yet resolved by the recipe's run: this machine's choice)."""
  t = cfg.train
  where = {
    "compute_dtype": "train",
    "remat": "train",
    "logprob_chunk": "train",
    "temperature": "sampling",
  }
  return renaming_errors(
    policy.ForwardConfig,
    where,
    model=model_preset(cfg),
    lora=lora_config(cfg),
    compute_dtype=compute_dtype(cfg, ""),
    remat=t.remat,
    logprob_chunk=t.logprob_chunk,
    temperature=temperature,
  )


def model_preset(cfg):
  """The Config of `model.preset` (any family)."""
  try:
    return families.get_config(cfg.model.preset)
  except ValueError as e:
    raise errors.ConfigError(f"config.model.preset={cfg.model.preset!r}: {e}") from None


def mesh_config(cfg) -> sharding.MeshConfig:
  """The `mesh` block as a MeshConfig (absent: every device on `data`; an RLConfig's is
  typed already)."""
  block = getattr(cfg, "mesh", None)
  if block is None or isinstance(block, sharding.MeshConfig):
    return block or sharding.MeshConfig()
  return from_block(sharding.MeshConfig, block, "mesh")


def make_mesh(cfg):
  """The trainer's (data, fsdp) device mesh of the `mesh` block."""
  config = mesh_config(cfg)  # its errors name their field already
  try:
    return sharding.make_mesh(config)
  except ValueError as e:
    raise errors.ConfigError(f"config.mesh: {e}") from None


def rollout_mesh(cfg):
  """The sampler's own devices (`mesh.rollout`), or None: it shares the trainer's."""
  config = mesh_config(cfg)
  try:
    return sharding.rollout_mesh(config)
  except ValueError as e:
    raise errors.ConfigError(f"config.mesh: {e}") from None


def check_rows_per_device(cfg, rows: int, rows_text: str) -> None:
  """`rows` (one train step's batch; `rows_text` names the fields giving it) split evenly
  over the trainer mesh's devices, and train.micro_batch_size (rows per micro-batch on
  each device) divides each device's share."""
  micro, mesh = cfg.train.micro_batch_size, make_mesh(cfg)
  if rows % mesh.size:
    fail(
      "mesh",
      dict(mesh.shape),
      f"{rows_text} = {rows} rows do not split evenly over the trainer's {mesh.size} "
      f"devices: use a device count that divides {rows}, or change {rows_text}",
    )
  share = rows // mesh.size
  if micro < 1 or share % micro:
    split = (
      f"give {share} rows on each of the {mesh.size} devices, which are" if mesh.size > 1 else "are"
    )
    fail(
      "train.micro_batch_size",
      micro,
      f"{rows_text} = {rows} rows {split} not divisible by it; choose a divisor of {share}",
    )


def load_model(cfg):
  """(Config, params, tokenizer) of the `model` block (`init_from`: `weights_from_run`)."""
  m = cfg.model
  config, params, tokenizer = loading.load_model(m.preset, m.weights, m.path, m.dtype, cfg.seed)
  if getattr(m, "init_from", ""):
    params = weights_from_run(m.init_from, params, cfg)
  if getattr(m, "base_bits", 32) == 4:  # QLoRA: the frozen base NF4 (rebuilt on resume)
    params = quant4.frozen_base(params, qlora_embed_dtype(cfg))
  return config, params, tokenizer


def qlora_embed_dtype(cfg) -> str:
  """The dtype a QLoRA run keeps its frozen embedding in (`quant4.frozen_base`): bfloat16
  where the trainer's matmuls are bfloat16 (train.compute_dtype, "auto" resolved), else
  model.dtype."""
  return "bfloat16" if compute_dtype(cfg, "") == "bfloat16" else cfg.model.dtype


def check_base_bits(base_bits: int, lora_enabled: bool) -> None:
  """model.base_bits=4 needs LoRA: the 4-bit base is frozen."""
  if base_bits == 4 and not lora_enabled:
    fail(
      "model.base_bits",
      base_bits,
      "a 4-bit base is frozen and trains LoRA adapters only: set lora.enabled=True (or 32)",
    )


def run_config(workdir: str, field: str, fix: str) -> ml_collections.ConfigDict:
  """The config.json of the earlier run in `workdir`; its absence is an error naming
  `field`, ending with `fix`."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    fail(field, workdir, f"no config.json there: {fix}")
  with open(path, encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))


def weights_from_run(workdir: str, params, cfg):
  """The trained weights of the run in `workdir` (e.g. an SFT warm-start): its newest
  checkpoint's parameters, or its LoRA adapters merged into `params` (the same base).

  The earlier run's config.json rebuilds the shape of its train state (trainable
  part and AdamW state of `make_optimizer`: SFT, DPO and GRPO runs; an RL run's
  trainable is `{"policy": ...}`, and one written before that layout restores into it).
  """
  source = run_config(workdir, "model.init_from", "give the --workdir of an earlier run")
  for name in ("preset", "weights", "path", "dtype"):
    if source.model.get(name) != getattr(cfg.model, name, None):
      fail(
        "model.init_from",
        workdir,
        f"that run's model.{name} is {source.model.get(name)!r}, this run's "
        f"{getattr(cfg.model, name, None)!r}: its weights fit another base; use the same "
        "model block",
      )
  fwd = forward_config(source, 1.0)
  seed = getattr(cfg, "seed", None)
  if fwd.lora and source.model.weights == "random" and source.get("seed") != seed:
    fail(
      "model.init_from",
      workdir,
      f"that run's LoRA adapters were trained over random weights drawn with seed "
      f"{source.get('seed')!r}, this run's base is drawn with seed {seed!r}: use "
      f"--config.seed={source.get('seed')} (or a run over the same base)",
    )
  if fwd.lora and source.model.get("init_from"):  # its base was an earlier run's weights
    params = weights_from_run(source.model.init_from, params, source)
  trainable, _ = trainable_and_frozen(params, fwd, jax.random.key(0))
  rl = "algo" in source  # an RL learner's run (SFT and DPO configs have no algo block)
  if rl:
    trainable = {"policy": trainable}
  optimizer = make_optimizer(source, source.train.steps)
  like = step_lib.init_train_state(trainable, optimizer, jax.random.key(0))
  try:
    with checkpoint.manager(workdir, read_only=True) as mngr:
      restored = checkpoint.restore_latest(mngr, like, read_only=True)
  except checkpoint.StateMismatchError as e:
    fail("model.init_from", workdir, f"its checkpoint is not an SFT/DPO/GRPO train state: {e}")
  if restored is None:
    fail("model.init_from", workdir, "that run has no checkpoint yet")
  trained = restored[0].trainable["policy"] if rl else restored[0].trainable
  return lora_lib.merge(params, trained, fwd.lora) if fwd.lora else trained


def reward_model_from_run(workdir: str, field: str = "reward_model.path", shared=None):
  """(trainable, frozen, forward config, tokenizer) of the reward-model run in `workdir`
  (`experiments.reward_model`): its config.json's model (the base it trained over) and its
  newest intact checkpoint's score head and trunk, to score rows with
  `supervised.reward_model.batch_scores`. Errors name `field`.

  `shared`: (cfg, params, tokenizer) of the policy's base as loaded; a LoRA reward model
  over the same model block (and seed, for random weights) reads those params instead of
  loading a copy of its own."""
  source = run_config(workdir, field, "give a reward-model run's --workdir")
  fwd = forward_config(source, 1.0)
  if fwd.lora and shared is not None and _same_base(source, shared[0]):
    params, tokenizer = shared[1], shared[2]
  else:
    _, params, tokenizer = load_model(source)
  trunk, frozen = trainable_and_frozen(params, fwd, jax.random.key(0))
  like = step_lib.init_train_state(
    reward_model_lib.init(trunk, params),
    make_optimizer(source, source.train.steps),
    jax.random.key(0),
  )
  try:
    with checkpoint.manager(workdir, read_only=True) as mngr:
      restored = checkpoint.restore_latest(mngr, like, read_only=True)
  except checkpoint.StateMismatchError as e:
    fail(field, workdir, f"its checkpoint is not a reward model's train state: {e}")
  if restored is None:
    fail(field, workdir, "that reward-model run has no checkpoint yet")
  return restored[0].trainable, frozen, fwd, tokenizer


def _same_base(a, b) -> bool:
  """Whether two configs' `model` blocks load the same weights (random ones: same seed)."""
  fields = ("preset", "weights", "path", "dtype", "init_from")
  same = all(getattr(a.model, k, "") == getattr(b.model, k, "") for k in fields)
  return same and (a.model.weights != "random" or a.get("seed") == getattr(b, "seed", None))


def make_optimizer(cfg, total_steps: int, learning_rate: float | None = None):
  """AdamW of the `train` block, its schedule over `total_steps` optimizer steps.

  `learning_rate` overrides train.learning_rate (a PPO critic's own rate).
  """
  t = train_config(cfg)
  return step_lib.make_optimizer(
    learning_rate=t.learning_rate if learning_rate is None else learning_rate,
    total_steps=total_steps,
    warmup_fraction=t.warmup_fraction,
    weight_decay=t.weight_decay,
    b1=t.adam_b1,
    b2=t.adam_b2,
    max_grad_norm=t.max_grad_norm or None,
    optimizer=t.optimizer,
  )


def trainable_and_frozen(params, fwd: policy.ForwardConfig, key: jax.Array):
  """(trainable, frozen): fresh adapters over frozen params with LoRA, else (params, None)."""
  if fwd.lora:
    return lora_lib.init_adapters(key, params, fwd.lora), params
  return params, None
