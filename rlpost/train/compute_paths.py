"""`train.compute_dtype = "auto"`: the trainer's matmul input dtype, chosen per machine.

Which is faster depends on the machine, not just the backend: on an AMD EPYC (Zen 4)
bfloat16 matmuls with float32 accumulation beat float32 in the train step, while on an
Intel Xeon with AVX512-BF16 but no AMX XLA:CPU ran them ~5x slower than float32 at
decode sizes (issue 18's probe). So:
- accelerators use a table (`ACCELERATOR_CHOICE`: bfloat16 on GPU and TPU);
- on CPU a short calibration times one forward + backward of the trainer's mixed-
  precision matmul (`gemma3._dense`) at train-step shapes in each dtype, and picks
  bfloat16 only when it is clearly faster (`BFLOAT16_MARGIN`: float32 is the exact
  one). The result is cached per machine (the compilation cache's key: JAX version,
  backend, CPU model and flags), so a machine calibrates once.
The recipes log the choice and write it into the run's config.json; a resumed run
reads it back from there instead of choosing again (`resolve_for_run`).
"""

import json
import os
import time
from typing import Callable

import jax

from rlpost.train import runtime

CHOICES = ("float32", "bfloat16")
ACCELERATOR_CHOICE = {"gpu": "bfloat16", "tpu": "bfloat16"}
BFLOAT16_MARGIN = 0.85  # bfloat16 is chosen when it takes < 0.85x float32's time
DEFAULT_CACHE = "~/.cache/rlpost/compute_paths"
# (rows, inputs, outputs) of the timed matmuls: a layer projection of a 4 x 128-token
# micro-batch, and one chunk of the output projection.
PROBE_SHAPES = ((512, 640, 2048), (256, 640, 16384))


def probe_seconds(dtype: str, repeats: int = 5) -> float:
  """Best-of-`repeats` seconds of forward + backward of the probe matmuls in `dtype`."""
  from rlpost.models import gemma3  # pylint: disable=g-import-not-at-top

  keys = jax.random.split(jax.random.key(0), 2 * len(PROBE_SHAPES))
  args = [
    (jax.random.normal(kx, (n, i)), jax.random.normal(kw, (i, o)) * 0.02)
    for (n, i, o), kx, kw in zip(PROBE_SHAPES, keys[::2], keys[1::2])
  ]
  loss = lambda xws: sum(gemma3._dense(x, w, dtype).sum() for x, w in xws)  # pylint: disable=protected-access
  step = jax.jit(jax.grad(loss))
  jax.block_until_ready(step(args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(step(args))
    best = min(best, time.perf_counter() - start)
  return best


def choose(seconds: dict[str, float]) -> str:
  """bfloat16 when its probe time is < BFLOAT16_MARGIN x float32's, else float32."""
  return "bfloat16" if seconds["bfloat16"] < BFLOAT16_MARGIN * seconds["float32"] else "float32"


def resolve(
  backend: str | None = None,
  cache_dir: str = DEFAULT_CACHE,
  timer: Callable[[str], float] = probe_seconds,
) -> tuple[str, str]:
  """The compute dtype for this machine and how it was found: (dtype, reason).

  backend: None for JAX's default backend. cache_dir: where CPU calibrations are kept
  ("" = calibrate every time). timer: seconds of the probe in a dtype (tests mock it).
  """
  backend = backend or jax.default_backend()
  if backend in ACCELERATOR_CHOICE:
    return ACCELERATOR_CHOICE[backend], f"table: {backend}"
  path = os.path.join(os.path.expanduser(cache_dir), runtime.machine_key() + ".json")
  if cache_dir and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      cached = json.load(f)
    return cached[
      "compute_dtype"
    ], f"calibrated earlier on this machine ({path}): {cached['seconds']}"
  seconds = {dtype: timer(dtype) for dtype in CHOICES}
  dtype = choose(seconds)
  if cache_dir:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      json.dump({"compute_dtype": dtype, "seconds": seconds}, f)
  rounded = {k: round(v, 5) for k, v in seconds.items()}
  return dtype, f"calibrated: probe seconds {rounded}"


def resolve_for_run(
  setting: str, workdir: str, resolver: Callable[[], tuple[str, str]] = resolve
) -> tuple[str, str]:
  """`train.compute_dtype` of a run: an explicit setting as given; "auto" as recorded in
  the run's config.json when it is being resumed, else `resolver()`."""
  if setting != "auto":
    return setting, "set in the config"
  recorded = _recorded(workdir)
  if recorded in CHOICES:
    return recorded, f"recorded in {os.path.join(workdir, 'config.json')} (resumed run)"
  return resolver()


def _recorded(workdir: str):
  path = os.path.join(workdir, "config.json") if workdir else ""
  if not path or not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f).get("train", {}).get("compute_dtype")
