"""Sweeps that meet faults never lose a result: a damaged journal, a
renamed study.

The journal is tested in-process on real Optuna storage; the whole path
with a real sweep, truncated and appended bytes in the slow test. Tests
that mount skip unless run as root (CI is).
"""

import contextlib
import errno
import os
import subprocess
import sys

import optuna
import pytest

from sweeps import space as space_lib
from sweeps import study as study_lib

import helpers
import test_sweep

_ROOT = os.geteuid() == 0


def _mount(*args):
  done = subprocess.run(["mount", *args], capture_output=True, text=True)
  if done.returncode != 0:
    pytest.skip(f"mount {' '.join(args)} failed: {done.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(path, size):
  """A tmpfs of `size` at `path` (a full disk at will)."""
  if not _ROOT:
    pytest.skip("mounting a tmpfs needs root")
  os.makedirs(path, exist_ok=True)
  _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
  try:
    yield str(path)
  finally:
    subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path):
  """Fills the disk of `path` with it."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT)
  try:
    while True:
      os.write(fd, b"x" * 4096)
  except OSError as e:
    assert e.errno == errno.ENOSPC
  finally:
    os.close(fd)


SPACE = space_lib.parse_space(["a.b=[1, 2]"])
WANTED = study_lib.identity(SPACE, "accuracy", "maximize", ["x.gin"], [],
                            "train_and_eval")


def new_study(sweep_dir):
  return study_lib.open_study(sweep_dir, None, WANTED,
                              study_lib.sampler("grid", 0, SPACE),
                              optuna.pruners.NopPruner())


def finish_trial(study, value):
  trial = study.ask({"a.b": SPACE[0].distribution()})
  study.tell(trial, value)


# The journal.


def test_a_torn_tail_is_cut_back_kept_aside_and_never_appended_after(
    tmp_path, capsys):
  sweep_dir = str(tmp_path)
  study = new_study(sweep_dir)
  finish_trial(study, 0.5)
  path = os.path.join(sweep_dir, study_lib.JOURNAL)
  whole = open(path, "rb").read()
  records = whole.count(b"\n")
  # A full disk cut the next record (trial 1's creation) short.
  torn = b'{"op_code":4,"worker_id":"x","study_id":0,"datetime_st'
  with open(path, "ab") as f:
    f.write(torn)
  # A process that had the study open appends: the torn bytes go first.
  study.set_user_attr("after", 1)
  assert capsys.readouterr().out.splitlines() == [
      f"sweep | {path}: dropped {len(torn)} bytes after record {records} "
      f"(1 line not whole or after one); the damaged file is kept as "
      f"{path}.damaged-1"]
  assert open(path + ".damaged-1", "rb").read() == whole + torn
  again = study_lib.load(sweep_dir, None)
  assert again.user_attrs["after"] == 1
  assert [t.value for t in again.get_trials()] == [0.5]
  assert study_lib.damage(again) is None


@pytest.mark.parametrize("tail", [b"\x00\x00\x00\x00", b"garbage\n",
                                  b'{"op_code": 8, "tr\n{"op_code":2}\n'])
def test_a_garbage_tail_is_read_up_to_and_cut_back_on_open(tmp_path, capsys,
                                                           tail):
  sweep_dir = str(tmp_path)
  study = new_study(sweep_dir)
  finish_trial(study, 0.5)
  path = os.path.join(sweep_dir, study_lib.JOURNAL)
  size = os.path.getsize(path)
  records = open(path, "rb").read().count(b"\n")
  with open(path, "ab") as f:
    f.write(tail)
  # A read writes nothing and stops at the bad record: what is before it.
  read = study_lib.load(sweep_dir, None, repair=False)
  assert [t.value for t in read.get_trials()] == [0.5]
  assert os.path.getsize(path) == size + len(tail)
  whole_lines = tail.endswith(b"\n")
  assert study_lib.damage(read) == (
      f"record {records + 1} at byte {size}" if whole_lines else None)
  # Opened for a sweep: cut back first, one line, the study goes on.
  study = study_lib.load(sweep_dir, None)
  lines = tail.count(b"\n") + (not whole_lines)
  assert capsys.readouterr().out.splitlines() == [
      f"sweep | {path}: dropped {len(tail)} bytes after record {records} "
      f"({lines} line{'s' if lines > 1 else ''} not whole or after one); "
      f"the damaged file is kept as {path}.damaged-1"]
  assert os.path.getsize(path) == size
  finish_trial(study, 0.7)
  assert [t.value for t in study_lib.load(sweep_dir, None).get_trials()
          ] == [0.5, 0.7]


def test_a_full_disk_leaves_no_torn_record(tmp_path):
  with tmpfs(tmp_path / "disk", "64k") as disk:
    study = new_study(disk)
    finish_trial(study, 0.5)
    path = os.path.join(disk, study_lib.JOURNAL)
    before = open(path, "rb").read()
    fill(os.path.join(disk, "filler"))
    with pytest.raises(OSError) as raised:
      study.set_user_attr("big", "y" * 20000)
    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename == path
    assert open(path, "rb").read() == before
    os.remove(os.path.join(disk, "filler"))
    study.set_user_attr("small", 1)
    assert study_lib.load(disk, None).user_attrs["small"] == 1


def test_a_renamed_sweep_directory_keeps_its_study(tmp_path):
  study = new_study(str(tmp_path / "a"))
  finish_trial(study, 0.5)
  os.rename(tmp_path / "a", tmp_path / "b")
  assert study_lib.exists(str(tmp_path / "b"), None)
  again = new_study(str(tmp_path / "b"))
  assert [t.value for t in again.get_trials()] == [0.5]
  assert optuna.study.get_all_study_names(
      study_lib.open_storage(str(tmp_path / "b"), None)) == ["a"]


# Whole sweeps.

TWO = ["--space=optimizer.learning_rate=[0.01, 0.001]", "--sampler=grid",
       "--n_trials=2", "--metric=accuracy"]


def _results(sweep_dir):
  return sorted((row["trial"], row["state"], row["accuracy"], row["steps"],
                 row["optimizer.learning_rate"])
                for row in test_sweep.read_csv(sweep_dir))


@pytest.mark.slow
def test_a_damaged_journal_tail_and_a_renamed_sweep_keep_every_result(
    tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  args = test_sweep.sweep_args(sweep_dir, *TWO)
  first = test_sweep.run_sweep(args)
  assert first.returncode == 0, first.stderr[-3000:]
  before = _results(sweep_dir)
  assert [row[1] for row in before] == ["COMPLETE"] * 2
  # The last record (trial 1's end) torn by a full disk, then junk after it.
  path = os.path.join(sweep_dir, study_lib.JOURNAL)
  data = open(path, "rb").read()
  last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
  kept = len(data) - len(last) - 1 + len(last) // 2
  with open(path, "r+b") as f:
    f.truncate(kept)
    f.seek(kept)
    f.write(b"\x00" * 16)
  records = data[:kept].count(b"\n")
  again = test_sweep.run_sweep(args)
  assert again.returncode == 0, again.stderr[-3000:]
  lines = again.stdout.splitlines()
  assert lines[0] == (
      f"sweep | {path}: dropped {kept + 16 - data.rfind(b'{', 0, kept)} "
      f"bytes after record {records} (1 line not whole or after one); the "
      f"damaged file is kept as {path}.damaged-1")
  assert open(path + ".damaged-1", "rb").read() == data[:kept] + b"\0" * 16
  # Trial 1 lost its end: it resumes, finds its run done, and keeps it.
  assert sum(" resume | " in line for line in lines) == 1
  assert _results(sweep_dir) == before
  # Renamed, the sweep keeps its study: nothing to run.
  os.rename(sweep_dir, sweep_dir + "-renamed")
  renamed = test_sweep.run_sweep(
      test_sweep.sweep_args(sweep_dir + "-renamed", *TWO))
  assert renamed.returncode == 0, renamed.stderr[-3000:]
  assert f"sweep | {sweep_dir}-renamed: 2 of 2 trials done" in renamed.stdout
  assert " start | " not in renamed.stdout
  assert " resume | " not in renamed.stdout
  assert _results(sweep_dir + "-renamed") == before
