"""Peak accelerator memory of this process, for benchmarks that run on a GPU or TPU."""

import jax


def peak_device_gib() -> float | None:
  """Peak bytes the first device's allocator has held (GiB), or None where the backend
  does not report it (XLA:CPU, whose memory is the process's RSS)."""
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else round(peak / 2**30, 2)
