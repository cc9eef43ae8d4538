"""Benchmark scripts still run and print their JSON (tiny preset; no timing is asserted)."""

import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, import_main


def _report(module: str, *flags: str) -> dict:
  """The JSON a benchmark module prints when run with `flags`."""
  out = subprocess.run(
    [sys.executable, "-m", f"experiments.benchmarks.{module}", *flags],
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    check=True,
  )
  return json.loads(out.stdout)


def test_rss_budget_flags_a_peak_past_its_expected_figure_and_tolerance():
  """Each expected mode passes at its figure plus the tolerance and fails 0.01 GiB above,
  with a line naming the mode, the figure and the table; runs off the default workload
  are not checked.

  Mutation caught: the tolerance doubled (`rss_budget_tolerance_doubled`)."""
  from experiments.benchmarks import rss_budget  # pylint: disable=g-import-not-at-top

  tol = rss_budget.TOLERANCE_GIB
  for name, expected in rss_budget.EXPECTED.items():
    assert rss_budget.check(name, expected + tol)["verdict"] == "ok"
    over = round(expected + tol + 0.01, 2)
    record = {"peak_rss_gib": over, "rss_check": rss_budget.check(name, over)}
    assert record["rss_check"]["verdict"] == "grown", name
    (line,) = rss_budget.failures({"lora": record})
    assert name in line and str(over) in line and "rss_budget.py" in line
  assert rss_budget.check(None, 99.0)["verdict"] == "unchecked"
  assert rss_budget.check("full_bf16", 99.0)["verdict"] == "unchecked"
  assert (
    rss_budget.failures({"lora": {"peak_rss_gib": 99.0, "rss_check": {"verdict": "unchecked"}}})
    == []
  )


def test_rss_budget_keys_and_issue_65_bounds():
  """A run's key is its mode, plus "_int8" for int8 rollouts, after the preset's name off
  Gemma 3 270M (no expected figure), None off the default workload; the expected figures
  keep issue 65's bounds: LoRA <= 3.6 GiB and int8 rollouts at most 0.4 GiB above it.

  Mutation caught: the preset left out of the key (`rss_budget_key_without_preset`)."""
  from experiments.benchmarks import rss_budget  # pylint: disable=g-import-not-at-top

  assert rss_budget.key("lora", "model", True) == "lora"
  assert rss_budget.key("lora", "int8", True) == "lora_int8"
  assert rss_budget.key("lora", "int8", False) is None
  assert rss_budget.key("qlora", "model", True, compute_dtype="float32") is None  # Zen 3's auto
  expected = rss_budget.EXPECTED
  for mode in ("full", "lora", "qlora"):  # another architecture: never the 270M figures
    for sampler in ("model", "int8"):
      name = rss_budget.key(mode, sampler, True, "gemma3_1b")
      assert name.startswith("gemma3_1b_") and name not in expected, name
      assert rss_budget.check(name, 99.0)["verdict"] == "unchecked"
      assert rss_budget.key(mode, sampler, True, "gemma3_270m") == rss_budget.key(
        mode, sampler, True
      )
  assert expected["lora"] <= 3.6
  assert expected["lora_int8"] <= expected["lora"] + 0.4


def test_grpo_step_exits_naming_a_mode_whose_peak_grew(monkeypatch, capsys):
  """grpo_step prints its JSON, then exits with the grown mode's line (status 1) unless
  --check_rss=false; the mode's process is faked (its JSON line), no model runs."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top

  from experiments.benchmarks import rss_budget  # pylint: disable=g-import-not-at-top

  grpo_step = import_main("experiments.benchmarks.grpo_step")

  over = rss_budget.EXPECTED["lora"] + 1.0
  line = json.dumps({"iteration_peak_rss_gib": over, "rss_check": rss_budget.check("lora", over)})
  fake = lambda args, **kw: subprocess.CompletedProcess(args, 0, stdout=line + "\n", stderr="")
  monkeypatch.setattr(grpo_step.subprocess, "run", fake)
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  with flagsaver.flagsaver(modes=["lora"]):
    with pytest.raises(SystemExit, match=f"grpo_step lora: iteration_peak_rss_gib={over}"):
      grpo_step.main([])
    assert json.loads(capsys.readouterr().out)["lora"]["iteration_peak_rss_gib"] == over
    with flagsaver.flagsaver(check_rss=False):
      grpo_step.main([])


def test_grpo_step_preset_reaches_each_mode_and_its_key(monkeypatch, capsys):
  """--preset=gemma3_1b is passed to each mode's process and named in the JSON, and the
  mode's budget key carries it (unchecked: no 1B figure), so a 1B peak far above the 270M
  figures exits 0; the mode's process is faked.

  Mutation caught: --preset not forwarded to the modes' processes
  (`grpo_step_preset_not_forwarded`); the key built without it
  (`grpo_step_budget_key_without_preset`)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top

  grpo_step = import_main("experiments.benchmarks.grpo_step")
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  calls = []

  def fake(args, **kw):
    del kw
    calls.append(args)
    mode = next(a.split("=", 1)[1] for a in args if a.startswith("--mode="))
    preset = [a.split("=", 1)[1] for a in args if a.startswith("--preset=")]
    with flagsaver.flagsaver(preset=preset[-1] if preset else "gemma3_270m"):
      key = grpo_step._budget_key(mode, grpo_step.rss_budget.RECORDED_COMPUTE_DTYPE)
      check = grpo_step.rss_budget.check(key, 99.0)
    line = json.dumps({"iteration_peak_rss_gib": 99.0, "rss_check": check})
    return subprocess.CompletedProcess(args, 0, stdout=line + "\n", stderr="")

  monkeypatch.setattr(grpo_step.subprocess, "run", fake)
  with flagsaver.flagsaver(modes=["lora", "qlora"], preset="gemma3_1b", check_rss=True):
    grpo_step.main([])  # no SystemExit: nothing compared to the 270M figures
  out = json.loads(capsys.readouterr().out)
  assert out["preset"] == "gemma3_1b" and len(calls) == 2
  for args, mode in zip(calls, ("lora", "qlora")):
    assert "--preset=gemma3_1b" in args, args
    assert out[mode]["rss_check"] == {"key": f"gemma3_1b_{mode}", "verdict": "unchecked"}


def test_memory_probe_attributes_resident_bytes_to_the_open_phase():
  """256 MiB touched inside a phase show in that phase's maximum, not outside's (freed
  before the report), and its maximum less the VmRSS it was entered at is at least that
  (`entered_at`); the arrays alive at the phase's end are counted.

  Mutation caught: samples attributed to the outermost phase (`self._stack[0]`); the
  entry VmRSS of the outermost phase recorded (`probe_entered_outermost`)."""
  import time  # pylint: disable=g-import-not-at-top

  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from experiments.benchmarks import memory_probe  # pylint: disable=g-import-not-at-top

  probe = memory_probe.Probe(interval_s=0.002)
  time.sleep(0.05)
  before = memory_probe.status_gib("VmRSS")
  with probe.phase("big"):
    block = np.ones(2**28 // 8)  # 256 MiB, every page written
    kept = jnp.zeros((512, 512))  # 1 MiB, alive when the phase ends
    time.sleep(0.05)
  del block
  time.sleep(0.05)
  report = probe.report()
  phases = report["phases"]
  assert phases["big"]["max_rss_gib"] > phases["outside"]["max_rss_gib"] + 0.2, phases
  assert report["peak"]["phase"] == "big"
  big = phases["big"]
  assert abs(big["split_at_max"]["entered_at"] - before) < 0.05, (before, big)
  assert big["max_rss_gib"] - big["split_at_max"]["entered_at"] > 0.2, big
  assert phases["big"]["live_at_end"]["gib_by_dtype"]["float32"] >= 0.001, phases["big"]
  del kept


def test_memory_probe_splits_the_resident_set_and_records_compiled_programs():
  """A mark's split adds up to VmRSS (anonymous + file-backed + shared pages); a program
  compiled while the probe watches is listed with XLA's temporaries, which exceed the 4 MiB
  its softmax over a [1024, 1024] float32 input must hold.

  Mutation caught: the compile wrapper recording nothing (`self._programs.append` dropped)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from experiments.benchmarks import memory_probe  # pylint: disable=g-import-not-at-top

  probe = memory_probe.Probe(interval_s=0.01, programs=True)
  probe.mark("start", trim=True)
  with probe.phase("compute"):
    jax.jit(lambda x: jax.nn.softmax(x * 3.0 + 1.0, axis=0) @ x)(jnp.ones((1024, 1024)))
  report = probe.report()
  mark = report["marks"]["start"]
  parts = mark["RssAnon"] + mark["RssFile"] + mark.get("RssShmem", 0.0)
  assert abs(mark["VmRSS"] - parts) < 0.01, mark
  assert "after_malloc_trim" in mark
  ours = [p for p in report["programs"]["largest_temp"] if p["phase"] == "compute"]
  assert ours and ours[0]["temp"] >= 0.0039, report["programs"]  # 4 MiB in GiB, 4 decimals


def test_the_multiturn_benchmark_env_gives_fixed_turns_and_observation_lengths():
  """The workload the multiturn report's token counts below assume: exactly `turns` turns,
  a prompt of `prompt_len - 1` bytes (plus BOS) and `observed - 1` bytes after each turn
  but the last (plus the scaffold's newline)."""
  multiturn_rollout = import_main("experiments.benchmarks.multiturn_rollout")

  env = multiturn_rollout._fixed_env(turns=3, prompt_len=8, observed=5)
  state, prompt = env.reset(None, 0)
  assert prompt == "p" * 7 and env.max_turns == 3
  observations, done = [], False
  while not done:
    step = env.step(state, "answer")
    state, done = step.state, step.done
    observations.append(step.observation)
  assert observations == ["oooo", "oooo", ""]


@pytest.mark.slow
def test_multiturn_rollout_benchmark_runs_and_reports():
  """Over 20 s: a subprocess compiles the tiny sampler for each turn's prompt length, the
  single-turn sampler and a GRPO step for each batch shape."""
  report = _report(
    "multiturn_rollout",
    "--preset=tiny",
    "--repeats=1",
    "--rows=2",
    "--turns=3",
    "--train_repeats=1",
  )
  assert report["multiturn"]["sampler_calls"] == 3
  assert report["multiturn"]["seconds_median"] > 0 and report["single_turn"]["seconds_median"] > 0
  assert report["cost_ratio"] == (
    report["multiturn"]["seconds_median"] / report["single_turn"]["seconds_median"]
  )
  train = report["train_step"]
  rows, turns, sampled, observed = 2, 3, 16, 16  # the flags above and the defaults
  assert train["multiturn"]["sampled_tokens"] == train["single_turn"]["sampled_tokens"]
  assert train["single_turn"]["sampled_tokens"] == rows * turns * sampled
  assert train["multiturn"]["trajectory_tokens"] == rows * (
    turns * sampled + (turns - 1) * observed
  )
  assert train["ratio_per_sampled_token"] > 0


@pytest.mark.slow
def test_async_overlap_benchmark_runs_and_reports():
  """The off-policy benchmark's JSON: 5 rewards per mode, staleness 1 when pipelined.
  Over 20 s: a subprocess (start-up, compilation) running both modes."""
  report = _report(
    "async_overlap", "--steps=5", "--warmup=2", "--seeds=0", "--trainer=2", "--rollout=2"
  )
  sync, pipelined = (report["modes"][m] for m in ("sync", "async"))
  assert [len(r["rewards"]) for r in sync["runs"] + pipelined["runs"]] == [5, 5]
  assert pipelined["runs"][0]["staleness"] == [1.0] and sync["runs"][0]["staleness"] == []
  mean = pipelined["mean"]
  assert mean["t_step_s"] > 0 and mean["steps_per_s"] == 1 / mean["t_step_s"]
  assert report["async_over_sync_steps_per_s"] == mean["steps_per_s"] / sync["mean"]["steps_per_s"]


@pytest.mark.slow
def test_decode_benchmark_reads_the_int8_copy_with_the_dots_it_was_given():
  report = _report("decode", "--preset=tiny", "--weights=int8", "--int8_paths=oik:0", "--repeats=1")
  assert report["sampler_weights"] == "int8"
  assert report["int8_paths"] == {"layer_layout": "oik", "activations_left_max_rows": 0}
  assert report["batched"]["tokens_per_s"] > 0 and report["single_stream"]["tokens_per_s"] > 0


def test_preference_benchmark_trains_without_its_held_out_pairs_and_gives_kto_both_answers(
  tmp_path,
):
  """preference_losses --data: the training file holds every pair but the last `held_out`
  (those are the held-out accuracy's pairs), and KTO's holds each training pair's chosen
  answer as desirable and its rejected one as undesirable (a pairs file used to fail KTO
  for want of a 'completion' field). Mutations: the held-out pairs trained on; a label
  flipped."""
  preference_losses = import_main("experiments.benchmarks.preference_losses")
  from rlpost.data import chat

  pairs = [
    {"prompt": f"q{i}", "chosen": f"good{i}", "rejected": f"bad{i}", "system": "s"}
    for i in range(5)
  ]
  data = tmp_path / "pairs.jsonl"
  data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
  (tmp_path / "dpo").mkdir()
  (tmp_path / "kto").mkdir()
  dpo_file = preference_losses.train_file(str(data), 2, False, str(tmp_path / "dpo"))
  assert chat.load_dpo_jsonl(dpo_file) == pairs[:3]
  kto_file = preference_losses.train_file(str(data), 2, True, str(tmp_path / "kto"))
  assert chat.load_kto_jsonl(kto_file) == [
    {"prompt": f"q{i}", "system": "s", "completion": f"{answer}{i}", "label": answer == "good"}
    for i in range(3)
    for answer in ("good", "bad")
  ]
  with pytest.raises(ValueError, match="--eval_pairs=5"):
    preference_losses.train_file(str(data), 5, False, str(tmp_path))
