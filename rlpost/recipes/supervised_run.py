"""What the supervised recipes (SFT, DPO) share: the config check, the model and train
state, record tokenization and the run loop's step (a helper module, not a recipe)."""

import logging
import os
import time

import jax

from rlpost import errors
from rlpost.data import chat
from rlpost.data import cursor as cursor_lib
from rlpost.data import limits
from rlpost.models import policy
from rlpost.recipes import common
from rlpost.supervised import dpo
from rlpost.train import shares
from rlpost.train import step as step_lib


def check_config(cfg, sources: tuple[str, ...]) -> policy.ForwardConfig:
  """Raises ValueError naming the first invalid field, its value and the fix.

  Returns the trainer's forward config (temperature 1).
  """
  fail, t = common.fail, cfg.train
  common.check_loop_settings(cfg)
  if t.micro_batch_size < 1 or t.batch_size < 1 or t.batch_size % t.micro_batch_size:
    fail(
      "train.batch_size",
      t.batch_size,
      f"must be a positive multiple of train.micro_batch_size={t.micro_batch_size}",
    )
  if common.mesh_config(cfg).rollout:
    fail(
      "mesh.rollout",
      cfg.mesh.rollout,
      "SFT and DPO do not sample: every device trains; set it to 0",
    )
  common.check_rows_per_device(cfg, t.batch_size, "train.batch_size")
  common.check_base_bits(cfg.model.get("base_bits", 32), cfg.lora.enabled)
  if t.gather_bucket < 1:
    fail("train.gather_bucket", t.gather_bucket, "must be >= 1 (tokens)")
  d = cfg.data
  if d.path and d.source != "jsonl":
    fail(
      "data.source",
      d.source,
      f"data.path={d.path!r} is set: use data.source='jsonl' (or clear data.path)",
    )
  if d.source not in sources:
    fail("data.source", d.source, f"unknown; valid sources: {sources}")
  if d.source == "jsonl" and not d.path:
    fail(
      "data.path", d.path, "data.source='jsonl' needs a JSONL file: --config.data.path=FILE.jsonl"
    )
  for field in ("path", "eval_path"):
    if d.get(field) and not os.path.isfile(d[field]):
      fail(f"data.{field}", d[field], "no such file")
  if d.seq_len < 2:
    fail("data.seq_len", d.seq_len, "must be >= 2 tokens")
  common.check_context(cfg, d.seq_len, "data.seq_len", d.seq_len, "a training row holds")
  if d.get("on_too_long", "skip") not in limits.ON_TOO_LONG:
    fail("data.on_too_long", d.on_too_long, f"use one of {limits.ON_TOO_LONG}")
  if cfg.get("eval") is not None and cfg.eval.every < 0:
    fail("eval.every", cfg.eval.every, "must be >= 0 (0: never)")
  if cfg.get("eval") is not None and cfg.eval.num_examples < 0:
    fail("eval.num_examples", cfg.eval.num_examples, "must be >= 0 records")
  if d.get("num_examples", 0) < 0:
    fail("data.num_examples", d.num_examples, "must be >= 0 (0: every record)")
  if d.source == "synthetic" and d.get("num_synthetic", 1) < 1:
    fail("data.num_synthetic", d.num_synthetic, "must be >= 1 record")
  return common.forward_config(cfg, temperature=1.0)


def setup(cfg, fwd: policy.ForwardConfig, loaded=None):
  """(model config, params, tokenizer, state, frozen): LoRA adapters or all params train.

  `loaded`: (config, params, tokenizer) already loaded for `cfg.model` (None: load it).
  """
  model_config, params, tokenizer = loaded or common.load_model(cfg)
  trainable, frozen = common.trainable_and_frozen(params, fwd, jax.random.key(cfg.seed + 1))
  optimizer = common.make_optimizer(cfg, cfg.train.steps)
  # Replicated on the mesh up front: the step's output state has that sharding, so the
  # second step reuses the first step's compilation.
  mesh = common.make_mesh(cfg)
  state = step_lib.place(
    step_lib.init_train_state(trainable, optimizer, jax.random.key(cfg.seed)), mesh
  )
  return model_config, params, tokenizer, state, step_lib.place(frozen, mesh), optimizer


def supervised_step(train_step, frozen, next_batch, evaluate, cfg, state, cursor, index):
  """The loop's step_fn for SFT and DPO: host batch, train step, metrics, due evaluation.

  next_batch(cursor) -> (batch, cursor, host metrics); evaluate(state) -> metrics or None.
  """
  started = time.perf_counter()
  batch, cursor, host = next_batch(cursor)
  state, metrics = train_step(state, frozen, batch)
  record = {**jax.device_get(metrics), **host, "step_seconds": time.perf_counter() - started}
  done, every = index + 1, cfg.eval.every if evaluate else 0
  if every and (done % every == 0 or done == cfg.train.steps):
    record.update(evaluate(state))
  return state, cursor, record


def tokenize_records(records, tokenize, cfg, where=None) -> list:
  """`tokenize(record)` of each record. A record whose prompt leaves no room for a response
  in data.seq_len tokens (it could never train) is left out and counted in the log
  (data.on_too_long='skip'), or stops the run naming it (`where(i)`: "path:line" of
  record i; None: "record i") with 'error'. No record left is an error either way. A
  record the layout refuses (a DataError: tool calls without a template, a template that
  cannot lay it out) stops the run naming it."""
  where = where or (lambda i: f"record {i}")
  out, dropped = [], []
  for i, record in enumerate(records):
    try:
      out.append(tokenize(record))
    except errors.DataError as e:  # a record the layout refuses (not a length): never skipped
      raise errors.DataError(f"{where(i)}: {e}") from None
    except ValueError as e:
      if cfg.data.get("on_too_long", "skip") == "error":
        raise errors.DataError(
          f"{where(i)}: {e}; or set data.on_too_long='skip' to leave such records out"
        ) from None
      dropped.append(i)
  if dropped and not out:
    common.fail(
      "data.seq_len",
      cfg.data.seq_len,
      f"no record's prompt leaves room for a response (first: {where(dropped[0])}); raise it",
    )
  if dropped:
    message = (
      f"data: left out {len(dropped)} of {len(records)} records whose prompt leaves no room "
      f"for a response in data.seq_len={cfg.data.seq_len} tokens (first: {where(dropped[0])}); "
      "data.on_too_long='error' stops at such a record instead"
    )
    logging.warning(message)
    print(message, flush=True)
  return out


def pair_batches(pairs: list, make_batch, cfg, pad_id: int, mesh):
  """`next_batch(cursor) -> (batch, cursor, host stats)` over tokenized `pairs` (or KTO
  examples): the next `train.batch_size` of them from the resumable cursor, this process's
  block (`shares.take`) laid out by `make_batch` (`supervised.dpo.make_pair_batch` or
  `make_kto_batch`), as the global batch; stats: each half's response tokens."""
  d, t = cfg.data, cfg.train

  def next_batch(cursor):
    indices, cursor = cursor_lib.next_indices(cursor, len(pairs), t.batch_size, d.shuffle)
    batch = make_batch(
      shares.take([pairs[i] for i in indices], "train.batch_size"),
      seq_len=d.seq_len,
      pad_id=pad_id,
      micro_batch_size=t.micro_batch_size,
      gather_bucket=t.gather_bucket,
    )
    stats = {
      f"{name}_tokens": shares.sum_over_processes(int(half["target_mask"].sum()))
      for name, half in batch.items()
      if isinstance(half, dict)
    }
    return step_lib.global_batch(batch, mesh, pad=True), cursor, stats

  return next_batch


def load_pairs(cfg, kto: bool = False) -> list[dict]:
  """The records of `data.source` for the pair recipes: `data.path`'s preference pairs
  (KTO: unpaired examples), or the synthetic ones; none is an error naming data.path."""
  d = cfg.data
  if d.source == "jsonl":
    out = (chat.load_kto_jsonl if kto else chat.load_dpo_jsonl)(d.path)
  else:
    out = (dpo.synthetic_kto if kto else dpo.synthetic_pairs)(d.num_synthetic, cfg.seed)
  if not out:
    what = "KTO examples" if kto else "preference pairs"
    common.fail("data.path", d.path, f"holds no {what}: point it at a non-empty JSONL file")
  return out
