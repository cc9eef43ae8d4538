"""Warnings for the quiet failures of an RL run, read from each iteration's metrics (a
helper module of the RL recipe, `rlpost.recipes.rl`; the `alarms` block).

- **Logprob gap.** `sampler_logp_gap_mean/first_pass` (the mean |trainer - sampler|
  logprob of the sampled tokens at the iteration's first optimizer step, before the
  trainer moves; not checked on a batch sampled by an older policy, `staleness` > 0)
  above `alarms.logp_gap` warns: the sampler is not sampling the policy
  the trainer trains (stale weights after a sync: TRL's users saw the gap jump from 0.015
  to 0.20), or a precision far coarser than configured. The default depends on what
  the sampler and the trainer compute with (`default_logp_gap`).
- **A tool never called.** In an agentic run that offers tools, `alarms.idle_tools`
  iterations in a row with no tool call in any episode warn (the model may never have
  learned the call syntax); `tools/idle_iterations` counts them.

A warning goes to the log and to stdout once per iteration it holds; the run goes on.
The weight-sync check, which stops a run, is `rlpost.train.weight_sync`. The counters
restart at 0 when a run resumes.
"""

import dataclasses
import math

from absl import logging

from rlpost.recipes import common

# Warning thresholds on the mean |trainer - sampler| logprob at the first pass, by (trainer
# matmul dtype, sampler weights). Measured on the real Gemma 3 270M (FrozenLake GRPO, 3
# iterations each, AMD EPYC; BUILD.md, "Silent-failure guards"): float32 3.4-3.5e-6,
# bfloat16 trainer 0.0058-0.0065, int8 sampler 0.060-0.068; a sampler one update behind a
# float32 trainer: 0.011-0.016 (PPO's second mini-batch). Each threshold sits well above
# its own noise and, where the noise allows, below one update of staleness. The 4-bit
# (NF4) sampler has no run-measured gap yet: teacher-forced on the Gemma 3 fixtures its
# mean |logprob - float32| is 0.35 against int8's 0.10 (`experiments.benchmarks.quant_gap`,
# issue 70), so its threshold keeps int8's ratio to that gap (2x).
LOGP_GAPS = {
  ("float32", "model"): 1e-3,
  ("bfloat16", "model"): 3e-2,
  ("float32", "int8"): 0.2,
  ("bfloat16", "int8"): 0.2,
  ("float32", "int4"): 0.7,
  ("bfloat16", "int4"): 0.7,
}


@dataclasses.dataclass(frozen=True)
class AlarmConfig:
  """The `alarms` block. logp_gap: warn above this mean |trainer - sampler| logprob
  (None: `default_logp_gap`; 0: off); idle_tools: warn after this many iterations in a
  row without a tool call, in runs that offer tools (0: off)."""

  logp_gap: float | None = None
  idle_tools: int = 5

  def __post_init__(self):
    gap = self.logp_gap
    if gap is not None and not (math.isfinite(gap) and gap >= 0):
      common.field_error(
        AlarmConfig, "logp_gap", gap, "must be a finite number >= 0 (0: off; None: default)"
      )
    if self.idle_tools < 0:
      common.field_error(AlarmConfig, "idle_tools", self.idle_tools, "must be >= 0 (0: off)")


def default_logp_gap(compute_dtype: str | None, sampler_weights: str) -> float:
  """`LOGP_GAPS`'s threshold for the trainer's matmul dtype and the sampler's weights."""
  return LOGP_GAPS[(compute_dtype or "float32", sampler_weights)]


def watch(step_fn, logp_gap: float, idle_tools: int):
  """`step_fn` (the run loop's `step(state, cursor, index) -> (state, cursor, metrics)`)
  with the alarms checked on each iteration's metrics. idle_tools: 0 when the run offers
  no tools."""
  idle = {"iterations": 0}

  def step(state, cursor, index):
    state, cursor, metrics = step_fn(state, cursor, index)
    # the first optimizer step's batch: later mini-batches and epochs are off the
    # sampler's policy by design, and so is a batch sampled by an older policy
    gap = metrics.get("sampler_logp_gap_mean/first_pass")
    if metrics.get("staleness", 0) > 0:
      gap = None
    if logp_gap and gap is not None and gap > logp_gap:
      _warn(
        f"step {index}: the sampler's logprobs of the sampled tokens are {gap:.3g} from the "
        f"trainer's on average, above alarms.logp_gap={logp_gap:.3g}: the sampler may be "
        "sampling from stale or different weights (check the weight sync), or the "
        "trainer / sampler precision differs more than expected"
      )
    if idle_tools and "tool_call_rate" in metrics:
      idle["iterations"] = 0 if metrics["tool_call_rate"] > 0 else idle["iterations"] + 1
      metrics = {**metrics, "tools/idle_iterations": float(idle["iterations"])}
      if idle["iterations"] >= idle_tools:
        _warn(
          f"step {index}: no episode called a tool in the last {idle['iterations']} "
          f"iterations (alarms.idle_tools={idle_tools}), though the run offers them: check "
          "the tool syntax in the prompt, or give the model a few solved tool-call examples"
        )
    return state, cursor, metrics

  return step


def _warn(message: str) -> None:
  logging.warning(message)
  print(f"WARNING {message}", flush=True)
