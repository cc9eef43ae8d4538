"""Checkpoints fail soft: corrupt ones are detected, quarantined and skipped; failed writes
leave the previous checkpoint restorable; a changed config is not mistaken for corruption."""

import errno
import json
import os
import pathlib
import shutil
import time

import jax
import numpy as np
import pytest
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from experiments.configs import grpo_gsm8k
from rlpost.recipes import common
from rlpost.recipes import rl
from rlpost.train import checkpoint

_TIMING = ("time/", "tokens_per_s", "step_seconds")


def _config(**overrides):
  cfg = grpo_gsm8k.get_config("tiny")
  with cfg.unlocked():
    cfg.train.steps, cfg.checkpoint.every = 6, 2
    for dotted, value in overrides.items():
      block, name = dotted.split(".")
      cfg[block][name] = value
  return cfg


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(_TIMING)} for line in f]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A finished 6-step tiny GRPO run with checkpoints 2, 4 and 6, and its final state."""
  workdir = tmp_path_factory.mktemp("finished")
  return workdir, rl.run(_config(), str(workdir))


def _assert_same_weights(state, other):
  """Trainable params and optimizer state bitwise equal."""
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.device_get((state.trainable, state.opt_state)),
    jax.device_get((other.trainable, other.opt_state)),
  )


def _copy(finished_run, tmp_path) -> pathlib.Path:
  workdir = tmp_path / "run"
  shutil.copytree(finished_run[0], workdir)
  return workdir


def _flip_bytes(path: pathlib.Path, count: int = 64) -> None:
  data = bytearray(path.read_bytes())
  start = len(data) // 2
  for i in range(start, min(start + count, len(data))):
    data[i] ^= 0xFF
  path.write_bytes(bytes(data))


def _largest_file(directory: pathlib.Path) -> pathlib.Path:
  return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _corrupt_array_bytes(step_dir):  # the case: bytes inside a data chunk
  _flip_bytes(_largest_file(step_dir / "state" / "ocdbt.process_0" / "d"))


def _corrupt_state_file(step_dir):  # a data file orbax checksums (CRC-32C)
  _flip_bytes(_largest_file(step_dir / "state" / "d"))


def _corrupt_meta(step_dir):
  (step_dir / "meta" / "metadata").write_text("{not json")


def _remove_commit_marker(step_dir):
  (step_dir / "commit_success.txt").unlink()


def _corrupt_checkpoint_metadata(step_dir):
  (step_dir / "_CHECKPOINT_METADATA").write_bytes(b"\x00\x01garbage")


def _binary_meta(step_dir):
  (step_dir / "meta" / "metadata").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")


def _corrupt_tree_metadata(step_dir):
  _flip_bytes(step_dir / "state" / "_METADATA", count=16)


def _corrupt_manifest(step_dir):  # the OCDBT index of the array data
  _flip_bytes(step_dir / "state" / "manifest.ocdbt", count=16)


def _empty_tree_metadata(step_dir):  # valid JSON, no tree
  (step_dir / "state" / "_METADATA").write_text("{}")


# Each corruption and what its report says: the file (under checkpoints/6/) and the reason.
CORRUPTIONS = {
  _corrupt_array_bytes: ("6/state: array bytes differ", "digests"),
  _corrupt_state_file: ("6/state/d/", "DATA_LOSS"),
  _corrupt_meta: ("6/meta/metadata: not valid JSON", "line 1"),
  _binary_meta: ("6/meta/metadata: not UTF-8 text", "b'\\x89'"),
  _remove_commit_marker: ("6/commit_success.txt is missing", "never committed"),
  _corrupt_checkpoint_metadata: ("6/_CHECKPOINT_METADATA is unreadable", ""),
  _corrupt_tree_metadata: ("6/state/_METADATA: not ", ""),
  _corrupt_manifest: ("6/state/manifest.ocdbt: unreadable", "DATA_LOSS"),
  _empty_tree_metadata: ("6/state/_METADATA: the entry 'tree_metadata' is missing", ""),
}


@pytest.mark.slow
@pytest.mark.parametrize("corrupt", list(CORRUPTIONS))
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
  corrupt, finished_run, tmp_path, capsys
):
  """Rerun after corrupting checkpoint 6: the run resumes from 4, redoes steps 5-6 exactly,
  and checkpoint 6 is moved to workdir/quarantine, not deleted. The report names the
  step, the file and why in words (CORRUPTIONS), with no object reprs. Mutation caught:
  `checkpoint._corrupt` ignoring the files named in the error's chain (the data-file and
  manifest cases report only `state`)."""
  workdir = _copy(finished_run, tmp_path)
  corrupt(workdir / "checkpoints" / "6")
  state = rl.run(_config(), str(workdir))
  (report,) = [line for line in capsys.readouterr().out.splitlines() if "IS CORRUPT" in line]
  where, why = CORRUPTIONS[corrupt]
  assert report.startswith("CHECKPOINT 6 IS CORRUPT"), report
  assert f"checkpoints/{where}" in report and why in report and " object at 0x" not in report
  assert "<bound method" not in report, report
  assert _metrics(workdir) == _metrics(finished_run[0])
  _assert_same_weights(state, finished_run[1])
  (kept,) = list((workdir / "quarantine").iterdir())
  assert kept.name.startswith("6-") and (kept / "state").is_dir()
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [
    2,
    4,
    6,
  ]


def test_corrupt_array_bytes_fail_the_digest_check(finished_run, tmp_path):
  """Bytes flipped inside a data chunk pass orbax's own checks; the digests catch them."""
  workdir = _copy(finished_run, tmp_path)
  state, meta = checkpoint.restore(checkpoint.manager(str(workdir)), 6, finished_run[1])
  assert meta["iteration"] == 6 and "digests" not in meta
  _assert_same_weights(state, finished_run[1])
  _corrupt_array_bytes(workdir / "checkpoints" / "6")
  with pytest.raises(checkpoint.CorruptCheckpointError, match="array bytes differ"):
    checkpoint.restore(checkpoint.manager(str(workdir)), 6, finished_run[1])


def test_the_carry_is_verified_like_the_state(tmp_path):
  """A checkpoint's carry (a pipelined run's older policies) restores with its template;
  read without one (an evaluation) it is left unread. Bytes flipped in it fail its
  digests, and `restore_latest` quarantines that checkpoint and falls back to the
  previous one. Mutation caught: the carry's digests not compared (the flipped bytes
  restored as they were)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from rlpost.train import step as train  # pylint: disable=g-import-not-at-top

  state = train.init_train_state(jnp.zeros((4,)), optax.sgd(0.1), jax.random.key(0))
  mngr = checkpoint.manager(str(tmp_path))
  for step in (1, 2):
    carried = ({"versions": [step]}, {str(step): jnp.arange(4096.0) * step})
    checkpoint.save(mngr, step, state, {"iteration": step}, carried)
  like = lambda state, meta: {str(v): jnp.zeros((4096,)) for v in meta["versions"]}
  _, meta = checkpoint.restore(mngr, 2, state, like)
  assert meta["carry"].meta == {"versions": [2]} and "carry_digests" not in meta
  np.testing.assert_array_equal(meta["carry"].arrays["2"], np.arange(4096.0) * 2)
  assert checkpoint.restore(mngr, 2, state)[1]["carry"].arrays is None
  _flip_bytes(_largest_file(tmp_path / "checkpoints" / "2" / "carry" / "ocdbt.process_0" / "d"))
  with pytest.raises(checkpoint.CorruptCheckpointError, match="/carry: array bytes differ"):
    checkpoint.restore(mngr, 2, state, like)
  _, meta = checkpoint.restore_latest(mngr, state, like)
  assert meta["iteration"] == 1 and meta["carry"].meta == {"versions": [1]}
  assert [p.name.split("-")[0] for p in (tmp_path / "quarantine").iterdir()] == ["2"]
  mngr.close()


def test_no_intact_checkpoint_stops_naming_the_directory_and_choices(finished_run, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  for step in (2, 4, 6):
    _corrupt_meta(workdir / "checkpoints" / str(step))
  with pytest.raises(checkpoint.NoIntactCheckpointError, match="new --workdir") as err:
    rl.run(_config(), str(workdir))
  assert str(workdir / "checkpoints") in str(err.value)
  assert len(list((workdir / "quarantine").iterdir())) == 3


def test_rerun_after_no_intact_checkpoint_stops_again(finished_run, tmp_path):
  """Rerunning the same command after NoIntactCheckpointError stops again, metrics.jsonl
  untouched; removing the checkpoint directory (the error's advice) starts afresh.
  Mutation caught: no marker (the rerun found no checkpoint, started over from step 0 and
  truncated metrics.jsonl to nothing)."""
  workdir = _copy(finished_run, tmp_path)
  for step in (2, 4, 6):
    _corrupt_meta(workdir / "checkpoints" / str(step))
  with pytest.raises(checkpoint.NoIntactCheckpointError):
    rl.run(_config(), str(workdir))
  with pytest.raises(checkpoint.NoIntactCheckpointError, match="new --workdir"):
    rl.run(_config(), str(workdir))
  assert _metrics(workdir) == _metrics(finished_run[0])
  assert len(list((workdir / "quarantine").iterdir())) == 3
  shutil.rmtree(workdir / "checkpoints")
  assert checkpoint.restore_latest(checkpoint.manager(str(workdir)), finished_run[1]) is None


def test_reading_a_run_leaves_its_unfinished_save_alone(finished_run, tmp_path):
  """Reading a run's weights (model.init_from; the evaluation opens it the same way) while
  that run writes a checkpoint leaves the write's temporary directory in place. Mutation
  caught: the reader opened the run's own manager, whose clean-up (in a background thread)
  deleted the directory being written, failing the other run's save."""
  workdir = _copy(finished_run, tmp_path)
  writing = workdir / "checkpoints" / "8.orbax-checkpoint-tmp-1234"  # a save in progress
  (writing / "state").mkdir(parents=True)
  cfg = _config()
  cfg.model.init_from = str(workdir)
  common.load_model(cfg)
  time.sleep(1.0)  # the clean-up runs in the background
  assert (writing / "state").is_dir()
  assert not (workdir / "quarantine").exists()


def _snapshot(directory: pathlib.Path) -> dict:
  """{relative path: (size, mtime_ns)} of every file and directory under `directory`."""
  return {
    str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
    for p in sorted(directory.rglob("*"))
  }


def test_init_from_reads_a_corrupt_source_without_changing_it(finished_run, tmp_path, capsys):
  """model.init_from = a run whose newest checkpoint is corrupt: reported, skipped, and
  the previous one's weights used; with none intact, a NoIntactCheckpointError naming the
  directory. Every file of the source keeps its name, size and mtime (nothing moved to a
  quarantine, no marker written). Mutation caught: `restore_latest` ignoring read_only
  (checkpoint 6 moved into the source's quarantine/)."""
  workdir = _copy(finished_run, tmp_path)
  _corrupt_array_bytes(workdir / "checkpoints" / "6")
  before = _snapshot(workdir)
  cfg = _config()
  cfg.model.init_from = str(workdir)
  _, params, _ = common.load_model(cfg)
  with checkpoint.manager(str(finished_run[0]), read_only=True) as mngr:
    at_four, _ = checkpoint.restore(mngr, 4, finished_run[1])
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.device_get(params),
    jax.device_get(at_four.trainable["policy"]),
  )
  assert "It was left where it is (another run's)" in capsys.readouterr().out
  assert _snapshot(workdir) == before
  for step in (2, 4):
    _corrupt_array_bytes(workdir / "checkpoints" / str(step))
  before = _snapshot(workdir)
  with pytest.raises(
    checkpoint.NoIntactCheckpointError, match=r"checkpoints \(another run's, read only"
  ):
    common.load_model(cfg)
  assert _snapshot(workdir) == before


def test_changed_config_is_not_taken_for_corruption(finished_run, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  with pytest.raises(checkpoint.StateMismatchError, match="config changed"):
    rl.run(_config(**{"lora.enabled": True}), str(workdir))
  assert not (workdir / "quarantine").exists()


@pytest.mark.slow
def test_failed_write_stops_the_run_and_the_previous_checkpoint_restores(tmp_path, monkeypatch):
  """ENOSPC raised inside the save of checkpoint 4: a clear error; checkpoint 2 restores
  bitwise and the same command resumes from it."""
  workdir = str(tmp_path / "run")
  at_two = rl.run(_config(), workdir, stop_after=2)

  async def disk_full(self, item, directory):
    raise OSError(errno.ENOSPC, "No space left on device")

  with monkeypatch.context() as patch:
    patch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", disk_full)
    with pytest.raises(checkpoint.CheckpointWriteError, match="checkpoint 2 is intact"):
      rl.run(_config(), workdir, stop_after=2)
  mngr = checkpoint.manager(workdir)
  assert mngr.all_steps() == [2]
  state, meta = checkpoint.restore_latest(mngr, at_two)
  assert meta["iteration"] == 2
  _assert_same_weights(state, at_two)
  mngr.close()
  rl.run(_config(), workdir)
  assert [r["step"] for r in _metrics(workdir)] == [1, 2, 3, 4, 5, 6]


def test_ctrl_c_inside_a_save_is_an_interrupt_not_a_failed_write(tmp_path, monkeypatch):
  """Ctrl-C landing in orbax's rmtree of an old step surfaced as `OSError: Bad file
  descriptor` raised while handling the KeyboardInterrupt; the save must re-raise the
  interrupt, not report a failed write with "free disk space" advice (exit status 1).
  Mutation caught: without the `_interrupted` check, CheckpointWriteError."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from rlpost.train import step as train  # pylint: disable=g-import-not-at-top

  state = train.init_train_state(jnp.zeros((4,)), optax.sgd(0.1), jax.random.key(0))
  mngr = checkpoint.manager(str(tmp_path))

  async def interrupted(self, item, directory):
    try:
      raise KeyboardInterrupt
    except KeyboardInterrupt:
      raise OSError(errno.EBADF, "Bad file descriptor") from None

  with monkeypatch.context() as patch:
    patch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", interrupted)
    with pytest.raises(KeyboardInterrupt, match="checkpoint 1 interrupted"):
      checkpoint.save(mngr, 1, state, {"iteration": 1})

    async def disk_full(self, item, directory):
      raise OSError(errno.ENOSPC, "No space left on device")

    patch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", disk_full)
    with pytest.raises(checkpoint.CheckpointWriteError, match="No space left"):
      checkpoint.save(mngr, 2, state, {"iteration": 2})
  mngr.close()


@pytest.mark.slow
def test_sft_falls_back_past_a_corrupt_checkpoint_too(tmp_path):
  """The fallback lives in the shared run loop: SFT (and DPO) get it as GRPO does."""
  from experiments.configs import sft as sft_configs  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import sft as sft_recipe  # pylint: disable=g-import-not-at-top

  cfg = sft_configs.get_config("tiny")
  cfg.eval.every, cfg.train.steps, cfg.checkpoint.every = 0, 4, 2
  straight, _ = sft_recipe.run(cfg, str(tmp_path / "straight"))
  workdir = tmp_path / "run"
  shutil.copytree(tmp_path / "straight", workdir)
  _corrupt_array_bytes(workdir / "checkpoints" / "4")
  resumed, _ = sft_recipe.run(cfg, str(workdir))
  _assert_same_weights(resumed, straight)
  assert _metrics(workdir) == _metrics(tmp_path / "straight")
  assert [p.name.split("-")[0] for p in (workdir / "quarantine").iterdir()] == ["4"]


def _unreadable_arrays(state_dir: pathlib.Path) -> list[str]:
  """The arrays of a checkpoint item (its OCDBT store) whose chunks no longer read."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{state_dir}/"}).result()
  bad = set()
  for key in store.list().result():
    try:
      store.read(key).result()
    except ValueError:
      bad.add(key.decode().split("/")[0])
  return sorted(bad)


def _multi_array_file(state_dir: pathlib.Path, scratch: pathlib.Path) -> str:
  """The name of the OCDBT data file under `state_dir` that holds the most arrays, found by
  content: each file emptied in a copy, the arrays that stop reading counted."""
  held = {}
  for data_file in (state_dir / "ocdbt.process_0" / "d").iterdir():
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(state_dir, scratch)
    (scratch / "ocdbt.process_0" / "d" / data_file.name).write_bytes(b"")
    held[data_file.name] = _unreadable_arrays(scratch)
  name = max(held, key=lambda n: len(held[n]))
  assert len(held[name]) >= 2, held  # the case at issue: one file, several arrays
  return name


def _damage(step_dir: pathlib.Path, how: str, scratch: pathlib.Path) -> None:
  state = step_dir / "state"
  path = state / "ocdbt.process_0" / "d" / _multi_array_file(state, scratch)
  if how == "truncated":
    path.write_bytes(b"")
  elif how == "zero-filled":
    path.write_bytes(bytes(path.stat().st_size))
  else:
    path.unlink()


_NOISE = ("Traceback", "Event loop is closed", "Exception ignored", "never retrieved")


def _log_lines(output: str) -> list[str]:
  """The output's lines less the progress bars' redraws."""
  lines = [line.strip() for line in output.replace("\r", "\n").splitlines()]
  return [line for line in lines if line and "it/s" not in line and "%|" not in line]


@pytest.mark.slow
def test_a_multi_array_file_damaged_is_one_line_through_the_main(finished_run, tmp_path):
  """Issue 71: checkpoint 6's OCDBT data file holding the most arrays (chosen by content)
  truncated, zero-filled or deleted, then the same command again: its whole log is the
  one CHECKPOINT 6 IS CORRUPT line and the closing metrics line (no traceback, no
  event-loop error), and the run ends as the uninterrupted one did (metrics and every
  array's digest). Every checkpoint damaged: one line each, then the FATAL line, status 2.
  `init_from` a damaged run: the one line, and the run trains. One process start for the
  five (tests/cli_batch.py). Mutation caught: `checkpoint._item` without
  `settled_loops()` (dozens of tracebacks after the first failed read)."""
  from conftest import run_clis  # pylint: disable=g-import-not-at-top

  scratch, flags = tmp_path / "scratch", ["--config.train.steps=6", "--config.checkpoint.every=2"]
  main, config = "experiments.grpo", "--config=experiments/configs/grpo_gsm8k.py:tiny"
  cases, hows = [], ("truncated", "zero-filled", "deleted")
  for how in hows:
    workdir = _copy(finished_run, tmp_path / how)
    _damage(workdir / "checkpoints" / "6", how, scratch)
    cases.append([main, [config, *flags, f"--workdir={workdir}"]])
  every = _copy(finished_run, tmp_path / "every")
  for step in (2, 4, 6):
    _damage(every / "checkpoints" / str(step), "truncated", scratch)
  cases.append([main, [config, *flags, f"--workdir={every}"]])
  source = _copy(finished_run, tmp_path / "source")
  _damage(source / "checkpoints" / "6", "truncated", scratch)
  init = [f"--config.model.init_from={source}", "--config.train.steps=1"]
  cases.append([main, [config, *init, f"--workdir={tmp_path / 'init'}"]])
  runs = run_clis(cases)

  saved = lambda w: json.loads((w / "checkpoints" / "6" / "meta" / "metadata").read_text())
  for how, (status, output) in zip(hows, runs[:3]):
    lines = _log_lines(output)
    assert status == 0 and len(lines) == 2, (how, output[-3000:])
    assert lines[0].startswith("CHECKPOINT 6 IS CORRUPT: ") and "quarantine" in lines[0]
    assert lines[1].startswith("metrics: ") and not any(n in output for n in _NOISE)
    workdir = tmp_path / how / "run"
    assert _metrics(workdir) == _metrics(finished_run[0])
    assert saved(workdir)["digests"] == saved(finished_run[0])["digests"]
  status, output = runs[3]
  lines = _log_lines(output)
  assert status == 2 and [line[:25] for line in lines[:3]] == [
    f"CHECKPOINT {step} IS CORRUPT: " for step in (6, 4, 2)
  ]
  assert len(lines) == 4 and lines[3].startswith("FATAL NoIntactCheckpointError: "), output
  assert not any(n in output for n in _NOISE)
  status, output = runs[4]
  lines = _log_lines(output)
  assert status == 0 and len(lines) == 2 and "It was left where it is" in lines[0], output
  assert not any(n in output for n in _NOISE)


def _old_layout(learner: str, cfg, state):
  """`state` (a fresh tiny GRPO or PPO TrainState) as the code before `{"policy": ...}`
  built it: GRPO's trainable the policy's tree itself, PPO's {"actor", "critic"} under a
  multi_transform labelled "actor" / "critic"; every array drawn at random (integers
  counted), so that no two arrays of a kind are equal."""
  import optax  # pylint: disable=g-import-not-at-top

  from rlpost.train import step as train  # pylint: disable=g-import-not-at-top

  policy = state.trainable["policy"]
  if learner == "grpo":
    trainable, optimizer = policy, common.make_optimizer(cfg, 10)
  else:
    trainable = {"actor": policy, "critic": state.trainable["critic"]}
    parts = {
      "actor": train.gated(common.make_optimizer(cfg, 10), "actor_on"),
      "critic": common.make_optimizer(cfg, 10),
    }
    optimizer = optax.multi_transform(parts, {"actor": "actor", "critic": "critic"})
  old = state._replace(trainable=trainable, opt_state=optimizer.init(trainable))
  leaves, treedef = jax.tree.flatten(old)
  drawn = [
    x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    else (jax.random.normal(jax.random.key(i), x.shape) * 7).astype(x.dtype)
    if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
    else jax.numpy.full(x.shape, i, x.dtype)
    for i, x in enumerate(leaves)
  ]
  return jax.tree.unflatten(treedef, drawn)


def _by_path(state, rename=lambda path: path) -> dict:
  """{path (renamed): host array} of every array of a TrainState (the key as its data)."""
  state = state._replace(key=jax.random.key_data(state.key))
  flat = jax.tree_util.tree_flatten_with_path(state)[0]
  return {rename(jax.tree_util.keystr(p)): np.asarray(jax.device_get(x)) for p, x in flat}


@pytest.mark.parametrize("learner", ["grpo", "ppo"])
def test_a_checkpoint_of_the_layout_before_policy_restores_bitwise(learner, tmp_path):
  """A checkpoint written before the one trainable layout (GRPO: the bare policy tree;
  PPO: "actor" beside "critic", in the trainable, the AdamW moments and the
  multi_transform labels), saved from a real tiny state with every array drawn, restores
  into today's `{"policy": ...}` state with each array, bitwise, at its path renamed
  ("['policy']" -> "" or "['actor']"), and in today's tree structure. Mutation caught: the
  legacy layout not recognised (StateMismatchError)."""
  from experiments.configs import ppo_gsm8k  # pylint: disable=g-import-not-at-top

  cfg = _config() if learner == "grpo" else ppo_gsm8k.get_config("tiny")
  fresh = rl.build(cfg).state
  old = _old_layout(learner, cfg, fresh)
  with checkpoint.manager(str(tmp_path)) as mngr:
    checkpoint.save(mngr, 4, old, {"iteration": 4})
    restored, meta = checkpoint.restore_latest(mngr, fresh)
  assert meta["iteration"] == 4
  assert jax.tree.structure(restored) == jax.tree.structure(fresh)
  new = "" if learner == "grpo" else "['actor']"
  got = _by_path(restored, lambda path: path.replace("['policy']", new))
  want = _by_path(old)
  assert sorted(got) == sorted(want) and len(want) > 20
  for path, array in want.items():
    assert got[path].dtype == array.dtype and got[path].tobytes() == array.tobytes(), path
