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
plain strings; a phase entered several times keeps its maximum.
"""

import collections
import contextlib
import threading
import time

import jax

_GIB = 2**30


def status_gib(field: str) -> float:
  """A `/proc/self/status` size field (VmRSS: resident now, VmHWM: its peak), in GiB."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024 / _GIB
  raise KeyError(f"{field} is not in /proc/self/status (Linux only)")


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


class Probe:
  """Samples VmRSS every `interval_s` on a daemon thread from creation until `stop`."""

  def __init__(self, interval_s: float = 0.005):
    self._stack = ["outside"]
    self._max = collections.defaultdict(float)  # phase -> max VmRSS (GiB)
    self._live = {}  # phase -> live arrays at its last exit
    self._peak = (0.0, "outside")
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, args=(interval_s,), daemon=True)
    self._thread.start()

  def _sample(self, interval_s: float):
    while not self._stop.is_set():
      rss, where = status_gib("VmRSS"), self._stack[-1]
      self._max[where] = max(self._max[where], rss)
      if rss > self._peak[0]:
        self._peak = (rss, where)
      time.sleep(interval_s)

  @contextlib.contextmanager
  def phase(self, name: str):
    """Samples taken inside are `name`'s; its live arrays are recorded when it ends."""
    self._stack.append(name)
    try:
      yield
    finally:
      self._stack.pop()
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
      name: {"max_rss_gib": round(self._max[name], 3), "live_at_end": self._live.get(name)}
      for name in self._max
    }
    rss, where = self._peak
    return {
      "phases": phases,
      "peak": {
        "rss_gib": round(rss, 3),
        "phase": where,
        "vm_hwm_gib": round(status_gib("VmHWM"), 3),
      },
    }
