"""train_step: micro-batch accumulation and data-parallel shard_map agree with one big step."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import REPO_ROOT
from rlpost.train import step as train


def _linear_loss(w, frozen, mb):
  del frozen
  err = mb["x"] @ w - mb["y"]
  return jnp.mean(err**2), {"mse": jnp.mean(err**2)}


def _run(num_devices: int, micro: int, steps: int = 3, optimizer: str = "sgd"):
  """Trains w [4] from zero; returns (w, last loss, first-step grad_norm).

  SGD by default: its update is proportional to the gradient, so a gradient
  summed instead of averaged (over micro-batches or devices) changes the weights.
  AdamW after global-norm clipping is blind to that scale.
  """
  if optimizer == "sgd":
    opt = optax.sgd(0.05)
  else:
    opt = train.make_optimizer(learning_rate=0.05, total_steps=steps, max_grad_norm=1.0)
  mesh = train.make_mesh(num_devices)
  state = train.replicate(train.init_train_state(jnp.zeros((4,)), opt, jax.random.key(0)), mesh)
  step = train.make_train_step(_linear_loss, opt, mesh, micro)
  x, y = _data()
  norms = []
  for _ in range(steps):
    state, metrics = step(state, None, {"x": x, "y": y})
    norms.append(float(metrics["grad_norm"]))
  return np.asarray(state.trainable), float(metrics["loss"]), norms[0]


def _data():
  x = jax.random.normal(jax.random.key(1), (8, 4))
  return x, x @ jnp.arange(1.0, 5.0)


def _analytic_first_grad_norm() -> float:
  """|d/dw mean((x w - y)^2)| at w = 0 is |-2 x^T y / N| (float64 NumPy)."""
  x, y = (np.asarray(a, np.float64) for a in _data())
  return float(np.linalg.norm(-2.0 * x.T @ y / len(y)))


def test_micro_batches_equal_one_batch():
  """Mutation caught: gradients summed over micro-batches (only loss/metrics divided)."""
  w1, l1, g1 = _run(1, 8)
  w4, l4, g4 = _run(1, 2)
  np.testing.assert_allclose(w4, w1, rtol=1e-5, atol=1e-6)
  assert abs(l4 - l1) < 1e-5
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
  code = textwrap.dedent("""
      import sys; sys.path.insert(0, "tests")
      import numpy as np
      import test_train
      w2, l2, g2 = test_train._run(2, 2)
      w1, l1, g1 = test_train._run(1, 4)
      np.testing.assert_allclose(w2, w1, rtol=1e-5, atol=1e-6)
      assert abs(l2 - l1) < 1e-5
      np.testing.assert_allclose([g1, g2], test_train._analytic_first_grad_norm(), rtol=1e-5)
      import jax; assert len(jax.devices()) == 2
      print("OK")
  """)
  env = {
    **os.environ,
    "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    "PYTHONPATH": str(REPO_ROOT),
    "JAX_PLATFORMS": "cpu",
  }
  out = subprocess.run(
    [sys.executable, "-c", code],
    cwd=REPO_ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
