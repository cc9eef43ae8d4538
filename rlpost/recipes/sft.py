"""Supervised fine-tuning from a ConfigDict (experiments/configs/sft.py).

`run(cfg, workdir)`: per step a host batch (numpy) from the resumable data
cursor, one jitted train step, the metrics record, a held-out evaluation every
`eval.every` steps (and once before training), through the one run loop
(`rlpost.train.loop`); what it shares with DPO is `rlpost.recipes.supervised_run`.
"""

import functools

import jax
import numpy as np
import logging

from rlpost import errors
from rlpost.data import chat
from rlpost.data import gsm8k
from rlpost.data import jsonl
from rlpost.data import template_sft
from rlpost.envs import tool_traces
from rlpost.envs import gsm8k_calc
from rlpost.envs import tool_functions
from rlpost.envs import tools
from rlpost.models import policy
from rlpost.recipes import common
from rlpost.recipes import supervised_run
from rlpost.supervised import sft
from rlpost.train import loop as loop_lib
from rlpost.train import shares
from rlpost.train import sharding
from rlpost.train import step as step_lib
from rlpost.text import chat_template
from rlpost.text import template_turns
from rlpost.text import tool_formats

SOURCES = ("gsm8k", "gsm8k_tools", "jsonl", "synthetic")
LAYOUTS = ("auto", "template", "chat")


def check_config(cfg) -> policy.ForwardConfig:
  """Raises ValueError naming the first invalid field, its value and the fix
  (`supervised_run.check_config` over SFT's data sources). Returns the trainer's
  forward config (temperature 1)."""
  fwd = supervised_run.check_config(cfg, SOURCES)
  layout, fmt = cfg.data.get("layout", "auto"), _tool_format_field(cfg)
  if layout not in LAYOUTS:
    common.fail("data.layout", layout, f"use one of {LAYOUTS}")
  if fmt not in ("native", *tool_formats.FORMATS):
    common.fail("tools.format", fmt, f"use native or one of {tuple(tool_formats.FORMATS)}")
  if fmt != "library" and cfg.data.source != "gsm8k_tools":
    common.fail("tools.format", fmt, "applies to data.source=gsm8k_tools: leave it library")
  if fmt != "library" and layout == "chat":
    common.fail(
      "tools.format", fmt, "a native format needs the chat template: data.layout=template"
    )
  return fwd


def _tool_format_field(cfg) -> str:
  return cfg.tools.format if cfg.get("tools") is not None else "library"


def chat_layout(cfg, tokenizer) -> template_turns.Layout | None:
  """The layout of the run's conversations (data.layout): the model's chat template
  (`model.chat_template`, else the model file's, rendered with `model.date_string`), or
  None for the family's hand-written format (`chat_formats`). "auto" takes the template
  when the run has one: the text the model is served with (and the one TRL trains on);
  models without one (the Gemma 3 270M base GGUF, the tiny byte tokenizer) keep the
  hand-written format, so their runs are as before."""
  layout = cfg.data.get("layout", "auto")
  if layout == "chat":
    return None
  template = chat_template.for_tokenizer(tokenizer, cfg.model.get("chat_template", ""))
  if template is None and layout == "template":
    common.fail(
      "data.layout",
      layout,
      "the model file carries no chat template: give one with --config.model.chat_template="
      "FILE (a .jinja file or a Hugging Face directory), or use data.layout=chat",
    )
  if template is None:
    return None
  return template_turns.Layout(template, (("date_string", cfg.model.date_string),))


def tool_format(cfg, layout: template_turns.Layout | None) -> str:
  """The gsm8k_tools traces' call format: tools.format resolved ("native": the one the chat
  template writes, `tool_formats.detect`; the library's when it has no tool section)."""
  name = _tool_format_field(cfg)
  if name == "library":
    return name
  if layout is None:
    common.fail(
      "tools.format",
      name,
      "needs the model's chat template: set data.layout=template and, "
      "when the model file carries none, model.chat_template=FILE",
    )
  if name != "native":
    return name
  try:
    return tool_formats.detect(layout.template.text)
  except ValueError as e:
    common.fail("tools.format", name, f"{layout.template.source}: {e}")


def records(cfg) -> tuple[list[dict], list[dict]]:
  """(train records, held-out eval records) of `data.source` (configs/sft.py)."""
  d, n_eval = cfg.data, cfg.eval.num_examples
  if d.source == "gsm8k":
    train_records = chat.gsm8k_sft_records(gsm8k.load_gsm8k("train", d.data_dir))
    eval_records = chat.gsm8k_sft_records(gsm8k.load_gsm8k("test", d.data_dir)[:n_eval])
  else:
    if d.source == "jsonl":
      all_records = chat.load_sft_jsonl(d.path)
      if not all_records:
        common.fail("data.path", d.path, "holds no records: point it at a non-empty JSONL file")
    else:
      all_records = sft.synthetic_records(d.num_synthetic, cfg.seed)
    if d.eval_path:
      held_out = chat.load_sft_jsonl(d.eval_path)
      train_records, eval_records = all_records, held_out[:n_eval]
      if cfg.eval.every and not held_out:  # else no evaluation, silently
        common.fail(
          "data.eval_path",
          d.eval_path,
          f"holds no records to evaluate every {cfg.eval.every} steps (eval.every): point it "
          "at a non-empty JSONL file, or set eval.every=0",
        )
    else:
      n_eval = n_eval if cfg.eval.every else 0
      if n_eval > len(all_records) // 2:
        common.fail(
          "eval.num_examples",
          n_eval,
          f"would hold out {n_eval} of the {len(all_records)} records of data.source="
          f"{d.source!r}, leaving {len(all_records) - n_eval} to train on: hold out at most "
          f"half ({len(all_records) // 2}), give a separate data.eval_path, or set "
          "eval.every=0 to train on every record",
        )
      cut = len(all_records) - n_eval
      train_records, eval_records = all_records[:cut], all_records[cut:]
  if d.num_examples:
    train_records = train_records[: d.num_examples]
  if not train_records:
    where = f"data.path={d.path!r}" if d.source == "jsonl" else f"data.source={d.source!r}"
    common.fail("data", where, "holds no training records: point it at a non-empty dataset")
  return train_records, eval_records


def tokenized_examples(cfg, tokenizer) -> tuple[list, list]:
  """(train, held-out) examples, each (tokens [T] int32, loss_mask [T] bool), T <= seq_len,
  laid out by `chat_layout` (the template: `template_sft`, loss on assistant spans).

  `gsm8k_tools`: GSM8K solutions as calculator tool traces, loss on the model's segments;
  in the library format the stream a `gsm8k_calc` rollout builds (zero-shot prompt, plain
  scaffold), in a native one the trace as a conversation (`tool_traces.conversation`) the
  template lays out with the calculator's schema; dropped solutions are counted in the log.
  """
  d, layout = cfg.data, chat_layout(cfg, tokenizer)
  if d.source != "gsm8k_tools":
    train_records, eval_records = records(cfg)
    if layout is None:
      tokenize = lambda r: chat.tokenize_sft(r, tokenizer, d.seq_len)
    else:
      tokenize = lambda r: template_sft.tokenize(chat.sft_record(r), tokenizer, layout, d.seq_len)
    where = (lambda i: jsonl.where_of(d.path, i)) if d.source == "jsonl" else None
    return supervised_run.tokenize_records(
      train_records, tokenize, cfg, where
    ), supervised_run.tokenize_records(eval_records, tokenize, cfg)
  fmt = tool_format(cfg, layout)
  out = []
  for split, limit in (("train", d.num_examples), ("test", cfg.eval.num_examples)):
    problems = gsm8k.load_gsm8k(split, d.data_dir)
    kept, dropped = tool_traces.tool_traces(problems, limit or None)
    read = len(kept) + sum(dropped.values())
    logging.info(
      "gsm8k_tools %s: %d traces kept of the first %d of %d problems, dropped %s",
      split,
      len(kept),
      read,
      len(problems),
      dropped,
    )
    if fmt == "library":
      out.append([trace_example(tokenizer, p, trace, d.seq_len) for p, trace in kept])
    else:
      out.append([native_trace_example(tokenizer, layout, p, t, d.seq_len) for p, t in kept])
  return out[0], out[1]


def native_trace_example(tokenizer, layout, problem, trace, max_len: int):
  """(tokens, loss_mask) of a tool trace as a conversation in the template's tool format."""
  observation = gsm8k_calc.first_observation(problem, shots=[], native=True)
  record = {
    "messages": tool_traces.conversation(observation, trace),
    "tools": tool_functions.schemas(tool_functions.function_tools(tools.REGISTRY)),
  }
  try:
    return template_sft.tokenize(record, tokenizer, layout, max_len)
  except chat_template.ChatTemplateError:
    raise
  except ValueError as e:
    raise errors.ConfigError(f"config.data.seq_len={max_len}: {e}; raise data.seq_len") from None


def trace_example(tokenizer, problem, trace, max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, loss_mask) of a tool trace, right-truncated to `max_len` (as chat.tokenize_sft)."""
  observation = gsm8k_calc.first_observation(problem, shots=[])
  ids, mask = tool_traces.trace_ids(tokenizer, "plain", observation, trace)
  if mask.index(1) >= max_len:
    raise errors.ConfigError(
      f"config.data.seq_len={max_len}: the tool-trace prompt of {problem.question[:60]!r} is "
      f"{mask.index(1)} tokens, so no model token fits; raise data.seq_len"
    )
  return np.asarray(ids[:max_len], np.int32), np.asarray(mask[:max_len], bool)


def local_batch(t, pack: bool, examples, batch_args) -> tuple[sft.Batch, dict]:
  """This process's rows of the batch of `examples` (all the step's, in stream order)
  and the whole batch's host stats.

  Unpacked, a process pads and places only its block of the examples, and the loss
  divisor counts every process's target tokens. Packed, first fit needs every
  example of the step, so the packed batch is built whole and sliced.
  """
  m = t.micro_batch_size
  if pack:
    batch = sft.make_batch(
      examples, micro_batch_size=m, pack=True, num_rows=t.batch_size, **batch_args
    )
    stats = sft.batch_stats(batch)
    return {k: shares.take(v, "train.batch_size") for k, v in batch.items()}, stats
  batch = sft.make_batch(
    shares.take(examples, "train.batch_size"), micro_batch_size=m, **batch_args
  )
  stats = {k: shares.sum_over_processes(v) for k, v in sft.batch_stats(batch).items()}
  stats["padding_efficiency"] /= jax.process_count()
  if jax.process_count() > 1:
    batch["token_divisor"][:] = sft.token_divisor(stats["target_tokens"], t.batch_size // m)
  return batch, stats


def run(cfg, workdir: str, stop_after: int | None = None, loaded=None):
  """Runs SFT from a configs/sft.py ConfigDict; returns (state, last metrics record).
  `loaded` as in `setup`."""
  cfg = common.with_compute_dtype(cfg, workdir)
  fwd = check_config(cfg)
  _, _, tokenizer, state, frozen, optimizer = supervised_run.setup(cfg, fwd, loaded)
  d, t = cfg.data, cfg.train
  examples, eval_examples = tokenized_examples(cfg, tokenizer)
  lengths = [len(e[0]) for e in examples]
  mesh = common.make_mesh(cfg)
  train_step = step_lib.make_train_step(
    sft.make_loss_fn(sharding.train_forward(fwd, mesh)), optimizer, mesh, t.micro_batch_size
  )
  batch_args = dict(seq_len=d.seq_len, pad_id=tokenizer.pad_id, gather_bucket=t.gather_bucket)

  def next_batch(cursor):
    indices, cursor = sft.next_examples(
      cursor, lengths, rows=t.batch_size, seq_len=d.seq_len, pack=d.pack, shuffle=d.shuffle
    )
    batch, stats = local_batch(t, d.pack, [examples[i] for i in indices], batch_args)
    return step_lib.global_batch(batch, mesh, pad=True), cursor, stats

  evaluate = None
  if eval_examples and cfg.eval.every:
    eval_fn = sft.make_eval_fn(fwd)
    evaluate = lambda state: sft.evaluate(
      eval_fn, state.trainable, frozen, eval_examples, rows=t.micro_batch_size, **batch_args
    )
  step_fn = functools.partial(
    supervised_run.supervised_step, train_step, frozen, next_batch, evaluate, cfg
  )
  loop = loop_lib.loop_config(
    cfg, "sft", ["loss", "eval_loss", "eval_perplexity", "padding_efficiency"]
  )
  return loop_lib.run_loop(
    workdir, cfg, state, step_fn, loop, initial_metrics=evaluate, stop_after=stop_after
  )
