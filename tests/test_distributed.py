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
from rlpost import errors
from rlpost.train import distributed

# Plain SGD without clipping: the update is the gradient, so a reduction that differs
# shows in the weights (AdamW turns rounding noise in near-zero gradients into full steps).
TINY = {
  "train.steps": 3,
  "train.micro_batch_size": 2,
  "train.optimizer": "sgd",
  "train.max_grad_norm": 0.0,
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
  with socket.socket() as coordinator:  # something listening where process 0 would be
    coordinator.bind(("localhost", 0))
    coordinator.listen()
    address = f"localhost:{coordinator.getsockname()[1]}"
    explicit = distributed.DistConfig(address, 2, 1)
    assert distributed.initialize(explicit, environ={}) == "explicit"
  assert calls == [(), (address, 2, 1)]


@pytest.mark.parametrize(
  "settings,match",
  [
    (("localhost", 2, 1), r"coordinator_address='localhost': give HOST:PORT"),
    (("localhost:http", 2, 1), r"the port 'http' must be a number"),
    (("localhost:1", 0, 0), r"--dist\.num_processes=0: must be >= 1"),
    (("nosuch-host.invalid:1234", 2, 1), r"the host 'nosuch-host\.invalid' does not resolve"),
    (("nosuch-host.invalid:1234", 2, 0), r"the host 'nosuch-host\.invalid' does not resolve"),
  ],
)
def test_bad_coordinator_settings_fail_before_jax_starts(settings, match, monkeypatch):
  monkeypatch.setattr(distributed.jax.distributed, "initialize", pytest.fail)
  with pytest.raises(errors.FlagError, match=match):
    distributed.initialize(distributed.DistConfig(*settings))


def test_an_unanswered_coordinator_fails_within_the_connect_timeout(monkeypatch):
  """Nothing listens on the port: process 1 gives up after connect_timeout_s (1 s here),
  naming the address and the setting, instead of waiting initialization_timeout_s."""
  monkeypatch.setattr(distributed.jax.distributed, "initialize", pytest.fail)
  address = f"localhost:{_free_port()}"
  start = time.monotonic()
  with pytest.raises(errors.FlagError, match=rf"'{address}': nothing accepted .* within 1 s"):
    distributed.initialize(distributed.DistConfig(address, 2, 1, connect_timeout_s=1))
  assert time.monotonic() - start < 5


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


_DRIVER = """
import json, os, sys, time
sys.path.insert(0, "tests")
import jax
import numpy as np
from jax.experimental import multihost_utils
import conftest
import program_sharing
from conftest import with_overrides
from rlpost.train import distributed
args = json.loads(sys.argv[1])
distributed.initialize(distributed.DistConfig(**args["dist"]))
if jax.process_count() > 1:
  # Process 0 compiles each program that spans both processes and publishes its binary;
  # the other loads it (program_sharing). The persistent cache stays off: its keys differ
  # per process on CPU, so a hit on one process alone would leave the other waiting.
  jax.config.update("jax_enable_compilation_cache", False)
  program_sharing.share_compiled_programs()
conftest.use_codegen_levels()  # after: it compiles a probe program, which starts the backend
import optax
from experiments.configs import agentic as agentic_configs, dpo as dpo_configs
from experiments.configs import grpo_gsm8k, ppo_gsm8k, sft as sft_configs
from rlpost.envs import multiturn
from rlpost.models import decoder
from rlpost.models import families
from rlpost.recipes import dpo, rl, sft
from rlpost.supervised import sft as sft_lib
from rlpost.train import checkpoint, step as train

# What this process reads, per call: examples (SFT, DPO), task seeds (the RL recipe: for
# GRPO and PPO the prompts' dataset indices).
read = []
def recording(module, name, rows):
  inner = getattr(module, name)
  def wrapper(*a, **k):
    read.append(rows(*a, **k))
    return inner(*a, **k)
  setattr(module, name, wrapper)
recording(sft_lib, "make_batch", lambda examples, **k: [str(e[0].tolist()) for e in examples])
recording(multiturn, "rollout", lambda w, env, tasks, seeds, *a, **k: list(seeds))

RECIPES = {
  "sft": (sft, lambda: sft_configs.get_config("tiny"), {"eval.every": 0}),
  "dpo": (dpo, lambda: dpo_configs.get_config("tiny"), {}),
  "grpo": (rl, lambda: grpo_gsm8k.get_config("tiny"), {}),
  "ppo": (rl, lambda: ppo_gsm8k.get_config("tiny"), {}),
  "agentic": (rl, lambda: agentic_configs.get_config("frozenlake_tiny"),
              {"eval.every": 0, "train.batch_tasks": 2, "algo.num_generations": 4}),
}

def gather(tree):
  leaves = jax.tree.leaves(tree)
  return [np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in leaves]

def run_recipe(run):
  module, base, fixed = RECIPES[run["recipe"]]
  out = module.run(with_overrides(base(), {**fixed, **run["overrides"]}), run["workdir"],
                   stop_after=run["stop_after"])
  leaves = gather((out if hasattr(out, "trainable") else out[0]).trainable)
  if jax.process_index() == 0:
    np.savez(run["workdir"] + "/trainable.npz", *leaves)

def run_carry(run):
  # A checkpoint's carry of weights split over fsdp=4: saved (by every process) or
  # restored, and compared bitwise with its sharding.
  mesh = train.make_mesh(fsdp=4)
  params = decoder.init_params(jax.random.key(0), families.get_config("tiny"))
  state = train.place(train.init_train_state(params, optax.sgd(0.1), jax.random.key(1)), mesh)
  older = train.place(jax.tree.map(lambda x: x * 2 + 1, params), mesh)
  assert not older["embed"].is_fully_addressable or jax.process_count() == 1
  mngr = checkpoint.manager(run["workdir"])
  if run["recipe"] == "carry_save":
    checkpoint.save(mngr, 1, state, {"iteration": 1}, ({"versions": [0]}, {"0": older}))
  like = lambda state, meta: {str(v): state.trainable for v in meta["versions"]}
  _, meta = checkpoint.restore(mngr, 1, state, like)
  for a, b in zip(gather(meta["carry"].arrays["0"]), gather(older)):
    np.testing.assert_array_equal(a, b)
  assert meta["carry"].arrays["0"]["embed"].sharding == older["embed"].sharding
  mngr.close()

for run in args["runs"]:
  deadline = time.time() + 900
  while run["after"] and not os.path.exists(run["after"]):  # another launch's run
    assert time.time() < deadline, run["after"] + " never appeared"
    time.sleep(0.2)
  os.makedirs(run["workdir"], exist_ok=True)
  read.clear()
  # The tests' fast code generation (conftest.FAST_CODEGEN), but PPO at -O1: its loss near
  # 0 sums its terms in another order on 1 and 2 processes, and at -O0 (no fused
  # multiply-adds) the two moved 1.7e-6 apart, past the test's atol; at -O1 they agree as
  # with XLA's defaults, whose compilation took 30 s of CPU per process against 19.
  ppo_ = run["recipe"] == "ppo"
  conftest.set_codegen(conftest.CONTRACTING_CODEGEN if ppo_ else conftest.FAST_CODEGEN)
  (run_carry if run["recipe"].startswith("carry") else run_recipe)(run)
  with open(f"{run['workdir']}/read{jax.process_index()}.json", "w") as f:
    json.dump(read, f)
  multihost_utils.sync_global_devices(run["done"])  # every process has written its files
  if jax.process_index() == 0:
    open(run["done"], "w").close()
  print("FINISHED", run["done"], "process seconds", time.process_time(), flush=True)
print("DONE", flush=True)
"""


def _launch(runs, processes, logs, heartbeat=100, devices=4):
  """Starts `processes` processes x (devices / processes) CPU devices, each running the
  `runs` one after the other (dicts: recipe, workdir, overrides, stop_after, `after`: a
  file to wait for first, `done`: the file written when all processes finished it);
  returns the Popen list. Process i logs to `logs`i.log."""
  port, procs = _free_port(), []
  runs = [
    {"overrides": TINY, "stop_after": None, "after": None, **r}
    | {k: str(r[k]) for k in ("workdir", "done", "after") if r.get(k)}
    for r in runs
  ]
  for i in range(processes):
    dist = {"heartbeat_timeout_s": heartbeat}
    if processes > 1:
      dist.update(coordinator_address=f"localhost:{port}", num_processes=processes, process_id=i)
    env = {
      **os.environ,
      # the codegen level is set per run (the driver), not by the tests' XLA_FLAGS
      "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices // processes}",
      "JAX_PLATFORMS": "cpu",
      "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
      "PYTHONPATH": str(REPO_ROOT),
    }
    log = open(f"{logs}{i}.log", "w")
    procs.append(
      subprocess.Popen(
        [sys.executable, "-c", _DRIVER, json.dumps({"dist": dist, "runs": runs})],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
      )
    )
  return procs


def _logs(procs, logs):
  return "".join(
    f"--- {logs}{i}.log\n" + open(f"{logs}{i}.log").read()[-3000:] for i in range(len(procs))
  )


def _finish(procs, logs, timeout=600):
  deadline = time.time() + timeout
  try:
    for p in procs:
      p.wait(timeout=max(deadline - time.time(), 1))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert all(p.returncode == 0 for p in procs), _logs(procs, logs)


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


# The recipes run on 2 processes x 2 devices and on 1 process x 4 devices (data=4).
RECIPES = {
  "sft": ("sft", TINY),
  "grpo": ("grpo", TINY),
  "dpo": ("dpo", TINY),
  "ppo": ("ppo", TINY),
  "agentic": ("agentic", TINY),
  # the sampler reading an int8 copy ("oik" dots, TIS cap 2)
  "grpo_int8": (
    "grpo",
    {**TINY, "sampling.weights": "int8", "sampling.int8_paths": "oik:0", "algo.tis_cap": 2.0},
  ),
  # DAPO's dynamic sampling: every process plays each round whole (WHOLE_ROUNDS)
  "grpo_dynamic": ("grpo", {**TINY, "rollout.dynamic_sampling": True}),
}
WHOLE_ROUNDS = {"grpo_dynamic"}
FSDP = {**TINY, "mesh.fsdp": 4}
# a pipelined run on 2 processes (its producer thread waiting in an exchange or sampling)
DYING = {
  **TINY,
  "train.steps": 100_000,
  "checkpoint.every": 100_000,
  "rollout.max_staleness": 1,
  "algo.tis_cap": 2.0,
}
HEARTBEAT_S = 10


def _launch_all(root):
  """The test's two launches, running at once: 2 processes x 2 devices (with a heartbeat
  timeout of HEARTBEAT_S) and 1 process x 4 devices. Each runs every recipe, its half of
  the checkpoint moves and of the carry round trip (waiting on the other's `done` files),
  then the 2-process launch trains on until the test kills its second process. Returns
  the first process's exit code after that kill and its seconds to exit (None: it did not
  within HEARTBEAT_S + 30 s)."""

  def done(name):
    return root / f"{name}.done"

  first_two = {"recipe": "sft", "overrides": FSDP, "stop_after": 2}
  two = [
    {**first_two, "workdir": root / "from2", "done": done("from2_first")},
    *(
      {"recipe": r, "overrides": o, "workdir": root / "two" / n, "done": done(f"two_{n}")}
      for n, (r, o) in RECIPES.items()
    ),
    {
      "recipe": "sft",
      "overrides": FSDP,
      "workdir": root / "from1",
      "after": done("from1_first"),
      "done": done("from1_rest"),
    },
    {"recipe": "carry_save", "workdir": root / "carry", "done": done("carry_saved")},
    {"recipe": "grpo", "overrides": DYING, "workdir": root / "dying", "done": done("never")},
  ]
  one = [
    {**first_two, "workdir": root / "from1", "done": done("from1_first")},
    {"recipe": "sft", "overrides": FSDP, "workdir": root / "straight", "done": done("straight")},
    *(
      {"recipe": r, "overrides": o, "workdir": root / "one" / n, "done": done(f"one_{n}")}
      for n, (r, o) in RECIPES.items()
    ),
    {
      "recipe": "sft",
      "overrides": FSDP,
      "workdir": root / "from2",
      "after": done("from2_first"),
      "done": done("from2_rest"),
    },
    {
      "recipe": "carry_restore",
      "workdir": root / "carry",
      "after": done("carry_saved"),
      "done": done("carry_restored"),
    },
  ]
  procs = _launch(two, 2, root / "two", heartbeat=HEARTBEAT_S)
  single = _launch(one, 1, root / "one")
  dying = root / "dying" / "metrics.jsonl"
  try:
    deadline = time.time() + 900
    while single[0].poll() is None or not dying.exists() or dying.read_text().count("\n") < 3:
      assert time.time() < deadline, "timed out\n" + _logs(procs, root / "two")
      assert single[0].poll() in (None, 0), _logs(single, root / "one")
      assert all(p.poll() is None for p in procs), _logs(procs, root / "two")
      time.sleep(0.5)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.time()
    try:
      procs[0].wait(timeout=HEARTBEAT_S + 30)
    except subprocess.TimeoutExpired:
      return {"returncode": None, "exit_s": None}
    return {"returncode": procs[0].returncode, "exit_s": time.time() - killed}
  finally:
    for p in procs + single:
      if p.poll() is None:
        p.kill()
        p.wait()


def _check(failures, name, check, *args):
  try:
    check(*args)
  except AssertionError as e:
    failures.append(f"{name}: {e}")


def _shares_split(whole_dir, two_dir):
  """Per call, the two processes' rows are disjoint and together the single process's."""
  one, first, second = _read(whole_dir, 0), *(_read(two_dir, i) for i in (0, 1))
  assert len(one) == len(first) == len(second) >= 3
  for whole, a, b in zip(one, first, second):
    assert len(a) == len(b) == len(whole) // 2
    assert sorted(a + b) == sorted(whole), "a row read twice or skipped"


def _rounds_whole(whole_dir, two_dir):
  """Per call, each of the two processes plays the single process's rows, all of them."""
  one, first, second = _read(whole_dir, 0), *(_read(two_dir, i) for i in (0, 1))
  assert len(one) >= 3 and one == first == second


@pytest.mark.slow
def test_two_processes_equal_one_process_and_share_checkpoints(tmp_path):
  """One launch of 2 processes x 2 devices and one of 1 process x 4 devices, side by side
  (`_launch_all`); every failing property is reported, named:
  - each recipe (sft, grpo, dpo, ppo, agentic; grpo_int8: the sampler reading an int8
    copy that each process quantizes from its own replica), 3 steps, data=4: the same
    losses and gradient norms, and the same final weights within 1e-5. Each process reads
    only its share: per call, the two processes' rows (examples, prompts, task seeds) are
    disjoint and together exactly the single process's rows. grpo_int8: the sampler's
    logprobs differ from the trainer's (gap > 1e-4), i.e. int8 was sampled. grpo without
    dynamic sampling reports dynamic/filled 0 on 2 processes (it read 2: each process
    compared its own groups with the global prompt count). grpo_dynamic (DAPO's dynamic
    sampling): every process plays each round's prompts whole, and the resampling rounds,
    the filled groups and the training agree with 1 process.
  - checkpoints move between process counts: SFT with fsdp=4 (weights split across both
    processes), 2 steps on 2 processes then the third on 1, and 1 then 2, equal 3 steps on 1.
  - a checkpoint's carry (a pipelined run's older policies) of weights split over fsdp
    across 2 processes is saved by both and restores bitwise with its sharding, on 2
    processes and on 1 (asserted in the launches): orbax's handling of global arrays, as
    for the state (pipelined runs on 2 processes themselves:
    `test_pipelined_runs_with_rollout_devices_on_two_processes_equal_one_process`).
  - killing one of two training processes (3 steps into a long pipelined GRPO run, its
    producer thread sampling ahead): the other exits non-zero within the heartbeat
    timeout (10 s) plus 30 s.
  - fsdp=4 and data=4 (1 process, the same SFT steps) agree as above.
  Mutations caught: every process reading block 0 of a batch (`shares.block` ignoring the
  process index: rows read twice) fails the recipes' share and agreement checks;
  fsdp_gradient_not_divided fails fsdp=4 vs data=4 (grad norm 25.6 vs 7.4).
  Slow (~160 s of CPU over the 3 processes, 1.5-2 min on a 2-core machine): 17 short runs,
  each compiling its programs in the single process and in the first of the two (which
  sends the binaries that span both processes to the second); one launch per process
  count instead of 25 process starts."""
  result = _launch_all(tmp_path)
  failures = []
  for name in RECIPES:
    one, two = tmp_path / "one" / name, tmp_path / "two" / name
    _check(failures, f"{name} agreement", _assert_same_run, one, two)
    split = _rounds_whole if name in WHOLE_ROUNDS else _shares_split
    _check(failures, f"{name} shares", split, one, two)
  filled = [r["dynamic/filled"] for r in _records(tmp_path / "two" / "grpo")]
  if filled != [0] * len(filled):  # no dynamic sampling: nothing filled, on any process count
    failures.append(f"grpo on 2 processes: dynamic/filled {filled}, not all 0")
  dynamic = {
    n: [(r["dynamic/rounds"], r["dynamic/filled"]) for r in _records(tmp_path / n / "grpo_dynamic")]
    for n in ("one", "two")
  }
  if dynamic["one"] != dynamic["two"] or max(rounds for rounds, _ in dynamic["one"]) < 2:
    failures.append(
      f"grpo_dynamic: (rounds, filled) per step {dynamic}: not equal, or never resampled"
    )
  gaps = [r["sampler_logp_gap_mean"] for r in _records(tmp_path / "two" / "grpo_int8")]
  if not all(gap > 1e-4 for gap in gaps):
    failures.append(f"grpo_int8: sampler_logp_gap_mean {gaps}, not all > 1e-4")
  # fsdp=4 and data=4 (the same SFT steps, on 1 process) differ only in reduction order
  _check(
    failures, "fsdp=4 vs data=4", _assert_same_run, tmp_path / "one" / "sft", tmp_path / "straight"
  )
  for first in (2, 1):
    _check(
      failures, f"from {first}", _assert_same_run, tmp_path / "straight", tmp_path / f"from{first}"
    )
  if result["returncode"] in (None, 0):
    failures.append(f"the survivor of a killed process: {result}")
  assert not failures, "\n".join(failures)


PIPELINED = {"algo.tis_cap": 2.0}  # with each recipe's staleness field set to 1
STALENESS = {recipe: "rollout.max_staleness" for recipe in ("grpo", "ppo", "agentic")}


@pytest.mark.slow
def test_pipelined_runs_with_rollout_devices_on_two_processes_equal_one_process(tmp_path):
  """Pipelined runs (max_staleness 1, TIS cap 2: a producer thread samples batch i with
  the policy of step i - 1 while the trainer trains) sampling on devices of their own
  (`mesh.rollout`): GRPO with LoRA, PPO and the agentic recipe (FrozenLake), each stopped
  after 2 of 3 steps and resumed (the checkpoint's carry holds the older policy the next
  batch is sampled by). 2 processes x (2 trainer + 2 rollout devices) give the same
  losses, gradient norms and final weights as 1 process x (4 + 4): each process copies
  the weights to its own rollout devices and samples its block of rows there, and the
  producer's host agreements (reward statistics, widths) go through a channel of its own
  (`shares.channel`) instead of collectives that could interleave with the trainer's.
  Mutation caught: the producer's channel shared with the trainer's (a hang, or the two
  threads' values swapped). Slow (~60-80 s, 3 processes): its 8-device layouts fit no
  other launch of this module."""

  def runs(rollout, name):
    out = []
    for recipe in ("grpo", "ppo", "agentic"):
      overrides = {**TINY, **PIPELINED, STALENESS[recipe]: 1, "mesh.rollout": rollout}
      if recipe == "grpo":
        overrides["lora.enabled"] = True
      for part, stop in (("first", 2), ("rest", None)):
        out.append(
          {
            "recipe": recipe,
            "overrides": overrides,
            "stop_after": stop,
            "workdir": tmp_path / name / recipe,
            "done": tmp_path / f"{name}_{recipe}_{part}.done",
          }
        )
    return out

  procs = [
    _launch(runs(2, "two"), 2, tmp_path / "two", devices=8),
    _launch(runs(4, "one"), 1, tmp_path / "one", devices=8),
  ]
  for p, d in zip(procs, ("two", "one")):
    _finish(p, tmp_path / d)
  failures = []
  for recipe in ("grpo", "ppo", "agentic"):
    one, two = tmp_path / "one" / recipe, tmp_path / "two" / recipe
    _check(failures, f"{recipe} agreement", _assert_same_run, one, two)
    staleness = [r["staleness"] for r in _records(two)]
    if staleness[1:] != [1.0] * (len(staleness) - 1):
      failures.append(f"{recipe}: staleness per step {staleness}, not 1 after the first")
  assert not failures, "\n".join(failures)


def test_launch_recipes_name_real_configs_and_flags():
  """The scripts parse; every --dist.* flag they pass is a DistConfig field, every config
  file they name exists, and every --config.* override they pass is a field of the GRPO
  config (the recipes' examples, the pipelined ones included; guards against renames)."""
  import dataclasses
  import re

  import yaml

  from experiments.configs import grpo_gsm8k  # pylint: disable=g-import-not-at-top

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
  grpo = grpo_gsm8k.get_config("gemma3_270m")
  for field in set(re.findall(r"--config\.([\w.]+)=", everything)):
    block = grpo
    for part in field.split("."):
      assert part in block, f"--config.{field}: not a field of the GRPO config"
      block = block[part]
