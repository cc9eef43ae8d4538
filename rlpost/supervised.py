"""The SFT and DPO experiments: config validation, data, set-up and the training loop.

`train_sft(cfg, workdir)` / `train_dpo(cfg, workdir)` run an experiment from its
ConfigDict (experiments/configs/sft.py, dpo.py). Both share `fit`: per step a
host batch (numpy) from the resumable data cursor, one jitted train step, the
metrics record, an evaluation every `eval.every` steps, and a checkpoint of
TrainState + cursor every `checkpoint.every` steps, through `rlpost.run`.
"""
import os
import time
from typing import Callable

import jax

from rlpost import dpo
from rlpost import run
from rlpost import sft
from rlpost import train
from rlpost.data import chat
from rlpost.data import cursor as cursor_lib
from rlpost.data import gsm8k
from rlpost.models import gemma3
from rlpost.models import loading
from rlpost.models import lora as lora_lib

SFT_SOURCES = ("gsm8k", "jsonl", "synthetic")
DPO_SOURCES = ("jsonl", "synthetic")
REMAT = {"none": None, "dots": "dots", "full": "full"}   # config name -> gemma3.forward's


def _fail(field: str, value, fix: str):
  raise ValueError(f"config.{field}={value!r}: {fix}")


def check_config(cfg, sources: tuple[str, ...]) -> None:
  """Raises ValueError naming the first invalid field, its value and the fix."""
  t = cfg.train
  if t.steps < 1:
    _fail("train.steps", t.steps, "must be >= 1")
  if t.micro_batch_size < 1 or t.batch_size < 1 or t.batch_size % t.micro_batch_size:
    _fail("train.batch_size", t.batch_size, f"must be a positive multiple of "
          f"train.micro_batch_size={t.micro_batch_size}")
  if t.batch_size % jax.device_count():
    _fail("train.batch_size", t.batch_size, f"must be divisible by the {jax.device_count()} "
          "devices")
  if t.learning_rate <= 0:
    _fail("train.learning_rate", t.learning_rate, "must be > 0")
  if t.remat not in REMAT:
    _fail("train.remat", t.remat, f"unknown; valid: {tuple(REMAT)}")
  if t.compute_dtype not in gemma3.COMPUTE_DTYPES:
    _fail("train.compute_dtype", t.compute_dtype, f"unknown; valid: {gemma3.COMPUTE_DTYPES}")
  if t.gather_bucket < 1:
    _fail("train.gather_bucket", t.gather_bucket, "must be >= 1 (tokens)")
  d = cfg.data
  if d.path and d.source != "jsonl":
    _fail("data.source", d.source, f"data.path={d.path!r} is set: use data.source='jsonl' "
          "(or clear data.path)")
  if d.source not in sources:
    _fail("data.source", d.source, f"unknown; valid sources: {sources}")
  if d.source == "jsonl" and not d.path:
    _fail("data.path", d.path, "data.source='jsonl' needs a JSONL file: "
          "--config.data.path=FILE.jsonl")
  for field in ("path", "eval_path"):
    if d.get(field) and not os.path.isfile(d[field]):
      _fail(f"data.{field}", d[field], "no such file")
  if d.seq_len < 2:
    _fail("data.seq_len", d.seq_len, "must be >= 2 tokens")
  if cfg.eval.every < 0 or cfg.checkpoint.every < 1:
    _fail("eval.every / checkpoint.every", (cfg.eval.every, cfg.checkpoint.every),
          "eval.every must be >= 0 (0: never) and checkpoint.every >= 1")
  if cfg.lora.enabled:
    lora_config(cfg)


def lora_config(cfg) -> lora_lib.LoraConfig:
  targets = tuple(s.strip() for s in cfg.lora.targets.split(",") if s.strip())
  return lora_lib.LoraConfig(rank=cfg.lora.rank, alpha=cfg.lora.alpha, targets=targets)


def setup(cfg):
  """(model config, params, tokenizer, trainable, frozen, lora_scale)."""
  m = cfg.model
  model_config, params, tokenizer = loading.load_model(m.preset, m.weights, m.path, m.dtype,
                                                       cfg.seed)
  if not cfg.lora.enabled:
    return model_config, params, tokenizer, params, None, 1.0
  lc = lora_config(cfg)
  adapters = lora_lib.init_adapters(jax.random.key(cfg.seed + 1), params, lc)
  return model_config, params, tokenizer, adapters, params, lc.scale


def make_optimizer(cfg):
  t = cfg.train
  return train.make_optimizer(learning_rate=t.learning_rate, total_steps=t.steps,
                              warmup_fraction=t.warmup_fraction, weight_decay=t.weight_decay,
                              b1=t.adam_b1, b2=t.adam_b2, max_grad_norm=t.max_grad_norm or None)


def fit(cfg, workdir: str, *, state, frozen, train_step, next_batch: Callable,
        evaluate: Callable | None, curves: list[str], title: str, stop_after: int | None = None):
  """The training loop; returns (state, last metrics record).

  next_batch(cursor) -> (batch, cursor, host metrics); evaluate(state) -> metrics.
  stop_after: leave after this many steps of this call (tests of resumption).
  """
  fresh_meta = {"iteration": 0, "cursor": cursor_lib.Cursor(cfg.seed)._asdict()}
  # Replicated on the mesh up front: the step's output state has that sharding, so the
  # second step reuses the first step's compilation.
  mesh = train.make_mesh()
  state, frozen = train.replicate(state, mesh), train.replicate(frozen, mesh)
  handle, state, meta, resumed = run.start(workdir, cfg, state, fresh_meta,
                                           keep=cfg.checkpoint.keep)
  first, cursor = int(meta["iteration"]), cursor_lib.Cursor(**meta["cursor"])
  if not resumed and evaluate is not None and cfg.eval.every:
    run.log(handle, 0, evaluate(state))
  record, steps = {}, cfg.train.steps
  with run.progress(first, steps, title) as bar:
    for it in range(first, min(steps, first + (stop_after or steps))):
      started = time.perf_counter()
      batch, cursor, host = next_batch(cursor)
      state, metrics = train_step(state, frozen, batch)
      record = {**jax.device_get(metrics), **host,
                "step_seconds": time.perf_counter() - started}
      done = it + 1
      if evaluate is not None and cfg.eval.every and (done % cfg.eval.every == 0 or
                                                      done == steps):
        record.update(evaluate(state))
      record = run.log(handle, done, record)
      if done % cfg.checkpoint.every == 0 or done == steps:
        run.save(handle, state, {"iteration": done, "cursor": cursor._asdict()})
      bar.update(1)
      bar.set_postfix(loss=f"{record['loss']:.4f}")
  run.finish(handle, curves, title)
  return state, record


def _sft_examples(records, tokenizer, seq_len):
  return [chat.tokenize_sft(r, tokenizer, seq_len) for r in records]


def sft_records(cfg) -> tuple[list[dict], list[dict]]:
  """(train records, held-out eval records) of `data.source` (configs/sft.py)."""
  d, n_eval = cfg.data, cfg.eval.num_examples
  if d.source == "gsm8k":
    train_records = chat.gsm8k_sft_records(gsm8k.load_gsm8k("train", d.data_dir))
    eval_records = chat.gsm8k_sft_records(gsm8k.load_gsm8k("test", d.data_dir)[:n_eval])
  else:
    if d.source == "jsonl":
      records = chat.load_sft_jsonl(d.path)
    else:
      records = sft.synthetic_records(d.num_synthetic, cfg.seed)
    if d.eval_path:
      train_records, eval_records = records, chat.load_sft_jsonl(d.eval_path)[:n_eval]
    else:
      n_eval = min(n_eval, len(records) - 1) if cfg.eval.every else 0
      train_records, eval_records = records[:len(records) - n_eval], records[len(records) - n_eval:]
  if d.num_examples:
    train_records = train_records[:d.num_examples]
  return train_records, eval_records


def train_sft(cfg, workdir: str, stop_after: int | None = None):
  """Runs SFT from a configs/sft.py ConfigDict; returns (state, last metrics record)."""
  check_config(cfg, SFT_SOURCES)
  model_config, _, tokenizer, trainable, frozen, scale = setup(cfg)
  d, t = cfg.data, cfg.train
  train_records, eval_records = sft_records(cfg)
  examples = _sft_examples(train_records, tokenizer, d.seq_len)
  eval_examples = _sft_examples(eval_records, tokenizer, d.seq_len)
  lengths = [len(e[0]) for e in examples]
  optimizer = make_optimizer(cfg)
  loss_fn = sft.make_loss_fn(model_config, lora=cfg.lora.enabled, lora_scale=scale,
                             chunk=t.logprob_chunk, remat=REMAT[t.remat],
                             compute_dtype=t.compute_dtype)
  train_step = train.make_train_step(loss_fn, optimizer, train.make_mesh(), t.micro_batch_size)
  state = train.init_train_state(trainable, optimizer, jax.random.key(cfg.seed))
  batch_args = dict(seq_len=d.seq_len, pad_id=tokenizer.pad_id, gather_bucket=t.gather_bucket)

  def next_batch(cursor):
    indices, cursor = sft.next_examples(cursor, lengths, rows=t.batch_size, seq_len=d.seq_len,
                                        pack=d.pack, shuffle=d.shuffle)
    batch = sft.make_batch([examples[i] for i in indices], micro_batch_size=t.micro_batch_size,
                           pack=d.pack, num_rows=t.batch_size, **batch_args)
    return batch, cursor, sft.batch_stats(batch)

  evaluate = None
  if eval_examples:
    eval_fn = sft.make_eval_fn(model_config, lora=cfg.lora.enabled, lora_scale=scale,
                               chunk=t.logprob_chunk, compute_dtype=t.compute_dtype)
    evaluate = lambda state: sft.evaluate(eval_fn, state.trainable, frozen, eval_examples,
                                          rows=t.micro_batch_size, **batch_args)
  return fit(cfg, workdir, state=state, frozen=frozen, train_step=train_step,
             next_batch=next_batch, evaluate=evaluate, title="sft", stop_after=stop_after,
             curves=["loss", "eval_loss", "eval_perplexity", "padding_efficiency"])


def dpo_records(cfg) -> list[dict]:
  if cfg.data.source == "jsonl":
    records = chat.load_dpo_jsonl(cfg.data.path)
  else:
    records = dpo.synthetic_pairs(cfg.data.num_synthetic, cfg.seed)
  return records[:cfg.data.num_examples] if cfg.data.num_examples else records


def check_dpo_config(cfg) -> None:
  check_config(cfg, DPO_SOURCES)
  if cfg.dpo.beta <= 0:
    _fail("dpo.beta", cfg.dpo.beta, "must be > 0 (typical: 0.1)")
  if not 0 <= cfg.dpo.label_smoothing < 0.5:
    _fail("dpo.label_smoothing", cfg.dpo.label_smoothing, "must be in [0, 0.5)")


def train_dpo(cfg, workdir: str, stop_after: int | None = None):
  """Runs DPO from a configs/dpo.py ConfigDict; returns (state, last metrics record)."""
  check_dpo_config(cfg)
  model_config, params, tokenizer, trainable, frozen, scale = setup(cfg)
  d, t = cfg.data, cfg.train
  pairs = dpo.tokenize_pairs(dpo_records(cfg), tokenizer, d.seq_len)
  reference = params if cfg.lora.enabled else dpo.initial_reference(params)
  optimizer = make_optimizer(cfg)
  loss_fn = dpo.make_loss_fn(model_config, lora=cfg.lora.enabled, lora_scale=scale,
                             beta=cfg.dpo.beta, label_smoothing=cfg.dpo.label_smoothing,
                             chunk=t.logprob_chunk, remat=REMAT[t.remat],
                             compute_dtype=t.compute_dtype)
  train_step = train.make_train_step(loss_fn, optimizer, train.make_mesh(), t.micro_batch_size)
  ref_fn = dpo.make_reference_fn(model_config, t.micro_batch_size, chunk=t.logprob_chunk,
                                 compute_dtype=t.compute_dtype)
  state = train.init_train_state(trainable, optimizer, jax.random.key(cfg.seed))

  def next_batch(cursor):
    indices, cursor = cursor_lib.next_indices(cursor, len(pairs), t.batch_size, d.shuffle)
    batch = dpo.make_pair_batch([pairs[i] for i in indices], seq_len=d.seq_len,
                                pad_id=tokenizer.pad_id, micro_batch_size=t.micro_batch_size,
                                gather_bucket=t.gather_bucket)
    batch = jax.device_get(ref_fn(reference, batch))
    return batch, cursor, dpo.pair_stats(batch)

  return fit(cfg, workdir, state=state, frozen=frozen, train_step=train_step,
             next_batch=next_batch, evaluate=None, title="dpo", stop_after=stop_after,
             curves=["loss", "reward_margin", "reward_accuracy"])

