"""experiments/sample.py: bad settings fail before the model loads, naming the field; the
tiny model samples end to end."""

import json
import os
import subprocess
import sys
import warnings

import pytest

from conftest import REPO_ROOT, import_main, with_overrides
from experiments.configs import sample as sample_configs
from rlpost.text import tokenizer as tokenizer_lib

with warnings.catch_warnings():  # ml_collections loads the --config default with the
  warnings.simplefilter("ignore", DeprecationWarning)  # deprecated load_module()
  sample = import_main("experiments.sample")


def _config(**overrides):
  return with_overrides(sample_configs.get_config("tiny"), overrides)


@pytest.mark.parametrize(
  "overrides,match",
  [
    ({"num_samples": 0}, r"config\.num_samples=0: must be >= 1"),
    ({"prompt_file": "/nonexistent.txt"}, r"config\.prompt_file='/nonexistent\.txt': no such"),
    ({"sampling.temperature": float("inf")}, r"config\.sampling\.temperature=inf: .*finite"),
    ({"sampling.temperature": -0.5}, r"config\.sampling\.temperature=-0\.5"),
    # Greedy decoding would silently ignore the nucleus / top-k the user asked for.
    ({"sampling.top_p": 0.9}, r"config\.sampling\.temperature=0\.0: greedy decoding ignores"),
    ({"sampling.top_k": 40}, r"sampling\.top_k=40: set a temperature > 0"),
    # Mutation caught: without check_config building the SamplingConfig, these passed and
    # failed only after the model had loaded.
    (
      {"sampling.temperature": 0.7, "sampling.top_p": 1.5},
      r"config\.sampling\.top_p=1\.5 must be in \(0, 1\]",
    ),
    ({"sampling.max_new_tokens": 0}, r"config\.sampling\.max_new_tokens=0 must be >= 1"),
    ({"sampling.prompt_bucket": 0}, r"config\.sampling\.prompt_bucket=0 must be >= 1"),
    # SamplingConfig's own text would say "must be >= 1 or None": the config's off is 0.
    ({"sampling.top_k": -1}, r"config\.sampling\.top_k=-1: must be >= 0 tokens \(0: no top-k\)"),
  ],
)
def test_bad_settings_name_the_field(overrides, match):
  with pytest.raises(ValueError, match=match):
    sample.check_config(_config(**overrides))


def test_sampling_block_errors_name_the_config_field():
  tok = tokenizer_lib.byte_tokenizer()
  cfg = _config(**{"sampling.temperature": 0.7, "sampling.top_p": 1.5})
  with pytest.raises(ValueError, match=r"config\.sampling\.top_p=1\.5 must be in \(0, 1\]"):
    sample.sampling_config(cfg, tok)
  cfg = _config(**{"sampling.prompt_bucket": 0})
  with pytest.raises(ValueError, match=r"config\.sampling\.prompt_bucket=0 must be >= 1"):
    sample.sampling_config(cfg, tok)


def test_prompt_file_lines_in_utf8_with_bom_and_crlf_and_a_clear_error_otherwise(tmp_path):
  """Mutation caught: reading with "utf-8" and stripping only "\\n" (a BOM and "\\r" end
  up in the prompts); a Latin-1 file raised a bare UnicodeDecodeError after the model
  loaded."""
  path = tmp_path / "prompts.txt"
  path.write_bytes("\ufeffone\r\n\r\ntwo é\r\n".encode("utf-8"))
  assert sample.read_prompts(_config(prompt_file=str(path))) == ["one", "two é"]
  assert sample.read_prompts(_config(prompt_file=str(path)), ["x"]) == ["x"]
  path.write_bytes("caf\xe9\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"config\.prompt_file=.*is not UTF-8 text"):
    sample.read_prompts(_config(prompt_file=str(path)))


def _run(tmp_path, *flags):
  env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "JAX_PLATFORMS": "cpu"}
  args = [sys.executable, "-m", "experiments.sample", "--config=experiments/configs/sample.py:tiny"]
  args += [f"--compilation_cache_dir={tmp_path / 'cache'}", *flags]
  return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_samples_every_prompt_and_refuses_a_bad_setting(tmp_path):
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("one\n\ntwo\n")
  out_file = tmp_path / "out.jsonl"
  out = _run(
    tmp_path,
    f"--config.prompt_file={prompts}",
    "--config.num_samples=2",
    "--config.sampling.temperature=0.7",
    "--config.sampling.max_new_tokens=4",
    f"--output={out_file}",
  )
  assert out.returncode == 0, out.stderr[-3000:]
  records = [json.loads(line) for line in out_file.read_text().splitlines()]
  assert [(r["prompt"], r["sample"]) for r in records] == [
    ("one", 0),
    ("one", 1),
    ("two", 0),
    ("two", 1),
  ]
  assert all(1 <= len(r["tokens"]) <= 4 for r in records)
  bad = _run(tmp_path, "--config.sampling.top_p=0.9")
  assert bad.returncode != 0 and "config.sampling.temperature=0.0: greedy" in bad.stderr
