"""provenance.jsonl: each start of a run records the commit, the CPU and the step it
continued from (issue 69: a cited number names its commit and hardware)."""

import os
import shutil
import subprocess

import pytest

from rlpost.train import provenance

_GIT = shutil.which("git")
needs_git = pytest.mark.skipif(_GIT is None, reason="git is not installed")


def _git(repo, *args):
  env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
  env["GIT_COMMITTER_EMAIL"] = "t@t"
  out = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  return out.stdout.strip()


@needs_git
def test_the_commit_is_the_checkouts_head_and_a_change_marks_it_dirty(tmp_path):
  """A checkout with rlpost/ at its top: HEAD as git gives it, dirty once a tracked file
  changes (an untracked one does not count); the same folder inside another checkout (an
  installed copy in a venv) and a folder outside git give no commit. Mutations caught:
  the top-folder check dropped (the enclosing checkout's HEAD), untracked files counted."""
  repo = tmp_path / "repo"
  (repo / "rlpost").mkdir(parents=True)
  (repo / "rlpost" / "__init__.py").write_text("")
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "commit", "-q", "-m", "one")
  head = _git(repo, "rev-parse", "HEAD")
  assert provenance.checkout(str(repo / "rlpost")) == (head, False)
  (repo / "notes.txt").write_text("untracked")
  assert provenance.checkout(str(repo / "rlpost")) == (head, False)
  (repo / "rlpost" / "__init__.py").write_text("x = 1\n")
  assert provenance.checkout(str(repo / "rlpost")) == (head, True)
  installed = repo / "venv" / "site-packages" / "rlpost"
  installed.mkdir(parents=True)
  assert provenance.checkout(str(installed)) == (None, None)
  (tmp_path / "plain" / "rlpost").mkdir(parents=True)
  assert provenance.checkout(str(tmp_path / "plain" / "rlpost")) == (None, None)


def test_cpu_fields_are_the_first_processors():
  text = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
    "model name\t: AMD EPYC 7B13\n\nprocessor\t: 1\ncpu family\t: 6\nmodel\t\t: 85\n"
    "model name\t: Intel(R) Xeon(R)\n"
  )
  assert provenance.cpu_fields(text) == {
    "cpu": "AMD EPYC 7B13",
    "cpu_family": "25",
    "cpu_model": "1",
  }
  assert provenance.cpu_name(provenance.cpu_fields(text)) == "AMD EPYC 7B13 (family 25, model 1)"
  arm = provenance.cpu_fields("Features\t: fp asimd\n")
  assert arm == dict.fromkeys(("cpu", "cpu_family", "cpu_model"))
  assert provenance.cpu_name(arm) == "unknown CPU"


def test_a_start_and_a_resume_each_append_a_record(tmp_path):
  """The loop records a fresh start at step 0 and a resume at its checkpoint's step, with
  this process's usable cores and rlpost's own checkout (git's HEAD when the tree is one);
  `summary` names each commit once; a line torn by a kill is dropped, not followed by
  the next. Mutation caught: a resume recorded as step 0 (provenance_resume_as_fresh)."""
  from test_train import _loop_run  # pylint: disable=g-import-not-at-top

  _loop_run(tmp_path, {}, steps=2)
  with open(tmp_path / provenance.FILE, "a", encoding="utf-8") as f:
    f.write('{"step": 2, "time": "2026-')  # a start killed while writing its line
  _loop_run(tmp_path, {}, steps=3)
  records = provenance.read(str(tmp_path))
  assert [r["step"] for r in records] == [0, 2] and not list(tmp_path.glob("*.tmp"))
  assert records[0]["cores"] == len(os.sched_getaffinity(0))
  package = os.path.dirname(os.path.dirname(os.path.abspath(provenance.__file__)))
  repo = os.path.dirname(package)  # the folder holding rlpost/
  top = subprocess.run(
    ["git", "-C", repo, "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True
  )
  lines = top.stdout.split()
  in_checkout = top.returncode == 0 and os.path.realpath(lines[0]) == os.path.realpath(repo)
  assert records[1]["commit"] == (lines[1] if in_checkout else None)
  summary = provenance.summary(records)
  assert summary["starts"] == [0, 2] and len(summary["commits"]) == 1
  assert summary["cpus"] == [provenance.cpu_name(provenance.cpu_fields())]
