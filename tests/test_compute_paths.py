"""`train.compute_dtype="auto"` (rlpost.train.compute_paths): the choice per backend and
CPU, its per-machine cache, and a run that records it and keeps it on resume."""

import json

import pytest

from conftest import with_overrides
from experiments.configs import sft as sft_configs
from rlpost.recipes import sft
from rlpost.train import compute_paths
from rlpost.train import runtime

XEON = "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: avx512f avx512_bf16 avx512_vnni\n"
EPYC = "model name\t: AMD EPYC 9B14\nflags\t\t: avx512f avx512_bf16 avx512_vnni avx512_vbmi2\n"
# Probe seconds per dtype, shaped like the measurements: on the Xeon of issue 18 bf16
# matmuls ran ~5x slower than float32 at batch 8 (210 vs 39 ms); on this project's AMD
# EPYC the mixed-precision train-step matmuls run faster than float32.
TIMINGS = {
  XEON: {"float32": 0.039, "bfloat16": 0.210},
  EPYC: {"float32": 0.060, "bfloat16": 0.035},
}


class _Timer:
  """Mocked probe: records which dtypes it was asked to time."""

  def __init__(self, seconds):
    self.seconds, self.calls = seconds, []

  def __call__(self, dtype):
    self.calls.append(dtype)
    return self.seconds[dtype]


_machine_key = runtime.machine_key


@pytest.mark.parametrize("cpu,expected", [(XEON, "float32"), (EPYC, "bfloat16")])
def test_each_cpu_gets_its_faster_path_and_calibrates_once(cpu, expected, tmp_path, monkeypatch):
  monkeypatch.setattr(runtime, "machine_key", lambda: _machine_key(cpu))
  timer = _Timer(TIMINGS[cpu])
  dtype, why = compute_paths.resolve("cpu", str(tmp_path), timer)
  assert (
    dtype == expected
    and "calibrated" in why
    and sorted(timer.calls) == sorted(compute_paths.CHOICES)
  )
  again, why = compute_paths.resolve("cpu", str(tmp_path), timer)
  assert again == expected and "earlier" in why and len(timer.calls) == 2  # cached


def test_another_cpu_does_not_reuse_a_calibration(tmp_path, monkeypatch):
  for cpu in (XEON, EPYC):
    monkeypatch.setattr(runtime, "machine_key", lambda cpu=cpu: _machine_key(cpu))
    dtype, _ = compute_paths.resolve("cpu", str(tmp_path), _Timer(TIMINGS[cpu]))
    assert dtype == ("float32" if cpu is XEON else "bfloat16")
  assert len(list(tmp_path.iterdir())) == 2


def test_accelerators_use_the_table_and_close_timings_keep_float32(tmp_path):
  timer = _Timer({"float32": 1.0, "bfloat16": 0.1})
  for backend in ("gpu", "tpu"):
    assert compute_paths.resolve(backend, str(tmp_path), timer)[0] == "bfloat16"
  assert timer.calls == []
  # bfloat16 only when clearly faster: float32 is the exact path.
  assert compute_paths.choose({"float32": 1.0, "bfloat16": 0.9}) == "float32"
  assert compute_paths.choose({"float32": 1.0, "bfloat16": 0.8}) == "bfloat16"


def test_explicit_settings_win_and_a_resumed_run_keeps_its_recorded_choice(tmp_path):
  never = lambda: pytest.fail("must not calibrate")
  assert compute_paths.resolve_for_run("float32", str(tmp_path), never)[0] == "float32"
  (tmp_path / "config.json").write_text(json.dumps({"train": {"compute_dtype": "bfloat16"}}))
  dtype, why = compute_paths.resolve_for_run("auto", str(tmp_path), never)
  assert dtype == "bfloat16" and "config.json" in why
  fresh = tmp_path / "fresh"
  assert compute_paths.resolve_for_run("auto", str(fresh), lambda: ("float32", "x"))[0] == "float32"


@pytest.mark.optimized_codegen
def test_the_real_probe_times_both_paths():
  """On this machine: both probes run and take a positive time (which is faster is the
  benchmarks' business: `sft_step --compute_dtype=...`; figures per machine in
  experiments/benchmarks/results/issue18/)."""
  for dtype in compute_paths.CHOICES:
    assert compute_paths.probe_seconds(dtype, repeats=1) > 0


@pytest.mark.slow
def test_an_auto_run_records_its_choice_and_keeps_it_when_resumed(tmp_path, monkeypatch):
  """A tiny SFT run with compute_dtype=auto writes the chosen dtype into config.json; when
  resumed where the calibration would now say otherwise, it keeps its own."""
  cfg = lambda: with_overrides(
    sft_configs.get_config("tiny"),
    {"train.compute_dtype": "auto", "train.steps": 2, "checkpoint.every": 1},
  )
  recorded = lambda d: json.loads((d / "config.json").read_text())["train"]["compute_dtype"]
  monkeypatch.setattr(compute_paths, "resolve", lambda: ("bfloat16", "mocked calibration"))
  sft.run(cfg(), str(tmp_path), stop_after=1)
  assert recorded(tmp_path) == "bfloat16"
  monkeypatch.setattr(compute_paths, "resolve", lambda: ("float32", "another machine"))
  resumed = cfg()
  sft.run(resumed, str(tmp_path))
  assert recorded(tmp_path) == "bfloat16"
  assert resumed.train.compute_dtype == "auto"  # the caller's config is never written
  # A fresh run on that machine takes its choice.
  sft.run(cfg(), str(tmp_path / "fresh"), stop_after=1)
  assert recorded(tmp_path / "fresh") == "float32"


@pytest.mark.slow
def test_an_auto_int8_run_records_its_dots_and_keeps_them_when_resumed(tmp_path, monkeypatch):
  """sampling.int8_paths=auto (int8 rollouts): the chosen dots go into config.json as
  LAYOUT:ROWS and a resumed run keeps them where the calibration would now say otherwise.
  Mutation caught: a resumed run that calibrates again (it took io:8)."""
  from experiments.configs import grpo_gsm8k  # pylint: disable=g-import-not-at-top
  from rlpost.models import quant  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top

  cfg = lambda: with_overrides(
    grpo_gsm8k.get_config("tiny"),
    {
      "sampling.weights": "int8",
      "sampling.int8_paths": "auto",
      "algo.tis_cap": 2.0,
      "train.steps": 2,
      "checkpoint.every": 1,
    },
  )
  recorded = lambda d: json.loads((d / "config.json").read_text())["sampling"]["int8_paths"]
  choose = lambda paths: lambda: (quant.parse_paths(paths), "mocked calibration")
  monkeypatch.setattr(compute_paths, "resolve_int8", choose("oik:3"))
  rl.run(cfg(), str(tmp_path), stop_after=1)
  assert recorded(tmp_path) == "oik:3"
  monkeypatch.setattr(compute_paths, "resolve_int8", choose("io:8"))
  resumed = cfg()
  rl.run(resumed, str(tmp_path))  # a resume rewrites config.json with what it resolved
  assert recorded(tmp_path) == "oik:3"
  assert resumed.sampling.int8_paths == "auto"  # the caller's config is never written
  model_weights = with_overrides(cfg(), {"sampling.weights": "model"})
  rl.run(model_weights, str(tmp_path / "float"), stop_after=1)  # no calibration needed
  assert recorded(tmp_path / "float") == "auto"


# Int8 probe milliseconds keyed "<part>@<rows>", shaped like the measurements
# (experiments/benchmarks/results/issue18/compute_paths_and_int8.md and its machine folders):
# on the AMD EPYC the output projection is faster with the activations on the left up to
# 8 rows and the layers' "io" layout is as fast as "oik"; on the Intel Xeon with AMX
# (2026-11-24) the weights on the left win at every row count, and "oik" in the layers.
INT8_EPYC = {
  "io@2": 0.45, "io@8": 0.55, "oik@2": 0.46, "oik@8": 0.56,
  "activations_left@2": 11.7, "activations_left@8": 18.3, "activations_left@32": 60.0,
  "weights_left@2": 17.8, "weights_left@8": 19.7, "weights_left@32": 45.0,
}  # fmt: skip
INT8_XEON_AMX = {
  "io@2": 0.53, "io@8": 0.62, "oik@2": 0.42, "oik@8": 0.47,
  "activations_left@2": 12.34, "activations_left@8": 12.85, "activations_left@32": 30.84,
  "weights_left@2": 6.95, "weights_left@8": 8.03, "weights_left@32": 26.95,
}  # fmt: skip


@pytest.mark.parametrize(
  "cpu,timings,expected",
  [(EPYC, INT8_EPYC, ("io", 8)), (XEON, INT8_XEON_AMX, ("oik", 0))],
)
def test_each_cpu_gets_its_faster_int8_dots_and_calibrates_once(
  cpu, timings, expected, tmp_path, monkeypatch
):
  monkeypatch.setattr(runtime, "machine_key", lambda: _machine_key(cpu))
  calls = []
  timer = lambda part, rows: calls.append((part, rows)) or timings[f"{part}@{rows}"] / 1e3
  paths, why = compute_paths.resolve_int8("cpu", str(tmp_path), timer)
  assert (paths.layer_layout, paths.activations_left_max_rows) == expected
  rounds = compute_paths.INT8_ROUNDS
  assert "calibrated" in why and len(calls) == rounds * len(timings)
  again, why = compute_paths.resolve_int8("cpu", str(tmp_path), timer)
  assert again == paths and "earlier" in why and len(calls) == rounds * len(timings)  # cached
  # The dtype calibration of the same machine is a file of its own.
  assert len(list(tmp_path.iterdir())) == 1


def test_int8_choice_rules():
  ms = dict(INT8_EPYC)
  # The activations stay on the left only while they win at every smaller row count.
  ms["activations_left@8"] = 25.0
  assert (
    compute_paths.choose_int8({k: v / 1e3 for k, v in ms.items()}).activations_left_max_rows == 2
  )
  ms["activations_left@2"] = 20.0
  ms["activations_left@8"] = 1.0
  assert (
    compute_paths.choose_int8({k: v / 1e3 for k, v in ms.items()}).activations_left_max_rows == 0
  )
  # "oik" only when clearly faster than the established "io".
  ms.update({"oik@2": 0.46, "oik@8": 0.50})  # 0.96x io's 1.00
  assert compute_paths.choose_int8(ms).layer_layout == "io"
  ms.update({"oik@2": 0.35, "oik@8": 0.45})
  assert compute_paths.choose_int8(ms).layer_layout == "oik"


def test_int8_paths_setting_and_accelerators(tmp_path):
  never = lambda: pytest.fail("must not calibrate")
  paths, why = compute_paths.int8_paths("oik:0", never)
  assert (paths.layer_layout, paths.activations_left_max_rows, why) == (
    "oik",
    0,
    "set in the config",
  )
  for bad in ("ik:8", "io", "io:-1", "io:x", ""):
    with pytest.raises(ValueError, match=r"config\.sampling\.int8_paths=.*LAYOUT:ROWS"):
      compute_paths.int8_paths(bad, never)
  for backend in ("gpu", "tpu"):
    paths, _ = compute_paths.resolve_int8(backend, str(tmp_path), lambda *a: pytest.fail("timed"))
    assert paths == compute_paths.quant.Int8Paths()


def test_a_burst_of_load_during_one_round_does_not_change_the_int8_choice(tmp_path):
  """The rounds are interleaved: a burst that triples the first 6 timings slows one round
  of several candidates and the best of the others stands. (Mutation checked: timing each
  formulation's rounds back to back puts the whole burst on "io" and picks "oik".)"""
  calls = []

  def timer(part, rows):
    calls.append(f"{part}@{rows}")
    return INT8_EPYC[f"{part}@{rows}"] / 1e3 * (3 if len(calls) <= 6 else 1)

  paths, _ = compute_paths.resolve_int8("cpu", str(tmp_path), timer)
  assert (paths.layer_layout, paths.activations_left_max_rows) == ("io", 8)
  first_round = calls[: len(INT8_EPYC)]
  assert sorted(first_round) == sorted(INT8_EPYC)  # every formulation once per round


@pytest.mark.slow
@pytest.mark.optimized_codegen
def test_the_real_int8_probe_times_every_part_over_more_than_a_cache_of_layer_weights():
  probes = compute_paths.Int8Probes(repeats=1)
  for part in ("io", "oik", "activations_left", "weights_left"):
    assert probes(part, 2) > 0
  for layout in ("io", "oik"):  # distinct copies, like the decode step's 18 layers
    weights = probes._prepared["weights", layout]  # pylint: disable=protected-access
    assert len({id(w.q) for w in weights}) == len(weights)
    assert sum(w.q.nbytes for w in weights) > 64 * 2**20


def test_an_unusable_cache_calibrates_again_and_an_unwritable_one_only_warns(
  tmp_path, monkeypatch, caplog
):
  """Half-written, hand-edited or stale files are calibrated over; a cache directory that
  cannot be created (here: a file stands in its place) costs a warning, not the run."""
  monkeypatch.setattr(runtime, "machine_key", lambda: _machine_key(EPYC))
  timer = _Timer(TIMINGS[EPYC])
  path = tmp_path / (runtime.machine_key() + ".json")
  for bad in ('{"compute_dtype": "bfl', '{"compute_dtype": "float16", "seconds": {}}', "[]"):
    path.write_text(bad)
    with caplog.at_level("WARNING"):
      dtype, why = compute_paths.resolve("cpu", str(tmp_path), timer)
    assert dtype == "bfloat16" and "earlier" not in why and "calibrating again" in caplog.text
    caplog.clear()
  # The last calibration replaced the bad file: the next run reads it.
  assert compute_paths.resolve("cpu", str(tmp_path), timer)[1].startswith("calibrated earlier")
  blocked = tmp_path / "not_a_dir"
  blocked.write_text("")
  with caplog.at_level("WARNING"):
    dtype, why = compute_paths.resolve("cpu", str(blocked / "cache"), timer)
  assert dtype == "bfloat16" and "not cached" in caplog.text
  paths, _ = compute_paths.resolve_int8(
    "cpu", str(blocked / "cache"), lambda part, rows: INT8_EPYC[f"{part}@{rows}"]
  )
  assert paths == compute_paths.quant.Int8Paths("io", 8)
