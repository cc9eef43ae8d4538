"""The GRPO experiment driver: config -> model, task, state -> resumable loop of iterations."""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rlpost import grpo
from rlpost import host_memory
from rlpost import run
from rlpost import train
from rlpost.data.cursor import Cursor
from rlpost.data.tasks import Task, load_task
from rlpost.models import loading
from rlpost.models import lora


class Pieces(NamedTuple):
  """Everything a GRPO run is built from (see `build`)."""
  setup: grpo.Setup
  tokenizer: Any
  task: Task
  state: train.TrainState   # fresh: step 0, new adapters (or the params), optimizer state
  frozen: Any               # base params under LoRA, else None
  ref_params: Any           # reference policy params (None when beta == 0 and no LoRA)
  train_step: Any


def build(cfg, loaded=None) -> Pieces:
  """Loads the model (or takes `loaded` = (config, params, tokenizer)) and builds the run."""
  grpo.validate(cfg)
  m = cfg.model
  model_config, params, tokenizer = loaded or loading.load_model(m.preset, m.weights, m.path,
                                                                 m.dtype, cfg.seed)
  setup = grpo.make_setup(cfg, model_config, tokenizer)
  task = load_task(cfg.data, "train", cfg.seed)
  key = jax.random.key(cfg.seed)
  if setup.lora:
    trainable, frozen, ref_params = lora.init_adapters(key, params, setup.lora), params, params
  elif setup.algo.beta > 0:  # updates are donated: train a copy, keep `params` as reference
    trainable, frozen, ref_params = jax.tree.map(jnp.copy, params), None, params
  else:
    trainable, frozen, ref_params = params, None, None
  t = cfg.train
  optimizer = train.make_optimizer(
      learning_rate=t.learning_rate, total_steps=t.steps * setup.num_iterations,
      warmup_fraction=t.warmup_fraction, weight_decay=t.weight_decay, b1=t.adam_b1,
      b2=t.adam_b2, max_grad_norm=t.max_grad_norm)
  mesh = train.make_mesh()
  # Placed with the sharding train_step returns, so step 2 reuses step 1's compilation.
  state = train.replicate(train.init_train_state(trainable, optimizer,
                                                 jax.random.fold_in(key, 1)), mesh)
  frozen = train.replicate(frozen, mesh)
  ref_params = frozen if setup.lora else train.replicate(ref_params, mesh)
  train_step = train.make_train_step(grpo.make_loss_fn(setup), optimizer, mesh,
                                     setup.micro_batch_size)
  host_memory.release_freed_memory()   # weight loading / initialization temporaries
  return Pieces(setup, tokenizer, task, state, frozen, ref_params, train_step)


def run_experiment(cfg, workdir: str, stop_after: int | None = None, loaded=None):
  """Trains until cfg.train.steps iterations are done (or `stop_after` in this call).

  Resumes from the newest checkpoint in `workdir`. Returns the final TrainState.
  """
  p = build(cfg, loaded)
  fresh_meta = {"iteration": 0, "cursor": Cursor(cfg.seed)._asdict()}
  the_run, state, meta, _ = run.start(workdir, cfg, p.state, fresh_meta, cfg.checkpoint.keep)
  cursor = Cursor(**meta["cursor"])
  first, steps = meta["iteration"], cfg.train.steps
  last = steps if stop_after is None else min(steps, first + stop_after)
  bar = run.progress(first, steps, f"grpo[{cfg.algo.name}]")
  for index in range(first, last):
    state, cursor, metrics = grpo.iteration(p.setup, state, p.frozen, p.ref_params, p.train_step,
                                            p.task.problems, cursor, index, p.tokenizer,
                                            p.task.reward_fns, p.task.accuracy_fns,
                                            p.task.examples)
    record = run.log(the_run, index + 1, metrics)
    bar.update(1)
    bar.set_postfix(reward=f"{record['reward/mean']:.3f}", kl=f"{record.get('kl', 0.0):.4f}")
    if (index + 1) % cfg.checkpoint.every == 0 or index + 1 == last:
      run.save(the_run, state, {"iteration": index + 1, "cursor": cursor._asdict()})
  bar.close()
  png = run.finish(the_run, ["reward/mean", "answer_accuracy", "format_accuracy", "kl"],
                   f"GRPO ({cfg.algo.name})")
  print(f"metrics: {the_run.metrics_path}  curves: {png}")
  return state
