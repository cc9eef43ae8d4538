"""`train.compute_dtype = "auto"`: the trainer's matmul input dtype, chosen per machine.

Which is faster depends on the machine, not just the backend: on an AMD EPYC (Zen 4)
bfloat16 matmuls with float32 accumulation beat float32 in the train step, while on an
Intel Xeon with AVX512-BF16 but no AMX XLA:CPU ran them ~5x slower than float32 at
decode sizes (issue 18's probe). So:
- accelerators use a table (`ACCELERATOR_CHOICE`: bfloat16 on GPU and TPU);
- on CPU a short calibration times one forward + backward of the trainer's mixed-
  precision matmul (`decoder._dense`) at train-step shapes in each dtype, and picks
  bfloat16 only when it is clearly faster (`BFLOAT16_MARGIN`: float32 is the exact
  one). The result is cached per machine (the compilation cache's key: JAX version,
  backend, CPU model and flags), so a machine calibrates once.
The recipes log the choice and write it into the run's config.json; a resumed run
reads it back from there instead of choosing again (`resolve_for_run`).

`resolve_int8` chooses the same way how the sampler's int8 dots are formed
(`quant.Int8Paths`: operand order and layout), which the two CPU families also disagree
on. That choice changes no number, only speed, so it is logged but not recorded.
"""

import dataclasses
import json
import os
import time
from typing import Callable

from absl import logging
import jax
import jax.numpy as jnp

from rlpost.models import quant
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
  from rlpost.models import decoder  # pylint: disable=g-import-not-at-top

  keys = jax.random.split(jax.random.key(0), 2 * len(PROBE_SHAPES))
  args = [
    (jax.random.normal(kx, (n, i)), jax.random.normal(kw, (i, o)) * 0.02)
    for (n, i, o), kx, kw in zip(PROBE_SHAPES, keys[::2], keys[1::2])
  ]
  loss = lambda xws: sum(decoder._dense(x, w, dtype).sum() for x, w in xws)  # pylint: disable=protected-access
  return _best_seconds(jax.jit(jax.grad(loss)), (args,), repeats)


def _best_seconds(fn, args, repeats: int, warm: bool = True) -> float:
  """Best-of-`repeats` seconds of `fn(*args)` (after one compiling call unless `warm`)."""
  if warm:
    jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best


def choose(seconds: dict[str, float]) -> str:
  """bfloat16 when its probe time is < BFLOAT16_MARGIN x float32's, else float32."""
  return "bfloat16" if seconds["bfloat16"] < BFLOAT16_MARGIN * seconds["float32"] else "float32"


def _calibrated(
  name: str, label: str, cache_dir: str, calibrate: Callable[[], dict], parse: Callable
):
  """(parse(found), how) for `found = calibrate()` (a JSON-able dict), run once per
  machine: read back from `cache_dir/<machine key><name>.json` when there ("" = calibrate
  every time). A cache file that cannot be read or parsed is calibrated again, and one
  that cannot be written is only warned about: the run goes on either way."""
  path = os.path.join(os.path.expanduser(cache_dir), runtime.machine_key() + name + ".json")
  if cache_dir and os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        return parse(json.load(f)), f"calibrated earlier on this machine ({path})"
    except (OSError, ValueError, KeyError, TypeError) as e:
      logging.warning("calibrating again: cannot use %s (%r)", path, e)
  logging.info("calibrating %s for this machine (seconds, once: cached in %s)", label, path)
  found = calibrate()
  if cache_dir:
    partial = f"{path}.{os.getpid()}.tmp"  # written whole, then renamed: readers never
    try:  # see half a file
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(partial, "w", encoding="utf-8") as f:
        json.dump(found, f)
      os.replace(partial, path)
    except OSError as e:
      logging.warning("not cached (the next run calibrates again): %s (%r)", path, e)
  return parse(found), "calibrated"


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

  def calibrate():
    seconds = {dtype: timer(dtype) for dtype in CHOICES}
    return {"compute_dtype": choose(seconds), "seconds": seconds}

  def parse(found):
    if found["compute_dtype"] not in CHOICES:
      raise ValueError(f"compute_dtype {found['compute_dtype']!r}")
    rounded = {k: round(v, 5) for k, v in found["seconds"].items()}
    return found["compute_dtype"], rounded

  (dtype, rounded), how = _calibrated("", "train.compute_dtype", cache_dir, calibrate, parse)
  return dtype, f"{how}: probe seconds {rounded}"


# The sampler's int8 dots (`quant.Int8Paths`), timed at Gemma 3 270M's decode shapes:
# the output projection [V, D] in both operand orders at a few padded row counts, and the
# decode step's layer matrices [I, O] (q+k+v, o, gate+up, down) in both layouts, one
# distinct copy per layer: like the decode step's, the probe's layer weights (100 MB)
# stream from memory instead of sitting in the last-level cache, where the single 2.6 and
# 1.3 MB gate+up and down matrices an earlier probe timed did.
INT8_UNEMBED = (262144, 640)
INT8_LAYERS = ((640, 1536), (1024, 640), (640, 4096), (2048, 640))
INT8_LAYER_COPIES = 18  # Gemma 3 270M's layer count
INT8_ROWS = (2, 8, 32)
INT8_LAYER_ROWS = (2, 8)
# "oik" is chosen when it takes < 0.95x the time of "io": the established layout keeps
# near-ties. (Between calibrations on one machine the summed probe times move by ~5%.)
INT8_LAYOUT_MARGIN = 0.95
# Each formulation is timed INT8_ROUNDS times, the rounds interleaved, and keeps its best:
# a burst of other work on the machine then slows one round of every candidate, not all
# the timings of one of them (one calibration run beside other work had timed the output
# projection at 52 instead of 30 ms).
INT8_ROUNDS = 3


class Int8Probes:
  """`timer(part, rows)` for `resolve_int8`: best-of-`repeats` seconds of one int8 dot
  formulation at `rows` padded rows, its inputs and compilation kept for later rounds.

  part: "io" or "oik" (the `INT8_LAYERS` matmuls in that layout, each over
  `INT8_LAYER_COPIES` distinct copies, summed), or "activations_left" / "weights_left"
  (the output projection in that operand order).
  """

  def __init__(self, repeats: int = 3):
    self.repeats, self._prepared = repeats, {}

  def __call__(self, part: str, rows: int) -> float:
    if (part, rows) not in self._prepared:
      self._prepared[part, rows] = self._prepare(part, rows)
      jax.block_until_ready(self._prepared[part, rows][0](*self._prepared[part, rows][1]))
    fn, args = self._prepared[part, rows]
    return _best_seconds(fn, args, self.repeats, warm=False)

  def _prepare(self, part: str, rows: int):
    if part in quant.LAYER_LAYOUTS:
      if ("weights", part) not in self._prepared:
        self._prepared["weights", part] = self._layer_weights(part)
      weights = self._prepared["weights", part]
      xs = [_pattern((rows, shape[0]), jnp.float32) for shape in INT8_LAYERS]
      dots = lambda ws, xs: [quant.dense(x, w) for x, w in zip(xs * INT8_LAYER_COPIES, ws)]
      return jax.jit(dots), (weights, xs)
    left_max = rows if part == "activations_left" else 0
    if "unembed" not in self._prepared:
      self._prepared["unembed"] = _pattern(INT8_UNEMBED, jnp.int8)  # values don't change time
    w = quant.Int8Weight(self._prepared["unembed"], jnp.ones(INT8_UNEMBED[0]), "rows", left_max)
    return jax.jit(quant.vocab_major), (w, _pattern((rows, INT8_UNEMBED[1]), jnp.float32))

  @staticmethod
  def _layer_weights(layout: str):
    quantize = jax.jit(quant.quantize_blocks, static_argnames=("layout",))
    return [
      quantize(_pattern(shape, jnp.float32) + copy, layout=layout)
      for copy in range(INT8_LAYER_COPIES)
      for shape in INT8_LAYERS
    ]


def _pattern(shape, dtype) -> jax.Array:
  """A cheap deterministic array of small integers in [-125, 125] (no random draws: the
  probe's [262144, 640] would take seconds to sample)."""
  size = 1
  for n in shape:
    size *= n
  return (jnp.arange(size, dtype=jnp.int32) % 251 - 125).astype(dtype).reshape(shape)


def choose_int8(seconds: dict[str, float]):
  """`quant.Int8Paths` from probe seconds keyed "<part>@<rows>": the "oik" layout when
  its summed time is < INT8_LAYOUT_MARGIN x "io"'s; activations on the left of the output
  projection up to the largest probed row count below which they win at every count."""
  total = {p: sum(seconds[f"{p}@{r}"] for r in INT8_LAYER_ROWS) for p in quant.LAYER_LAYOUTS}
  layout = "oik" if total["oik"] < INT8_LAYOUT_MARGIN * total["io"] else "io"
  left_max = 0
  for rows in INT8_ROWS:
    if seconds[f"activations_left@{rows}"] > seconds[f"weights_left@{rows}"]:
      break
    left_max = rows
  return quant.Int8Paths(layout, left_max)


def resolve_int8(
  backend: str | None = None,
  cache_dir: str = DEFAULT_CACHE,
  timer: Callable[[str, int], float] | None = None,
):
  """The sampler's int8 dot formulation on this machine and how it was found:
  (`quant.Int8Paths`, reason). Accelerators: the defaults. Arguments as in `resolve`
  (timer: seconds of a formulation, default `Int8Probes()`; called INT8_ROUNDS times per
  formulation, the rounds interleaved, and the best kept)."""
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return quant.Int8Paths(), f"default on {backend}"

  def calibrate():
    time_one = timer or Int8Probes()
    parts = [(p, r) for p in quant.LAYER_LAYOUTS for r in INT8_LAYER_ROWS]
    parts += [(p, r) for p in ("activations_left", "weights_left") for r in INT8_ROWS]
    seconds = {}
    for _ in range(INT8_ROUNDS):
      for p, r in parts:
        key = f"{p}@{r}"
        seconds[key] = min(seconds.get(key, float("inf")), time_one(p, r))
    return {"paths": dataclasses.asdict(choose_int8(seconds)), "seconds": seconds}

  def parse(found):
    rounded = {k: round(v * 1e3, 2) for k, v in found["seconds"].items()}
    return quant.Int8Paths(**found["paths"]), rounded

  (paths, rounded), how = _calibrated("-int8", "sampling.int8_paths", cache_dir, calibrate, parse)
  return paths, f"{how}: probe ms {rounded}"


def int8_paths(setting: str, resolver=resolve_int8):
  """`sampling.int8_paths`: "auto" -> `resolver()`, else "LAYOUT:ROWS" parsed;
  (`quant.Int8Paths`, reason)."""
  if setting == "auto":
    return resolver()
  return quant.parse_paths(setting), "set in the config"


def resolve_for_run(
  setting: str, workdir: str, resolver: Callable[[], tuple[str, str]] = resolve
) -> tuple[str, str]:
  """`train.compute_dtype` of a run: an explicit setting as given; "auto" as recorded in
  the run's config.json when it is being resumed, else `resolver()`."""
  if setting != "auto":
    return setting, "set in the config"
  recorded = recorded_setting(workdir, "train", "compute_dtype")
  if recorded in CHOICES:
    return recorded, f"recorded in {os.path.join(workdir, 'config.json')} (resumed run)"
  return resolver()


def int8_paths_for_run(setting: str, workdir: str, resolver=None):
  """`sampling.int8_paths` of a run as (`quant.Int8Paths`, reason): an explicit setting
  as given; "auto" as recorded in the run's config.json when it is being resumed, else
  `resolver()` (default `resolve_int8`, this machine's calibration)."""
  if setting == "auto":
    recorded = recorded_setting(workdir, "sampling", "int8_paths")
    if isinstance(recorded, str) and recorded != "auto":
      where = os.path.join(workdir, "config.json")
      return quant.parse_paths(recorded), f"recorded in {where} (resumed run)"
  return int8_paths(setting, resolver or resolve_int8)


def recorded_setting(workdir: str, block: str, field: str):
  """`block.field` in the run's config.json (None when there is none)."""
  path = os.path.join(workdir, "config.json") if workdir else ""
  if not path or not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f).get(block, {}).get(field)
