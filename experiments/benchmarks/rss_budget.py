"""The peak RSS each `grpo_step` mode is expected to reach, and the check that it has not
grown unnoticed (issue 65 part 7: 0.9 GiB crept in over 300 commits before anyone looked).

The figures are XLA:CPU's, for the benchmark's default workload (float32 params, the
config's compute dtype, remat and logprob chunk, no reward model); other settings have
no expected figure and are not checked. Peak RSS barely depends on the x86 CPU model,
unlike times: the LoRA mode's figures on an AMD EPYC Zen 4 and an Intel Xeon (model 167)
agreed within 0.06 GiB at two commits (d967a69: 3.53-3.57 and 3.48-3.54; 75c36e3: 4.45
and 4.46). When a change grows a figure on purpose, measure it (`python -m
experiments.benchmarks.grpo_step --modes=MODE`, twice) and update `EXPECTED` in the same
commit, saying why; BUILD.md's "How to benchmark" quotes this table.
"""

# mode key (`key`) -> the iterations' peak RSS in GiB (`iteration_peak_rss_gib`: the
# first and the steady iterations; the random initialisation before them, ~3.3 GiB in
# every mode, is not checked), the largest of 2-3 runs on the Intel Xeon model 167.
# issue 65 part 7: LoRA 3.35 / 3.40 / 3.37, int8 rollouts 3.46 / 3.50, full 7.44 / 7.37
# (process peaks, reached in the iterations). issue 70 (qloramem, after the decode loop's
# float32 copy of the embedding went): qlora 2.61 / 2.64 beside LoRA's 3.40 / 3.35 in the
# same runs (0.77-0.79x; load 6-8); where the rest is: BUILD.md "How to benchmark".
# qloramem2 (the sync's int8 rows without a float32 copy of the embedding): qlora 2.70 /
# 2.61 beside LoRA's 3.40 / 3.34 (first iterations; steady 2.40 / 2.33 against 3.12 /
# 3.10; load 3-5). The commit before, in the same session: qlora 2.67 / 2.63 (steady
# 2.54 / 2.49), LoRA 3.37 / 3.37: the first iteration's spread, not growth.
# qlora1b (the sync's LoRA product and the sampler's prefill one layer at a time; figures
# unchanged): on an AMD EPYC Zen 3 qlora 2.95 both at dbac311 and after, LoRA 3.08: that
# CPU's `train.compute_dtype=auto` is float32, so QLoRA's frozen embedding is float32
# there and it reads "grown" against these Xeon (bfloat16) figures. Gemma 3 1B
# (`--preset=gemma3_1b`, keys "gemma3_1b_MODE", unchecked): BUILD.md "How to benchmark".
EXPECTED = {
  "full": 7.44,
  "lora": 3.40,
  "lora_int8": 3.50,
  "qlora": 2.70,
}
TOLERANCE_GIB = 0.15  # run-to-run spread seen: 0.04-0.06 GiB
# `train.compute_dtype` as "auto" resolved where the figures were measured (the Xeon 167);
# a CPU whose "auto" is float32 (AMD Zen 3: no AVX-512 BF16) keeps QLoRA's frozen
# embedding in float32, another workload: its runs are not compared with these figures.
RECORDED_COMPUTE_DTYPE = "bfloat16"


def key(
  mode: str,
  sampler_weights: str,
  defaults: bool,
  preset: str = "gemma3_270m",
  compute_dtype: str = RECORDED_COMPUTE_DTYPE,
) -> str | None:
  """The `EXPECTED` key of a run: `mode`, plus "_int8" when the sampler reads int8
  weights, after "PRESET_" when the architecture is not Gemma 3 270M's (the figures'
  one: such keys have no figure and are reported "unchecked"); None when the workload is
  not the default one (`defaults` False) or the trainer's resolved `compute_dtype` is not
  the figures' (`RECORDED_COMPUTE_DTYPE`)."""
  if not defaults or compute_dtype != RECORDED_COMPUTE_DTYPE:
    return None
  name = mode if sampler_weights == "model" else f"{mode}_{sampler_weights}"
  return name if preset == "gemma3_270m" else f"{preset}_{name}"


def check(name: str | None, peak_rss_gib: float) -> dict:
  """The record of one mode's check of its iterations' peak RSS (`peak_rss_gib`):
  expected figure, tolerance and verdict ("ok", "grown", "unchecked" when there is no
  expected figure for `name`)."""
  if name is None or name not in EXPECTED:
    return {"key": name, "verdict": "unchecked"}
  expected = EXPECTED[name]
  grown = peak_rss_gib > expected + TOLERANCE_GIB
  return {
    "key": name,
    "iteration_peak_rss_gib": peak_rss_gib,
    "expected_gib": expected,
    "tolerance_gib": TOLERANCE_GIB,
    "verdict": "grown" if grown else "ok",
  }


def failures(records: dict) -> list[str]:
  """One line per mode whose iterations' peak RSS grew past its expected figure plus the
  tolerance.

  records: mode -> the mode's JSON (its `rss_check`, from `check`)."""
  lines = []
  for mode, r in records.items():
    c = r["rss_check"]
    if c["verdict"] == "grown":
      lines.append(
        f"grpo_step {c['key']}: iteration_peak_rss_gib={c['iteration_peak_rss_gib']} is above the expected "
        f"{c['expected_gib']} + {c['tolerance_gib']} GiB (experiments/benchmarks/rss_budget.py): "
        "find the new bytes with --memory_report, or, if the growth is intended, update "
        "EXPECTED there and in BUILD.md with the reason"
      )
  return lines
