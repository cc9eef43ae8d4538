"""Bad input through the real command line: every data or model file a main cannot use,
and every unusable --dist setting, ends in one FATAL line naming the file (and line) or
the flag and the fix, with exit status 2 and no traceback, as a refused config value does
(issue 36)."""

import json
import socket

import pytest

from conftest import run_clis

GRPO = ("experiments.grpo", "--config=experiments/configs/grpo_gsm8k.py:tiny")
SFT = ("experiments.sft", "--config=experiments/configs/sft.py:tiny")
DPO = ("experiments.dpo", "--config=experiments/configs/dpo.py:tiny")
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"


def _cases(d):
  """(name, main, overrides, expected wording) of each bad file, written under `d`."""
  (d / "gsm8k_bad").mkdir()
  (d / "gsm8k_bad" / "train.jsonl").write_text('{"question": "q?", "answer": "two"}\n')
  (d / "gsm8k_bin").mkdir()
  (d / "gsm8k_bin" / "train.jsonl").write_bytes(BINARY)
  (d / "no_reply.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
  (d / "binary.jsonl").write_bytes(BINARY)
  good = json.dumps({"prompt": "a", "completion": "b"})
  (d / "latin1.jsonl").write_bytes(good.encode() + b"\n" + '{"prompt": "caf\xe9"}'.encode("latin1"))
  (d / "pairs.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "c"}) + "\n")
  (d / "x.gguf").write_text("not a model\n")
  gsm8k = lambda name: ["--config.data.source=gsm8k", f"--config.data.data_dir={d / name}"]
  sft = lambda name: ["--config.data.source=jsonl", f"--config.data.path={d / name}"]
  return [
    ("malformed GSM8K", GRPO, gsm8k("gsm8k_bad"), "train.jsonl:1: field 'answer' has no '####"),
    ("binary GSM8K", GRPO, gsm8k("gsm8k_bin"), "train.jsonl:1: byte b'\\x89'"),
    ("no assistant turn", SFT, sft("no_reply.jsonl"), "no_reply.jsonl:1: the last message"),
    ("binary data.path", SFT, sft("binary.jsonl"), "binary.jsonl:1: byte b'\\x89'"),
    ("latin-1 line", SFT, sft("latin1.jsonl"), "latin1.jsonl:2: byte b'\\xe9'"),
    (
      "DPO without rejected",
      DPO,
      [f"--config.data.path={d / 'pairs.jsonl'}", "--config.data.source=jsonl"],
      "pairs.jsonl:1: missing field 'rejected'",
    ),
    (
      "not GGUF",
      GRPO,
      ["--config.model.weights=gguf", f"--config.model.path={d / 'x.gguf'}"],
      "x.gguf is not a GGUF file",
    ),
    ("address without port", GRPO, _dist("localhost"), "'localhost': give HOST:PORT"),
    ("no processes", GRPO, _dist("localhost:1", processes=0), "num_processes=0: must be >= 1"),
    (
      "nothing listening",
      GRPO,
      [*_dist(f"localhost:{_free_port()}"), "--dist.connect_timeout_s=1"],
      "nothing accepted a connection there within 1 s",
    ),
  ]


def _dist(address, processes=2):
  return [
    f"--dist.coordinator_address={address}",
    f"--dist.num_processes={processes}",
    "--dist.process_id=1",
  ]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_every_unusable_file_is_one_fatal_line_with_status_2(tmp_path):
  """Each case of issue 36's list through its main (one process start for all: forked
  children, tests/cli_batch.py). Mutation caught: the data and model loaders raising a
  plain ValueError again (each a traceback and status 1)."""
  cases = _cases(tmp_path)
  runs = run_clis(
    [
      [main, [flag, *overrides, f"--workdir={tmp_path / 'run' / str(i)}"]]
      for i, (_, (main, flag), overrides, _) in enumerate(cases)
    ]
  )
  failures = []
  for (name, _, _, wording), (status, output) in zip(cases, runs):
    fatal = [line for line in output.splitlines() if line.startswith("FATAL")]
    if status != 2 or len(fatal) != 1 or wording not in fatal[0] or "Traceback" in output:
      failures.append(f"{name}: status {status}, FATAL lines {fatal}\n{output[-1500:]}")
  assert not failures, "\n\n".join(failures)
