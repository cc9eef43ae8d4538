"""A reward model trained on preference pairs, from a ConfigDict (experiments/configs/
reward_model.py).

Per step: the next pairs from the resumable cursor, DPO's pair batch, one jitted train
step of the Bradley-Terry loss on the scores of the chosen and rejected halves
(`supervised.reward_model`), through the one run loop; every `eval.every` steps (and at
the end) the held-out pairs' pairwise accuracy. The state is checkpointed and resumed as
every run's.

`score_examples` scores labelled (KTO-format) samples with a trained run, for judging it as
a correct/incorrect classifier (`supervised.classifier_metrics`).
"""

import functools
import os

import jax
import numpy as np
import tqdm

from rlpost import errors
from rlpost.data import chat
from rlpost.data import jsonl
from rlpost.recipes import common
from rlpost.recipes import supervised_run
from rlpost.supervised import dpo
from rlpost.supervised import reward_model
from rlpost.supervised import sft
from rlpost.train import loop as loop_lib
from rlpost.train import sharding
from rlpost.train import step as step_lib

SOURCES = ("jsonl", "synthetic")
EVAL_ROWS = 8  # held-out pairs scored per call
SCORE_BUCKET = 64  # `score_examples` pads each chunk to a multiple of this


def check_config(cfg):
  """`supervised_run.check_config` over the pair sources. Returns the forward config."""
  return supervised_run.check_config(cfg, SOURCES)


def records(cfg) -> tuple[list[dict], list[dict]]:
  """(training pairs, held-out pairs): `data.eval_path`'s pairs, else the last
  `eval.num_examples` pairs of the data (at most half of them)."""
  d, n_eval = cfg.data, cfg.eval.num_examples
  pairs = supervised_run.load_pairs(cfg)
  if d.eval_path:
    return pairs, chat.load_dpo_jsonl(d.eval_path)[:n_eval]
  if n_eval > len(pairs) // 2:
    common.fail(
      "eval.num_examples",
      n_eval,
      f"would hold out {n_eval} of {len(pairs)} pairs: hold out at most half "
      f"({len(pairs) // 2}), or give a separate data.eval_path",
    )
  return pairs[: len(pairs) - n_eval], pairs[len(pairs) - n_eval :]


def make_evaluate(held_out, frozen, fwd, seq_len: int, pad_id: int):
  """`evaluate(state) -> {"eval/accuracy", "eval/margin"}` over the held-out pairs
  (tokenized (prompt, chosen, rejected)), EVAL_ROWS at a time; None without pairs."""
  if not held_out:
    return None
  score = jax.jit(functools.partial(reward_model.scores, fwd=fwd))
  chunks = []
  for first in range(0, len(held_out), EVAL_ROWS):
    part = list(held_out[first : first + EVAL_ROWS])
    n = len(part)
    part += part[:1] * (EVAL_ROWS - n)  # one shape for every chunk
    batch = dpo.make_pair_batch(part, seq_len=seq_len, pad_id=pad_id, micro_batch_size=1)
    chunks.append((batch, n))

  def evaluate(state):
    margins = []
    for batch, n in chunks:
      chosen, rejected = (score(state.trainable, frozen, batch[h]) for h in ("chosen", "rejected"))
      margins.append(np.asarray(chosen - rejected)[:n])
    margin = np.concatenate(margins)
    return {"eval/accuracy": float(np.mean(margin > 0)), "eval/margin": float(np.mean(margin))}

  return evaluate


def run(cfg, workdir: str, stop_after: int | None = None):
  """Trains a reward model; returns (state, last metrics record)."""
  cfg = common.with_compute_dtype(cfg, workdir)
  fwd = check_config(cfg)
  train_records, eval_records = records(cfg)  # a bad data file fails before the model loads
  _, params, tokenizer = common.load_model(cfg)
  trunk, frozen = common.trainable_and_frozen(params, fwd, jax.random.key(cfg.seed + 1))
  optimizer = common.make_optimizer(cfg, cfg.train.steps)
  mesh = common.make_mesh(cfg)
  trainable = reward_model.init(trunk, params)
  state = step_lib.place(
    step_lib.init_train_state(trainable, optimizer, jax.random.key(cfg.seed)), mesh
  )
  frozen = step_lib.place(frozen, mesh)
  d, t = cfg.data, cfg.train
  where = (lambda i: jsonl.where_of(d.path, i)) if d.source == "jsonl" else None
  tokenize = lambda r: chat.tokenize_dpo(r, tokenizer, d.seq_len)
  pairs = supervised_run.tokenize_records(train_records, tokenize, cfg, where)
  held_out = [tokenize(r) for r in eval_records]
  loss_fn = reward_model.make_loss_fn(sharding.train_forward(fwd, mesh))
  train_step = step_lib.make_train_step(loss_fn, optimizer, mesh, t.micro_batch_size)
  evaluate = make_evaluate(held_out, frozen, fwd, d.seq_len, tokenizer.pad_id)

  next_batch = supervised_run.pair_batches(pairs, dpo.make_pair_batch, cfg, tokenizer.pad_id, mesh)
  step_fn = functools.partial(
    supervised_run.supervised_step, train_step, frozen, next_batch, evaluate, cfg
  )
  loop = loop_lib.loop_config(cfg, "reward_model", ["loss", "accuracy", "margin"])
  return loop_lib.run_loop(workdir, cfg, state, step_fn, loop, stop_after=stop_after)


def score_examples(
  workdir: str, path: str, seq_len: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """(scores [N] float32, labels [N] bool) of the KTO-format records in the JSONL `path`
  ({"prompt", "completion", "label"}), scored by the reward-model run in `workdir` at each
  completion's last token, in rows of at most `seq_len` tokens (None: the run's
  `data.seq_len`; rows of similar length are scored together, padded to SCORE_BUCKET).
  A longer record is an error naming its file and line (a cut completion would be scored
  as another text)."""
  trainable, frozen, fwd, tokenizer = common.reward_model_from_run(workdir, field="workdir")
  if seq_len is None:
    seq_len = common.run_config(
      workdir, "workdir", "give a reward-model run's --workdir"
    ).data.seq_len
  records = chat.load_kto_jsonl(path)
  rows, labels = [], []
  for i, record in enumerate(records):
    try:
      prompt, completion, label = chat.tokenize_kto(record, tokenizer, 1 << 30)
    except ValueError as e:
      raise errors.DataError(f"{jsonl.where_of(path, i)}: {e}") from e
    if len(prompt) + len(completion) > seq_len:
      raise errors.DataError(
        f"{jsonl.where_of(path, i)}: prompt + completion is {len(prompt) + len(completion)} "
        f"tokens, longer than the scoring rows' seq_len={seq_len} (run {workdir}): "
        "score in longer rows (seq_len; at most the model's context), or shorter samples"
      )
    rows.append(chat.concat_prompt_response(prompt, completion))
    labels.append(label)
  score = jax.jit(functools.partial(reward_model.scores, fwd=fwd))
  # Shortest first, each chunk padded to its longest row rounded up to SCORE_BUCKET tokens
  # (a few shapes, far fewer padded tokens than rows of seq_len); scores back in file order.
  order = np.argsort([len(tokens) for tokens, _ in rows], kind="stable")
  scores = np.zeros(len(rows), np.float32)
  chunks = tqdm.trange(
    0, len(rows), EVAL_ROWS, desc=f"scoring {os.path.basename(path)}", leave=False
  )
  for first in chunks:
    picked = order[first : first + EVAL_ROWS]
    part = [rows[i] for i in picked]
    part += part[:1] * (EVAL_ROWS - len(part))  # one row count for every chunk
    width = min(seq_len, -(-max(len(t) for t, _ in part) // SCORE_BUCKET) * SCORE_BUCKET)
    batch = sft.make_batch(part, seq_len=width, pad_id=tokenizer.pad_id, micro_batch_size=1)
    scores[picked] = np.asarray(score(trainable, frozen, batch))[: len(picked)]
  return scores, np.asarray(labels, bool)
