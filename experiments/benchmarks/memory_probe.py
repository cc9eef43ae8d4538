"""Where a benchmark's peak RSS is reached: the process's resident set sampled every few
milliseconds on a thread, attributed to the phase the main thread is in, with the JAX
arrays alive at each phase's end (XLA:CPU keeps every buffer in the process's memory, so
what is not a live array at a peak is a program's temporaries or freed heap not yet
returned to the system).

  probe = Probe()
  with probe.phase("rollout"):
    ...
  probe.report()   # {"phases": {name: {...}}, "peak": {...}}

Phases nest: the innermost one open when a sample is taken gets it. Phase names are
plain strings; a phase entered several times keeps its maximum, with the resident set
split as at that maximum (RssAnon: heap and XLA buffers; RssFile: mapped files' pages,
e.g. a GGUF read through mmap). `mark(name)` records the split and the live arrays at
one moment; `Probe(programs=True)` also records each program compiled from then on and
its `memory_analysis()` (XLA's temporaries, arguments, outputs, generated code).
"""

import collections
import contextlib
import gc
import threading
import time

import jax

from rlpost.train import host_memory

_GIB = 2**30


_SPLIT = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def _status() -> dict:
  """`/proc/self/status`'s size fields (kB) in GiB."""
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      name, _, rest = line.partition(":")
      if rest.strip().endswith("kB"):
        out[name] = int(rest.split()[0]) * 1024 / _GIB
  return out


def status_gib(field: str) -> float:
  """A `/proc/self/status` size field (VmRSS: resident now, VmHWM: its peak), in GiB."""
  value = _status().get(field)
  if value is None:
    raise KeyError(f"{field} is not in /proc/self/status (Linux only)")
  return value


def rss_split() -> dict:
  """The resident set now, GiB: VmRSS = RssAnon + RssFile + RssShmem."""
  status = _status()
  return {k: round(status[k], 3) for k in _SPLIT if k in status}


def live_arrays(top: int = 4) -> dict:
  """Total bytes of the JAX arrays alive now and the `top` largest (shape, dtype, GiB)."""
  arrays = jax.live_arrays()
  total = sum(a.nbytes for a in arrays)
  largest = sorted(arrays, key=lambda a: a.nbytes, reverse=True)[:top]
  by_kind = collections.Counter()
  for a in arrays:
    by_kind[f"{a.dtype}"] += a.nbytes
  return {
    "count": len(arrays),
    "gib": round(total / _GIB, 3),
    "gib_by_dtype": {k: round(v / _GIB, 3) for k, v in by_kind.most_common()},
    "largest": [f"{a.dtype}{list(a.shape)} {a.nbytes / _GIB:.3f}" for a in largest],
  }


def program_stats(executable) -> dict | None:
  """A compiled program's `memory_analysis()` sizes, GiB (None where the backend has none)."""
  try:
    stats = executable.get_compiled_memory_stats()
  except Exception:  # pylint: disable=broad-except  # unsupported backends raise their own
    return None
  fields = ("temp", "argument", "output", "alias", "generated_code")
  return {f: round(getattr(stats, f"{f}_size_in_bytes") / _GIB, 4) for f in fields}


class Probe:
  """Samples VmRSS every `interval_s` on a daemon thread from creation until `stop`;
  `programs`: records every program compiled (or read from the compilation cache) from
  then on with its memory sizes (`program_stats`), by wrapping JAX's compile entry."""

  def __init__(self, interval_s: float = 0.005, programs: bool = False):
    self._stack = ["outside"]
    self._entered = [0.0]  # VmRSS when each open phase was entered
    self._max = collections.defaultdict(lambda: {"VmRSS": 0.0})  # phase -> split at max
    self._live = {}  # phase -> live arrays at its last exit
    self._marks = {}  # name -> split and live arrays
    self._programs = []
    self._peak = (0.0, "outside")
    if programs:
      self._watch_compiles()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, args=(interval_s,), daemon=True)
    self._thread.start()

  def _watch_compiles(self):
    from jax._src import compiler  # pylint: disable=g-import-not-at-top  # no public hook

    compile_fn = compiler.compile_or_get_cached

    def recorded(backend, computation, *args, **kwargs):
      executable = compile_fn(backend, computation, *args, **kwargs)
      name = str(computation.operation.attributes["sym_name"]).strip('"')
      self._programs.append(
        {"name": name, "phase": self._stack[-1], **(program_stats(executable) or {})}
      )
      return executable

    compiler.compile_or_get_cached = recorded

  def _sample(self, interval_s: float):
    while not self._stop.is_set():
      split, where, entered = rss_split(), self._stack[-1], self._entered[-1]
      rss = split["VmRSS"]
      if rss > self._max[where]["VmRSS"]:
        self._max[where] = {**split, "entered_at": round(entered, 3)}
      if rss > self._peak[0]:
        self._peak = (rss, where)
      time.sleep(interval_s)

  def mark(self, name: str, trim: bool = False, clear: bool = False):
    """Records the resident set's split and the live arrays now under `name`; `trim`:
    then asks glibc to return freed heap (`malloc_trim`) and records the split again, so
    the difference is what the allocator held freed; `clear` (last, it costs recompiling):
    then drops JAX's compiled programs (`jax.clear_caches`, gc, trim) and records it again,
    so that difference is what the compiled programs held."""
    self._marks[name] = {**rss_split(), "live": live_arrays()}
    if trim:
      host_memory.release_freed_memory()
      self._marks[name]["after_malloc_trim"] = rss_split()
    if clear:
      jax.clear_caches()
      gc.collect()
      host_memory.release_freed_memory()
      self._marks[name]["after_clear_caches"] = rss_split()

  @contextlib.contextmanager
  def phase(self, name: str):
    """Samples taken inside are `name`'s; its live arrays are recorded when it ends, and
    with its maximum the VmRSS it was entered at (`entered_at`: the maximum less it is
    what the phase itself added)."""
    self._entered.append(status_gib("VmRSS"))
    self._stack.append(name)
    try:
      yield
    finally:
      self._stack.pop()
      self._entered.pop()
      self._live[name] = live_arrays()

  def wrap(self, name: str, fn):
    """`fn` with each call inside `phase(name)`, its outputs waited for there (a jitted
    call returns before its program has run)."""

    def wrapped(*args, **kwargs):
      with self.phase(name):
        return jax.block_until_ready(fn(*args, **kwargs))

    return wrapped

  def report(self) -> dict:
    """Per phase: max VmRSS and the live arrays at its end; the overall sampled peak, its
    phase and the process's VmHWM (the kernel's peak, which samples can miss)."""
    self._stop.set()
    self._thread.join()
    phases = {
      name: {
        "max_rss_gib": round(self._max[name]["VmRSS"], 3),
        "split_at_max": self._max[name],
        "live_at_end": self._live.get(name),
      }
      for name in self._max
    }
    rss, where = self._peak
    largest = sorted(self._programs, key=lambda p: p.get("temp", 0), reverse=True)
    return {
      "phases": phases,
      "marks": self._marks,
      "programs": {
        "count": len(self._programs),
        "generated_code_gib": round(sum(p.get("generated_code", 0) for p in self._programs), 3),
        "largest_temp": largest[:8],
      },
      "peak": {
        "rss_gib": round(rss, 3),
        "phase": where,
        "vm_hwm_gib": round(status_gib("VmHWM"), 3),
      },
    }
