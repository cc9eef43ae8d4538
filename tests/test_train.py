"""train_step: micro-batch accumulation and data-parallel shard_map agree with one big step;
non-finite steps never reach the weights; the run loop stops after too many of them."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import run_with_devices
from rlpost import errors
from rlpost.train import step as train


def _linear_loss(w, frozen, mb):
  del frozen
  err = mb["x"] @ w - mb["y"]
  return jnp.mean(err**2), {"mse": jnp.mean(err**2)}


def _run(num_devices: int, micro: int, steps: int = 3, optimizer: str = "sgd"):
  """Trains w [4] from zero; returns (w, last loss, first-step grad_norm, last "mse" metric).

  SGD by default: its update is proportional to the gradient, so a gradient
  summed instead of averaged (over micro-batches or devices) changes the weights.
  AdamW after global-norm clipping is blind to that scale.
  """
  if optimizer == "sgd":
    opt = optax.sgd(0.05)
  else:
    opt = train.make_optimizer(learning_rate=0.05, total_steps=steps, max_grad_norm=1.0)
  mesh = train.make_mesh(num_devices)
  state = train.place(train.init_train_state(jnp.zeros((4,)), opt, jax.random.key(0)), mesh)
  step = train.make_train_step(_linear_loss, opt, mesh, micro)
  x, y = _data()
  norms = []
  for _ in range(steps):
    state, metrics = step(state, None, {"x": x, "y": y})
    norms.append(float(metrics["grad_norm"]))
  return np.asarray(state.trainable), float(metrics["loss"]), norms[0], float(metrics["mse"])


def _data():
  x = jax.random.normal(jax.random.key(1), (8, 4))
  return x, x @ jnp.arange(1.0, 5.0)


def _analytic_first_grad_norm() -> float:
  """|d/dw mean((x w - y)^2)| at w = 0 is |-2 x^T y / N| (float64 NumPy)."""
  x, y = (np.asarray(a, np.float64) for a in _data())
  return float(np.linalg.norm(-2.0 * x.T @ y / len(y)))


def test_micro_batches_equal_one_batch():
  """The loss's own metrics are means over micro-batches too. Mutations caught: gradients
  summed over micro-batches (only loss/metrics divided); the metrics of the first
  micro-batch only (`train_step_metrics_of_one_micro_batch`)."""
  w1, l1, g1, m1 = _run(1, 8)
  w4, l4, g4, m4 = _run(1, 2)
  np.testing.assert_allclose(w4, w1, rtol=1e-5, atol=1e-6)
  assert abs(l4 - l1) < 1e-5 and abs(m4 - m1) < 1e-5 and abs(m1 - l1) < 1e-6
  np.testing.assert_allclose([g1, g4], _analytic_first_grad_norm(), rtol=1e-5)
  # AdamW is still exact across micro-batch splits (a weaker check: scale-blind).
  np.testing.assert_allclose(
    _run(1, 2, optimizer="adamw")[0], _run(1, 8, optimizer="adamw")[0], rtol=1e-5, atol=1e-6
  )


def test_rows_not_divisible_by_micro_batch_raise():
  with pytest.raises(ValueError, match="not divisible by micro_batch_size=3"):
    _run(1, 3)


def test_two_devices_equal_one_device():
  """Data-parallel over a 2-device CPU mesh (subprocess: device count is fixed at start-up).

  Mutation caught: gradients summed over devices (psum) instead of averaged (pmean).
  """
  run_with_devices(
    """
    import numpy as np
    import test_train
    w2, l2, g2, _ = test_train._run(2, 2)
    w1, l1, g1, _ = test_train._run(1, 4)
    np.testing.assert_allclose(w2, w1, rtol=1e-5, atol=1e-6)
    assert abs(l2 - l1) < 1e-5
    np.testing.assert_allclose([g1, g2], test_train._analytic_first_grad_norm(), rtol=1e-5)
    test_train.check_nan_step_is_skipped(num_devices=2)   # NaN rows on one device only
    import jax; assert len(jax.devices()) == 2
    """,
    devices=2,
    timeout=300,
  )


def check_nan_step_is_skipped(num_devices: int):
  """A NaN in some rows (with 2 devices: only the second device's rows) makes the loss and
  gradient non-finite: the whole step is skipped on every device, bitwise."""
  opt = optax.adamw(0.1)
  mesh = train.make_mesh(num_devices)
  step = train.make_train_step(_linear_loss, opt, mesh, micro_batch_size=2)
  state = train.place(train.init_train_state(jnp.zeros((4,)), opt, jax.random.key(0)), mesh)
  x, y = _data()
  state, _ = step(state, None, {"x": x, "y": y})  # one finite step: nonzero Adam moments
  before = jax.device_get((state.step, state.trainable, state.opt_state))
  y_nan = y.at[6].set(jnp.nan)  # a row of the last micro-batch / device
  for bad in (1, 2):
    state, metrics = step(state, None, {"x": x, "y": y_nan})
    assert not np.isfinite(float(metrics["loss"])) and float(metrics["skipped_nonfinite"]) == 1
    jax.tree.map(
      np.testing.assert_array_equal,
      jax.device_get((state.step, state.trainable, state.opt_state)),
      before,
    )
    assert int(state.bad_steps) == bad and int(state.total_bad_steps) == bad
  state, metrics = step(state, None, {"x": x, "y": y})
  assert float(metrics["skipped_nonfinite"]) == 0 and int(state.step) == 2
  assert int(state.bad_steps) == 0 and int(state.total_bad_steps) == 2


def test_nan_step_leaves_weights_and_optimizer_state_bitwise_unchanged():
  """Mutation caught: the update applied without the finite check (NaN weights)."""
  check_nan_step_is_skipped(num_devices=1)


@pytest.mark.parametrize(
  "field, value",
  [("steps", -1), ("checkpoint_every", 0), ("keep", 0), ("max_bad_steps", 0), ("steps", 2.5)],
)
def test_loop_config_rejects_bad_counts_naming_the_field(field, value):
  from rlpost.train import loop as loop_lib  # pylint: disable=g-import-not-at-top

  settings = {"steps": 10, "checkpoint_every": 1, field: value}
  with pytest.raises(ValueError, match=rf"LoopConfig\.{field}={value}: use an integer >= "):
    loop_lib.LoopConfig(**settings)


def test_run_loop_stops_after_max_bad_steps_and_logs_nan(tmp_path, monkeypatch):
  """Consecutive non-finite steps: NaN logged in JSONL and on the progress bar, then the
  named error after train.max_bad_steps; the weights were never touched."""
  from rlpost.train import loop as loop_lib  # pylint: disable=g-import-not-at-top

  opt = optax.sgd(0.1)
  mesh = train.make_mesh(1)
  step = train.make_train_step(_linear_loss, opt, mesh, micro_batch_size=8)
  state = train.place(train.init_train_state(jnp.ones((4,)), opt, jax.random.key(0)), mesh)
  x, y = _data()

  def step_fn(state, cursor, index):
    batch = {"x": x, "y": y if index < 2 else y.at[0].set(jnp.inf)}
    state, metrics = step(state, None, batch)
    return state, cursor._replace(position=index + 1), metrics

  loop = loop_lib.LoopConfig(steps=10, checkpoint_every=1, max_bad_steps=3, postfix=("loss",))
  closed, open_manager = [], loop_lib.checkpoint.manager

  def manager(*args, **kwargs):  # the real manager, its close() recorded
    mngr = open_manager(*args, **kwargs)
    close = mngr.close
    mngr.close = lambda: (closed.append(True), close())[1]
    return mngr

  monkeypatch.setattr(loop_lib.checkpoint, "manager", manager)
  with pytest.raises(loop_lib.NonFiniteTrainingError, match="train.max_bad_steps=3"):
    loop_lib.run_loop(str(tmp_path), {"test": True}, state, step_fn, loop)
  # The stopped run closed its checkpoint manager (mutation caught: no close on the
  # error path left orbax's background work to fail at exit, "Event loop is closed").
  assert closed == [True]
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 5
  assert "NaN" in lines[-1] or "Infinity" in lines[-1]
  records = [json.loads(line) for line in lines]
  assert [r["skipped_nonfinite"] for r in records] == [0.0, 0.0, 1.0, 1.0, 1.0]
  assert not np.isfinite(records[-1]["loss"])


def _loop_run(workdir, config, steps: int = 2, width: int = 4, during=None, **loop_args):
  """run_loop on the linear model (state of `width` weights); returns the final state.
  during(index), when given, runs inside each step."""
  from rlpost.train import loop as loop_lib  # pylint: disable=g-import-not-at-top

  opt = optax.sgd(0.01)
  mesh = train.make_mesh(1)
  step = train.make_train_step(_linear_loss, opt, mesh, micro_batch_size=8)
  state = train.place(train.init_train_state(jnp.zeros((width,)), opt, jax.random.key(0)), mesh)
  x, y = _data()
  x = jnp.pad(x, ((0, 0), (0, width - 4)))

  def step_fn(state, cursor, index):
    if during is not None:
      during(index)
    state, metrics = step(state, None, {"x": x, "y": y})
    return state, cursor._replace(position=index + 1), metrics

  loop = loop_lib.LoopConfig(steps=steps, checkpoint_every=1, **loop_args)
  return loop_lib.run_loop(str(workdir), config, state, step_fn, loop)[0]


def test_refused_resume_leaves_the_runs_config_json(tmp_path):
  """A resume refused for a changed state structure keeps the run's own config.json, the
  file the error tells the user to resume with. Mutation caught: config.json written
  before the checkpoint is restored (the refused config replaced the run's)."""
  from rlpost.train import checkpoint  # pylint: disable=g-import-not-at-top

  _loop_run(tmp_path, {"model": "four"})
  with pytest.raises(checkpoint.StateMismatchError, match="config.json"):
    _loop_run(tmp_path, {"model": "five"}, width=5)
  assert json.loads((tmp_path / "config.json").read_text()) == {"model": "four"}
  assert not list(tmp_path.glob("*.tmp"))


def test_resume_drops_a_torn_last_metrics_line(tmp_path):
  """A metrics.jsonl whose last write was cut short (no newline, not JSON) resumes: the
  torn line is dropped, every step is logged once. Mutation caught: read_jsonl parsing
  every line (resume crashed with JSONDecodeError until the file was edited by hand)."""
  from rlpost.train import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

  _loop_run(tmp_path, {}, steps=2)
  path = tmp_path / "metrics.jsonl"
  with open(path, "a", encoding="utf-8") as f:
    f.write('{"step": 3, "loss": 0.1')  # killed mid-write of a step never checkpointed
  _loop_run(tmp_path, {}, steps=3)
  assert [r["step"] for r in metrics_lib.read_jsonl(str(path))] == [1, 2, 3]
  path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')  # not a torn write
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a JSON record"):
    metrics_lib.read_jsonl(str(path))


def test_resume_with_a_changed_config_reports_the_changed_fields(tmp_path, capsys):
  """A resume whose config differs from config.json names each changed field, old and new
  value (config.json is rewritten); an unchanged resume says nothing. Mutation caught:
  config.json silently replaced (a changed seed, which the checkpoint's data position
  and PRNG key override, left no trace)."""
  _loop_run(tmp_path, {"seed": 0, "train": {"steps": 2, "lr": 0.1}})
  _loop_run(tmp_path, {"seed": 0, "train": {"steps": 2, "lr": 0.1}})
  assert "changed config" not in capsys.readouterr().out
  _loop_run(tmp_path, {"seed": 1, "train": {"steps": 3, "lr": 0.1}}, steps=3)
  out = capsys.readouterr().out
  assert "resuming from checkpoint 2 with a changed config" in out
  assert "seed: 0 -> 1; train.steps: 2 -> 3." in out
  assert json.loads((tmp_path / "config.json").read_text())["seed"] == 1


def test_a_resume_with_fewer_steps_than_trained_is_refused(tmp_path):
  """train.steps below the newest checkpoint's step is a ConfigError naming both before
  anything is restored or rewritten (it trained nothing and rewrote config.json with the
  smaller count); as many steps as trained resumes. Mutation caught: the check dropped
  (resume_with_fewer_steps_accepted)."""
  config = {"seed": 0, "train": {"steps": 3}}
  _loop_run(tmp_path, config, steps=3)
  with pytest.raises(
    errors.ConfigError,
    match=r"config\.train\.steps=2: the run in .* has "
    r"trained 3 steps already .*give train\.steps >= 3",
  ):
    _loop_run(tmp_path, {"seed": 0, "train": {"steps": 2}}, steps=2)
  assert json.loads((tmp_path / "config.json").read_text()) == config
  _loop_run(tmp_path, config, steps=3)


def test_a_workdir_that_cannot_hold_a_run_fails_before_anything_is_written(tmp_path):
  """A file as --workdir, a file where checkpoints/ goes, an unwritable directory: each
  fails naming the path. Mutation caught: without the check, a file at checkpoints/ read
  as "no checkpoint", so the run started over and truncated the run's metrics.jsonl."""
  (tmp_path / "file").write_text("x")
  with pytest.raises(ValueError, match=r"--workdir=.*file is a file, not a directory"):
    _loop_run(tmp_path / "file", {})
  run = tmp_path / "run"
  _loop_run(run, {}, steps=2)
  metrics = (run / "metrics.jsonl").read_text()
  shutil.rmtree(run / "checkpoints")
  (run / "checkpoints").write_text("not a directory")
  with pytest.raises(ValueError, match=r"checkpoints is a file, not a directory"):
    _loop_run(run, {}, steps=3)
  assert (run / "metrics.jsonl").read_text() == metrics
  if os.geteuid() != 0:  # root writes anywhere
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ValueError, match="not writable"):
      _loop_run(locked, {})


def test_a_second_run_on_a_live_workdir_is_refused(tmp_path):
  """A run started on a workdir that a live run holds stops naming the holder before it
  touches anything; the live run's metrics stay one record per step, and the workdir is
  free again once that run ends, by an error too. Mutation caught: without the workdir
  lock both runs went on, interleaving steps 1, 2, 3, 1, 2, 4, ... in one metrics.jsonl
  and both exiting 0 (two `experiments.grpo` started on one --workdir)."""
  from rlpost.train import loop as loop_lib  # pylint: disable=g-import-not-at-top
  from rlpost.train import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

  def second_run(index):
    if index == 1:
      with pytest.raises(loop_lib.WorkdirInUseError, match=rf"another run \(pid {os.getpid()} "):
        _loop_run(tmp_path, {}, steps=4)

  _loop_run(tmp_path, {}, steps=3, during=second_run)
  assert [r["step"] for r in metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))] == [1, 2, 3]

  def fail(index):
    raise RuntimeError("step failed")

  with pytest.raises(RuntimeError, match="step failed"):
    _loop_run(tmp_path, {}, steps=4, during=fail)
  _loop_run(tmp_path, {}, steps=4)  # neither run left the workdir locked
  assert [r["step"] for r in metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))] == [
    1,
    2,
    3,
    4,
  ]


@pytest.mark.parametrize("warmup_fraction", [0.0, 0.25])
def test_learning_rate_schedule_is_warmup_then_cosine(warmup_fraction):
  """SGD with a unit gradient and no decay or clipping: each update is -lr(t), checked
  against the schedule written out in float64: linear warm-up over round(f * steps)
  steps, then cosine to 0 at `steps`; with no warm-up the first update is the peak.
  Mutation caught: the no-warm-up cosine decaying over steps - 1 (reaching 0 a step
  early)."""
  steps, peak = 8, 0.5
  opt = train.make_optimizer(
    learning_rate=peak,
    total_steps=steps,
    warmup_fraction=warmup_fraction,
    weight_decay=0.0,
    max_grad_norm=None,
    optimizer="sgd",
  )
  state, got = opt.init(jnp.zeros(())), []
  for _ in range(steps + 1):
    update, state = opt.update(jnp.ones(()), state, jnp.zeros(()))
    got.append(-float(update))
  warmup = round(warmup_fraction * steps)
  want = [
    peak * t / warmup
    if t < warmup
    else 0.5 * peak * (1 + np.cos(np.pi * min(t - warmup, steps - warmup) / (steps - warmup)))
    for t in range(steps + 1)
  ]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)  # float32 cosine
