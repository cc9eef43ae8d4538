"""What a benchmark's JSON says about the machine it ran on."""

import platform


def cpu_model() -> str:
  """The CPU model name (what `lscpu` prints), or the platform's machine type."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.machine()
