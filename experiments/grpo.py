r"""GRPO-family RL: `python -m experiments.grpo --config=experiments/configs/grpo_gsm8k.py:gemma3_270m --workdir=DIR`.

Resumes automatically from the newest checkpoint in --workdir.
"""
from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags

from rlpost import grpo
from rlpost import run
from rlpost import train
from rlpost.data.cursor import Cursor
from rlpost.data.tasks import load_task
from rlpost.models import loading
from rlpost.models import lora

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/grpo_gsm8k.py:tiny",
                                          "GRPO config (path.py:variant).")
_WORKDIR = flags.DEFINE_string("workdir", "", "Checkpoints and metrics go here.")


def main(argv):
  del argv
  cfg = _CONFIG.value
  grpo.validate(cfg)
  m = cfg.model
  model_config, params, tokenizer = loading.load_model(m.preset, m.weights, m.path, m.dtype,
                                                       cfg.seed)
  setup = grpo.make_setup(cfg, model_config, tokenizer)
  task = load_task(cfg.data, "train", cfg.seed)
  key = jax.random.key(cfg.seed)
  if setup.lora:
    trainable, frozen, ref_params = lora.init_adapters(key, params, setup.lora), params, params
  else:  # the reference must survive the donated updates of `params`: keep a copy
    trainable, frozen = params, None
    ref_params = jax.tree.map(jnp.copy, params) if setup.algo.beta > 0 else None
  t = cfg.train
  optimizer = train.make_optimizer(
      learning_rate=t.learning_rate, total_steps=t.steps * setup.num_iterations,
      warmup_fraction=t.warmup_fraction, weight_decay=t.weight_decay, b1=t.adam_b1,
      b2=t.adam_b2, max_grad_norm=t.max_grad_norm)
  state = train.init_train_state(trainable, optimizer, jax.random.fold_in(key, 1))
  train_step = train.make_train_step(grpo.make_loss_fn(setup), optimizer, train.make_mesh(),
                                     setup.micro_batch_size)
  fresh_meta = {"iteration": 0, "cursor": Cursor(cfg.seed)._asdict()}
  the_run, state, meta, _ = run.start(_WORKDIR.value, cfg, state, fresh_meta, cfg.checkpoint.keep)
  cursor = Cursor(**meta["cursor"])
  bar = run.progress(meta["iteration"], t.steps, f"grpo[{cfg.algo.name}]")
  for index in range(meta["iteration"], t.steps):
    state, cursor, metrics = grpo.iteration(setup, state, frozen, ref_params, train_step,
                                            task.problems, cursor, index, tokenizer,
                                            task.reward_fns, task.accuracy_fns, task.examples)
    record = run.log(the_run, index + 1, metrics)
    bar.update(1)
    bar.set_postfix(reward=f"{record['reward/mean']:.3f}", kl=f"{record.get('kl', 0.0):.4f}")
    if (index + 1) % cfg.checkpoint.every == 0 or index + 1 == t.steps:
      run.save(the_run, state, {"iteration": index + 1, "cursor": cursor._asdict()})
  bar.close()
  png = run.finish(the_run, ["reward/mean", "answer_accuracy", "format_accuracy", "kl"],
                   f"GRPO ({cfg.algo.name})")
  print(f"metrics: {the_run.metrics_path}  curves: {png}")


if __name__ == "__main__":
  app.run(main)
