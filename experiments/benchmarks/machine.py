"""What a benchmark's JSON says about the machine it ran on."""

import platform

from rlpost.train import provenance


def cpu_model() -> str:
  """The CPU model name with its family and model numbers (what `lscpu` prints, e.g.
  "AMD EPYC (family 25, model 1)"), or the platform's machine type."""
  fields = provenance.cpu_fields()
  return provenance.cpu_name(fields) if fields["cpu"] else platform.machine()
