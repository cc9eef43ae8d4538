"""train_step: micro-batch accumulation and data-parallel shard_map agree with one big step."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO_ROOT
from rlpost import train


def _linear_loss(w, frozen, mb):
  del frozen
  err = mb["x"] @ w - mb["y"]
  return jnp.mean(err ** 2), {"mse": jnp.mean(err ** 2)}


def _run(num_devices: int, micro: int, steps: int = 3):
  opt = train.make_optimizer(learning_rate=0.05, total_steps=steps, max_grad_norm=1.0)
  mesh = train.make_mesh(num_devices)
  state = train.replicate(train.init_train_state(jnp.zeros((4,)), opt, jax.random.key(0)), mesh)
  step = train.make_train_step(_linear_loss, opt, mesh, micro)
  x = jax.random.normal(jax.random.key(1), (8, 4))
  batch = {"x": x, "y": x @ jnp.arange(1.0, 5.0)}
  for _ in range(steps):
    state, metrics = step(state, None, batch)
  return np.asarray(state.trainable), float(metrics["loss"])


def test_micro_batches_equal_one_batch():
  w1, l1 = _run(1, 8)
  w4, l4 = _run(1, 2)
  np.testing.assert_allclose(w4, w1, rtol=1e-5, atol=1e-6)
  assert abs(l4 - l1) < 1e-5


def test_rows_not_divisible_by_micro_batch_raise():
  with pytest.raises(ValueError, match="not divisible by micro_batch_size=3"):
    _run(1, 3)


def test_two_devices_equal_one_device():
  """Data-parallel over a 2-device CPU mesh (subprocess: device count is fixed at start-up)."""
  code = textwrap.dedent("""
      import sys; sys.path.insert(0, "tests")
      import numpy as np
      import test_train
      w2, l2 = test_train._run(2, 2)
      w1, l1 = test_train._run(1, 4)
      np.testing.assert_allclose(w2, w1, rtol=1e-5, atol=1e-6)
      assert abs(l2 - l1) < 1e-5
      import jax; assert len(jax.devices()) == 2
      print("OK")
  """)
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
         "PYTHONPATH": str(REPO_ROOT), "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
