"""Several processes on jax.distributed (gloo on localhost): settings, agreement with one
process, checkpoints across process counts, and a dying process ending the job."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO_ROOT
from rlpost.train import distributed

# Plain SGD without clipping: the update is the gradient, so a reduction that differs
# shows in the weights (AdamW turns rounding noise in near-zero gradients into full steps).
TINY = {
  "train.steps": 3,
  "train.micro_batch_size": 2,
  "train.optimizer": "sgd",
  "train.max_grad_norm": 0.0,
  "checkpoint.every": 1,
}


def test_partial_or_inconsistent_settings_fail_naming_them():
  with pytest.raises(ValueError, match="dist.coordinator_address, dist.process_id missing"):
    distributed.check(distributed.DistConfig(num_processes=2))
  with pytest.raises(ValueError, match="dist.process_id=2"):
    distributed.check(distributed.DistConfig("localhost:1", 2, 2))
  assert not distributed.check(distributed.DistConfig())


def test_cluster_detection_and_what_initialize_calls(monkeypatch):
  calls = []
  monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda *a, **k: calls.append(a))
  slurm = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}
  assert distributed.cluster(slurm) == "slurm"
  assert distributed.cluster({**slurm, "SLURM_NTASKS": "1"}) is None  # one task: one process
  assert distributed.cluster({"KUBERNETES_SERVICE_HOST": "x", "JOB_COMPLETION_INDEX": "1"}) == (
    "kubernetes"
  )
  assert distributed.initialize(distributed.DistConfig(), environ={}) == "single"
  assert distributed.initialize(distributed.DistConfig(), environ=slurm) == "slurm"
  explicit = distributed.DistConfig("host:123", 2, 1)
  assert distributed.initialize(explicit, environ={}) == "explicit"
  assert calls == [(), ("host:123", 2, 1)]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


_DRIVER = """
import json, sys
sys.path.insert(0, "tests")
import jax
import numpy as np
from jax.experimental import multihost_utils
from conftest import with_overrides
from rlpost.train import distributed
args = json.loads(sys.argv[1])
distributed.initialize(distributed.DistConfig(**args["dist"]))
from experiments.configs import agentic as agentic_configs, dpo as dpo_configs
from experiments.configs import grpo_gsm8k, ppo_gsm8k, sft as sft_configs
from rlpost.envs import multiturn
from rlpost.recipes import agentic, dpo, grpo, ppo, rollout, sft
from rlpost.supervised import sft as sft_lib

# What this process reads, per call: examples (SFT, DPO), prompts (GRPO, PPO), seeds.
read = []
def recording(module, name, rows):
  inner = getattr(module, name)
  def wrapper(*a, **k):
    read.append(rows(*a, **k))
    return inner(*a, **k)
  setattr(module, name, wrapper)
recording(sft_lib, "make_batch", lambda examples, **k: [str(e[0].tolist()) for e in examples])
recording(rollout, "sample_groups", lambda p, w, problems, *a: [q.question for q in problems])
recording(multiturn, "rollout", lambda w, env, tasks, seeds, *a, **k: list(seeds))

recipe, overrides = args["recipe"], args["overrides"]
runs = {
  "sft": (sft, sft_configs.get_config("tiny"), {"eval.every": 0}),
  "dpo": (dpo, dpo_configs.get_config("tiny"), {}),
  "grpo": (grpo, grpo_gsm8k.get_config("tiny"), {}),
  "ppo": (ppo, ppo_gsm8k.get_config("tiny"), {}),
  "agentic": (agentic, agentic_configs.get_config("frozenlake_tiny"),
              {"eval.every": 0, "train.batch_tasks": 2, "algo.num_generations": 4}),
}
module, base, fixed = runs[recipe]
out = module.run(with_overrides(base, {**fixed, **overrides}), args["workdir"],
                 stop_after=args["stop_after"])
state = out if hasattr(out, "trainable") else out[0]
leaves = [np.asarray(multihost_utils.process_allgather(x, tiled=True))
          for x in jax.tree.leaves(state.trainable)]
if jax.process_index() == 0:
  np.savez(args["workdir"] + "/trainable.npz", *leaves)
with open(f"{args['workdir']}/read{jax.process_index()}.json", "w") as f:
  json.dump(read, f)
print("DONE", flush=True)
"""


_CARRY_DRIVER = """
import json, sys
import jax, jax.numpy as jnp, numpy as np, optax
from jax.experimental import multihost_utils
from rlpost.models import gemma3
from rlpost.train import checkpoint, distributed, step as train
args = json.loads(sys.argv[1])
distributed.initialize(distributed.DistConfig(**args["dist"]))
mesh = train.make_mesh(fsdp=4)
params = gemma3.init_params(jax.random.key(0), gemma3.get_config("tiny"))
state = train.place(train.init_train_state(params, optax.sgd(0.1), jax.random.key(1)), mesh)
older = train.place(jax.tree.map(lambda x: x * 2 + 1, params), mesh)
assert not older["embed"].is_fully_addressable or jax.process_count() == 1
mngr = checkpoint.manager(args["workdir"])
if args["recipe"] == "save":
  checkpoint.save(mngr, 1, state, {"iteration": 1}, ({"versions": [0]}, {"0": older}))
like = lambda state, meta: {str(v): state.trainable for v in meta["versions"]}
_, meta = checkpoint.restore(mngr, 1, state, like)
gather = lambda t: [np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in jax.tree.leaves(t)]
for a, b in zip(gather(meta["carry"].arrays["0"]), gather(older)):
  np.testing.assert_array_equal(a, b)
assert meta["carry"].arrays["0"]["embed"].sharding == older["embed"].sharding
mngr.close()
print("DONE", flush=True)
"""


def _launch(
  recipe, workdir, processes, overrides=TINY, stop_after=None, heartbeat=100, devices=4, driver=None
):
  """Starts `processes` processes x (devices / processes) CPU devices, each running
  `driver` (default: a recipe's run); returns the Popen list."""
  port, procs = _free_port(), []
  os.makedirs(workdir, exist_ok=True)
  for i in range(processes):
    dist = {"heartbeat_timeout_s": heartbeat}
    if processes > 1:
      dist.update(coordinator_address=f"localhost:{port}", num_processes=processes, process_id=i)
    args = dict(
      recipe=recipe, workdir=str(workdir), dist=dist, overrides=overrides, stop_after=stop_after
    )
    env = {
      **os.environ,
      "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices // processes}",
      "JAX_PLATFORMS": "cpu",
      "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
      "PYTHONPATH": str(REPO_ROOT),
    }
    log = open(os.path.join(workdir, f"process{i}.log"), "w")
    procs.append(
      subprocess.Popen(
        [sys.executable, "-c", driver or _DRIVER, json.dumps(args)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
      )
    )
  return procs


def _finish(procs, workdir, timeout=240):
  deadline = time.time() + timeout
  try:
    for p in procs:
      p.wait(timeout=max(deadline - time.time(), 1))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  logs = "".join(
    open(os.path.join(workdir, f"process{i}.log")).read()[-2000:] for i in range(len(procs))
  )
  assert all(p.returncode == 0 for p in procs), logs


def _run(recipe, workdir, processes, **kwargs):
  _finish(_launch(recipe, workdir, processes, **kwargs), workdir)


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _trainable(workdir):
  with np.load(os.path.join(workdir, "trainable.npz")) as z:
    return [z[k] for k in sorted(z.files, key=lambda k: int(k.split("_")[1]))]


def _assert_same_run(a, b):
  ra, rb = _records(a), _records(b)
  assert [r["step"] for r in ra] == [r["step"] for r in rb]
  for x, y in zip(ra, rb):
    for key in ("loss", "grad_norm"):
      # atol: a PPO loss near 0 is a difference of terms summed in another order
      np.testing.assert_allclose(y[key], x[key], rtol=1e-5, atol=1e-6, err_msg=key)
  for x, y in zip(_trainable(a), _trainable(b)):
    np.testing.assert_allclose(y, x, atol=1e-5)


def _read(workdir, process):
  with open(os.path.join(workdir, f"read{process}.json")) as f:
    return json.load(f)


@pytest.mark.parametrize("recipe", ["sft", "grpo", "dpo", "ppo", "agentic"])
def test_two_processes_equal_one_process(tmp_path, recipe):
  """3 steps on 2 processes x 2 devices and on 1 process x 4 devices (data=4): the same
  losses and gradient norms, and the same final weights within 1e-5. Each process
  reads only its share: per call, the two processes' rows (examples, prompts, task
  seeds) are disjoint and together exactly the single process's rows."""
  procs = [_launch(recipe, tmp_path / "two", 2), _launch(recipe, tmp_path / "one", 1)]
  for p, d in zip(procs, ("two", "one")):
    _finish(p, tmp_path / d)
  _assert_same_run(tmp_path / "one", tmp_path / "two")
  one, first, second = _read(tmp_path / "one", 0), *(_read(tmp_path / "two", i) for i in (0, 1))
  assert len(one) == len(first) == len(second) >= 3
  for whole, a, b in zip(one, first, second):
    assert len(a) == len(b) == len(whole) // 2
    assert sorted(a + b) == sorted(whole), "a row read twice or skipped"


def test_rollout_devices_with_two_processes_equal_one_process(tmp_path):
  """GRPO with LoRA, 3 steps, sampling on devices of its own (`mesh.rollout`): 2 processes
  x (2 trainer + 2 rollout devices) equal 1 process x (4 + 4), each process copying the
  adapters to its own rollout devices and sampling its block of prompts there."""
  lora = {**TINY, "lora.enabled": True}
  procs = [
    _launch("grpo", tmp_path / "two", 2, overrides={**lora, "mesh.rollout": 2}, devices=8),
    _launch("grpo", tmp_path / "one", 1, overrides={**lora, "mesh.rollout": 4}, devices=8),
  ]
  for p, d in zip(procs, ("two", "one")):
    _finish(p, tmp_path / d)
  _assert_same_run(tmp_path / "one", tmp_path / "two")


def test_int8_rollouts_with_two_processes_equal_one_process(tmp_path):
  """GRPO, 3 steps, the sampler reading an int8 copy ("oik" dots, TIS cap 2): each of 2
  processes quantizes its own replica of the weights and samples its block of prompts;
  the run equals 1 process x 4 devices."""
  int8 = {
    **TINY,
    "sampling.weights": "int8",
    "sampling.int8_paths": "oik:0",
    "algo.tis_cap": 2.0,
  }
  procs = [
    _launch("grpo", tmp_path / "two", 2, overrides=int8),
    _launch("grpo", tmp_path / "one", 1, overrides=int8),
  ]
  for p, d in zip(procs, ("two", "one")):
    _finish(p, tmp_path / d)
  _assert_same_run(tmp_path / "one", tmp_path / "two")
  assert all(r["sampler_logp_gap_mean"] > 1e-4 for r in _records(tmp_path / "two"))


def test_checkpoints_move_between_process_counts(tmp_path):
  """SFT with fsdp=4 (weights split across both processes): 2 steps on 2 processes, the
  third on 1, equals 3 steps on 1; and 1 -> 2 the same."""
  fsdp = {**TINY, "mesh.fsdp": 4}
  straight = tmp_path / "straight"
  _run("sft", straight, 1, overrides=fsdp)
  for first, then in ((2, 1), (1, 2)):
    d = tmp_path / f"from{first}"
    _run("sft", d, first, overrides=fsdp, stop_after=2)
    _run("sft", d, then, overrides=fsdp)
    _assert_same_run(straight, d)


def test_a_carry_split_across_processes_saves_and_restores(tmp_path):
  """A checkpoint's carry (a pipelined run's older policies) of weights split over fsdp
  across 2 processes is saved by both and restores bitwise with its sharding, on 2
  processes and on 1: orbax's own handling of global arrays, as for the state.
  (Pipelined runs themselves do not run on several processes yet: BUILD.md.)"""
  _finish(_launch("save", tmp_path, 2, driver=_CARRY_DRIVER), tmp_path)
  _finish(_launch("restore", tmp_path, 1, driver=_CARRY_DRIVER), tmp_path)


def test_a_dying_process_ends_the_others(tmp_path):
  """Killing one of two training processes: the other exits non-zero within the heartbeat
  timeout (10 s) plus 30 s."""
  long_run = {**TINY, "train.steps": 100_000, "checkpoint.every": 100_000}
  procs = _launch("sft", tmp_path, 2, overrides=long_run, heartbeat=10)
  try:
    deadline = time.time() + 120
    while not (tmp_path / "metrics.jsonl").exists() or len(_records(tmp_path)) < 3:
      assert time.time() < deadline and all(p.poll() is None for p in procs)
      time.sleep(1)
    procs[1].send_signal(signal.SIGKILL)
    procs[0].wait(timeout=10 + 30)
    assert procs[0].returncode != 0
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


def test_launch_recipes_name_real_configs_and_flags():
  """The scripts parse; every --dist.* flag they pass is a DistConfig field and every
  config file they name exists (guards the recipes against renames)."""
  import dataclasses
  import re

  import yaml

  launch = REPO_ROOT / "experiments" / "launch"
  texts = {p.name: p.read_text() for p in launch.iterdir()}
  assert set(texts) >= {"local_devices.sh", "local_processes.sh", "slurm.sbatch", "jobset.yaml"}
  for name in ("local_devices.sh", "local_processes.sh", "slurm.sbatch"):
    subprocess.run(["bash", "-n", str(launch / name)], check=True)
  yaml.safe_load(texts["jobset.yaml"])
  fields = {f.name for f in dataclasses.fields(distributed.DistConfig)}
  everything = "\n".join(texts.values())
  assert set(re.findall(r"--dist\.(\w+)", everything)) <= fields
  for config in re.findall(r"experiments/configs/(\w+\.py)", everything):
    assert (REPO_ROOT / "experiments" / "configs" / config).exists(), config
