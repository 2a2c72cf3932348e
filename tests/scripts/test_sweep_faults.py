"""Sweeps that meet faults never lose a result nor file one under the wrong
trial: a damaged journal, a lost or renamed study, a trial killed by a
signal, a full or read-only disk.

The journal and the workers' choices are tested in-process on real Optuna
storage (the workers with a fake trial process); the whole paths with real
sweeps, real kills, truncated and appended bytes, a small tmpfs and a
read-only bind mount in the slow tests. Tests that mount skip unless run
as root (CI is).
"""

import contextlib
import json
import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time

import optuna
import pytest

from trainer.sweeps import report
from trainer.sweeps import space as space_lib
from trainer.sweeps import study as study_lib
from trainer.sweeps import trial_run
from trainer.sweeps import worker

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


@contextlib.contextmanager
def read_only(path):
  """`path` seen read-only through a bind mount (root ignores modes)."""
  if not _ROOT:
    pytest.skip("a read-only bind mount needs root")
  _mount("--bind", str(path), str(path))
  try:
    _mount("-o", "remount,ro,bind", str(path))
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
  assert study_lib.whole_trials(read)[1] == (
      f"record {records + 1} (byte {size})")
  whole_lines = tail.endswith(b"\n")
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


def test_a_record_being_written_is_not_taken_for_damage(tmp_path):
  study = new_study(str(tmp_path))
  finish_trial(study, 0.5)
  path = os.path.join(str(tmp_path), study_lib.JOURNAL)
  # Another process's append, half written when the report reads.
  record = (b'{"op_code":2,"worker_id":"w","study_id":0,'
            b'"user_attr":{"late":1}}\n')
  with open(path, "ab") as f:
    f.write(record[:20])

  def finish():
    with open(path, "ab") as f:
      f.write(record[20:])

  writer = threading.Timer(0.1, finish)
  writer.start()
  read = study_lib.load(str(tmp_path), None, repair=False)
  trials, damage = study_lib.whole_trials(read)
  writer.join()
  assert damage is None
  assert [t.value for t in trials] == [0.5]
  assert read.user_attrs["late"] == 1


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


# A trial killed by a signal.


# A run's records as train.py writes them: its evaluations
# (eval/evaluated.json) and its metrics.csv rows.
_RECORDS = """import json, os, signal, sys, time
def evaluated(results):
  os.makedirs("eval", exist_ok=True)
  json.dump({"steps": sorted(results), "results": {
      str(step): {"accuracy": value} for step, value in results.items()}},
            open("eval/evaluated.json.tmp", "w"))
  os.replace("eval/evaluated.json.tmp", "eval/evaluated.json")
def row(step):
  with open("metrics.csv", "a") as f:
    if f.tell() == 0:
      f.write("step,wall_time,split,loss\\n")
    f.write(f"{step},1.0,train,0.5\\n")
    print(f"train | step {step:3d}/600 | loss 0.5", flush=True)
"""


def _killed_run(tmp_path, body, poll_seconds=0.05):
  """A trial whose process runs `body` after `_RECORDS` in its model_dir
  (without TensorFlow, through `env`); returns its outcome and what it
  reported."""
  model_dir = tmp_path / "trial-0"
  model_dir.mkdir()
  script = tmp_path / "run.py"
  script.write_text(f"import os\nos.chdir({str(model_dir)!r})\n" +
                    _RECORDS + body +
                    "os.kill(os.getpid(), signal.SIGKILL)\n")
  process = trial_run.TrialProcess(["python", str(script)], str(model_dir),
                                   "accuracy", launcher=["env"])
  reported = []
  outcome = process.run(lambda step, value: reported.append((step, value)),
                        threading.Event(), poll_seconds)
  return outcome, reported


def test_a_trial_killed_by_sigkill_says_so(tmp_path):
  outcome, reported = _killed_run(tmp_path, "row(100)\nrow(200)\n")
  assert (outcome.state, outcome.value, outcome.step, outcome.cause) == (
      "KILLED", None, 0, "killed by SIGKILL at step 200: out of memory?")
  assert reported == []
  assert trial_run.killed_cause(signal.SIGSEGV, 3) == (
      "killed by SIGSEGV at step 3")


def test_a_killed_trial_quotes_its_last_evaluation_and_reports_it(tmp_path):
  # The sweep saw the evaluation of step 100; the one of step 200 came
  # after its last poll, just before the kill, which came a loop later.
  outcome, reported = _killed_run(tmp_path, (
      "row(100)\nevaluated({100: 0.9917})\ntime.sleep(1.5)\n"
      "row(200)\nevaluated({100: 0.9917, 200: 0.9889})\nrow(250)\n"),
                                  poll_seconds=0.5)
  # One pair, the record's last evaluation: in the outcome (the live
  # line) and in what the study got (the table, results.csv).
  assert (outcome.state, outcome.step, outcome.value) == (
      "KILLED", 200, 0.9889)
  assert reported == [(100, 0.9917), (200, 0.9889)]
  assert outcome.cause == "killed by SIGKILL at step 250: out of memory?"


class FakeProcess:
  """Stands for `trial_run.TrialProcess`: each run ends as `OUTCOMES`
  says, in turn; `RUNS` lists each run's model_dir and bindings."""
  OUTCOMES = []
  RUNS = []

  def __init__(self, argv, model_dir, metric, preemption_exit_code=42,
               launcher=(), python=None):
    del metric, preemption_exit_code, launcher, python
    self._run = (os.path.basename(model_dir),
                 [a for a in argv if a.startswith("--gin_param=a.b")])

  def signal(self, signum):
    del signum

  def run(self, report_, stop, poll_seconds):
    del report_, stop, poll_seconds
    FakeProcess.RUNS.append(self._run)
    return FakeProcess.OUTCOMES.pop(0)


def run_workers(sweep_dir, outcomes, monkeypatch):
  """One sweep process (`Sweep.run`) with fake trials; returns it."""
  monkeypatch.setattr(trial_run, "TrialProcess", FakeProcess)
  FakeProcess.OUTCOMES = list(outcomes)
  FakeProcess.RUNS = []
  plan = worker.Plan(sweep_dir=sweep_dir, space=tuple(SPACE),
                     metric="accuracy", gin_files=("x.gin",), gin_params=(),
                     mode="train_and_eval", total=2)
  runner = worker.Sweep(new_study(sweep_dir), plan)
  runner.run(1)
  assert not FakeProcess.OUTCOMES
  return runner


def table(sweep_dir):
  study = study_lib.load(sweep_dir, None)
  return [(t.number, report.state(t), t.user_attrs.get("cause", ""))
          for t in study.get_trials()]


def killed(step):
  return trial_run.Outcome("KILLED", None, step, 1.0,
                           trial_run.killed_cause(signal.SIGKILL, step))


def done(value):
  return trial_run.Outcome("COMPLETE", value, 40, 1.0)


def test_a_killed_trial_is_resumed_by_the_rerun_up_to_the_limit(
    tmp_path, monkeypatch, capsys):
  sweep_dir = str(tmp_path)
  # The first process: trial 0 is killed, trial 1 completes; trial 0 is
  # not run again by the process that saw it killed.
  runner = run_workers(sweep_dir, [killed(200), done(0.9)], monkeypatch)
  assert runner.killed_line() == (
      "trial 0 killed by SIGKILL at step 200: out of memory?; rerun to "
      "resume it (retry 1 of 2).")
  assert table(sweep_dir) == [
      (0, "KILLED", "killed by SIGKILL at step 200: out of memory?; rerun "
       "to resume it (retry 1 of 2)"), (1, "COMPLETE", "")]
  # Each rerun resumes it in its own model_dir, with its own bindings.
  run_workers(sweep_dir, [killed(300)], monkeypatch)
  assert FakeProcess.RUNS == [("trial-0", ["--gin_param=a.b=2"])]
  run_workers(sweep_dir, [killed(400)], monkeypatch)
  assert table(sweep_dir)[0] == (
      0, "FAIL", "killed by SIGKILL at step 400: out of memory? (3 times: "
      "not resumed again)")
  assert "sweep | trial 0 resume | a.b=2 | " in capsys.readouterr().out
  assert not run_workers(sweep_dir, [], monkeypatch).killed


def test_a_killed_trial_that_completes_on_resume_loses_its_cause(
    tmp_path, monkeypatch):
  run_workers(str(tmp_path), [killed(200), done(0.9)], monkeypatch)
  run_workers(str(tmp_path), [done(0.8)], monkeypatch)
  assert table(str(tmp_path)) == [(0, "COMPLETE", ""), (1, "COMPLETE", "")]


def test_a_trial_never_runs_in_a_directory_made_for_other_bindings(
    tmp_path, monkeypatch, capsys):
  sweep_dir = str(tmp_path)
  # A sweep whose journal was lost: its trial directories stay. The grid
  # (seed 0) gives trial 0 a.b=2, trial 1 a.b=1; the directories swapped,
  # each holds a run of the other's bindings.
  run_workers(sweep_dir, [done(0.5), done(0.6)], monkeypatch)
  assert FakeProcess.RUNS == [("trial-0", ["--gin_param=a.b=2"]),
                              ("trial-1", ["--gin_param=a.b=1"])]
  os.rename(tmp_path / "trial-0", tmp_path / "old")
  os.rename(tmp_path / "trial-1", tmp_path / "trial-0")
  os.rename(tmp_path / "old", tmp_path / "trial-1")
  os.remove(tmp_path / study_lib.JOURNAL)
  capsys.readouterr()
  run_workers(sweep_dir, [done(0.7), done(0.8)], monkeypatch)
  assert FakeProcess.RUNS == [("trial-0.2", ["--gin_param=a.b=2"]),
                              ("trial-1.2", ["--gin_param=a.b=1"])]
  out = capsys.readouterr().out.splitlines()
  assert out[0] == (f"sweep | trial 0: {sweep_dir}/trial-0 was made for "
                    f"a.b=1: this trial runs in {sweep_dir}/trial-0.2")
  rows = report.rows(study_lib.load(sweep_dir, None).get_trials(), SPACE,
                     "accuracy", sweep_dir)
  assert [row["model_dir"] for row in rows] == [
      f"{sweep_dir}/trial-0.2", f"{sweep_dir}/trial-1.2"]
  # A directory of the same bindings is the trial's own: a lost journal
  # rerun with the same points resumes them there.
  os.remove(tmp_path / study_lib.JOURNAL)
  run_workers(sweep_dir, [done(0.7), done(0.8)], monkeypatch)
  assert FakeProcess.RUNS == [("trial-0.2", ["--gin_param=a.b=2"]),
                              ("trial-1.2", ["--gin_param=a.b=1"])]


def test_a_trial_that_finds_its_disk_full_stays_to_be_resumed(
    tmp_path, monkeypatch):
  sweep_dir = str(tmp_path)
  full = trial_run.Outcome(
      "FAIL", None, 20, 1.0, "error: ResourceExhaustedError: /x/ckpt-20_temp"
      "/part; No space left on device")
  runner = run_workers(sweep_dir, [full], monkeypatch)
  assert runner.error == (
      "trial 0: error: ResourceExhaustedError: /x/ckpt-20_temp/part; No "
      "space left on device: free some space, then rerun the same command "
      "to continue.")
  assert table(sweep_dir) == [(0, "RUNNING", "")]
  run_workers(sweep_dir, [done(0.5), done(0.6)], monkeypatch)
  assert table(sweep_dir) == [(0, "COMPLETE", ""), (1, "COMPLETE", "")]


# Whole sweeps.

TWO = ["--space=optimizer.learning_rate=[0.01, 0.001]", "--sampler=grid",
       "--n_trials=2", "--metric=accuracy"]


def _results(sweep_dir):
  return sorted((row["trial"], row["state"], row["accuracy"], row["steps"],
                 row["optimizer.learning_rate"])
                for row in test_sweep.read_csv(sweep_dir))


def _one_line(result):
  """The single stderr line of a sweep that failed."""
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr[-3000:]
  return lines[0]


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
  start = data.rfind(b"{", 0, kept)
  # `--report` reads up to the bad record and writes no results.csv.
  csv_before = open(os.path.join(sweep_dir, "results.csv")).read()
  alone = test_sweep.run_sweep([f"--sweep_dir={sweep_dir}", "--report"])
  assert alone.returncode == 0, alone.stderr[-3000:]
  assert (f"sweep | results.csv and results.png not written: its study's "
          f"journal is damaged at record {records + 1} (byte {start}), so "
          "the table may miss what came after; rerun the sweep to cut it "
          "back") in alone.stdout.splitlines()
  assert open(os.path.join(sweep_dir, "results.csv")).read() == csv_before
  assert os.path.getsize(path) == kept + 16
  again = test_sweep.run_sweep(args)
  assert again.returncode == 0, again.stderr[-3000:]
  lines = again.stdout.splitlines()
  assert lines[0] == (
      f"sweep | {path}: dropped {kept + 16 - start} "
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


@pytest.mark.slow
def test_a_lost_study_never_runs_a_trial_in_another_trials_directory(
    tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  one = ["--sampler=grid", "--n_trials=1", "--metric=accuracy"]
  first = test_sweep.run_sweep(test_sweep.sweep_args(
      sweep_dir, "--space=optimizer.learning_rate=[0.01]", *one))
  assert first.returncode == 0, first.stderr[-3000:]
  old = helpers.snapshot(os.path.join(sweep_dir, "trial-0"))
  os.remove(os.path.join(sweep_dir, study_lib.JOURNAL))
  second = test_sweep.run_sweep(test_sweep.sweep_args(
      sweep_dir, "--space=optimizer.learning_rate=[0.003]", *one))
  assert second.returncode == 0, second.stderr[-3000:]
  assert (f"sweep | trial 0: {sweep_dir}/trial-0 was made for "
          "optimizer.learning_rate=0.01: this trial runs in "
          f"{sweep_dir}/trial-0.2") in second.stdout.splitlines()
  rows = test_sweep.read_csv(sweep_dir)
  assert [(row["optimizer.learning_rate"], row["steps"], row["model_dir"])
          for row in rows] == [("0.003", "40", f"{sweep_dir}/trial-0.2")]
  assert helpers.snapshot(os.path.join(sweep_dir, "trial-0")) == old
  log = open(os.path.join(sweep_dir, "trial-0.2", "sweep.log")).read()
  assert "resuming from" not in log
  assert log.count("finished at step 40") == 1


def _evaluated_pid(model_dir, timeout=240):
  """The pid of the run training in `model_dir` once it has recorded its
  first evaluation (its lease names it)."""
  record = os.path.join(model_dir, "eval", "evaluated.json")
  deadline = time.time() + timeout
  while not os.path.exists(record):
    assert time.time() < deadline, "no evaluation in time"
    time.sleep(0.05)
  with open(os.path.join(model_dir, ".trainer.lock")) as f:
    return json.load(f)["pid"]


@pytest.mark.slow
def test_a_trial_killed_by_sigkill_is_resumed_by_the_rerun(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  args = test_sweep.sweep_args(
      sweep_dir, *TWO, "--gin_param=trainer.train_steps=300",
      "--gin_param=trainer.checkpoint_interval=100",
      "--gin_param=trainer.validation_interval=100")
  # Polls too far apart to see trial 0's evaluation before its kill: the
  # sweep learns it only from the record, after the process is gone.
  first = subprocess.Popen(
      [sys.executable, test_sweep.SWEEP_PY, *args, "--poll_seconds=60"],
      cwd=helpers.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  try:
    # The OOM killer's way: SIGKILL to the trial's process, not the sweep.
    os.kill(_evaluated_pid(os.path.join(sweep_dir, "trial-0")),
            signal.SIGKILL)
    out, err = first.communicate(timeout=600)
  finally:
    if first.poll() is None:
      first.kill()
  assert first.returncode == 1, err[-3000:]
  # The live line, the table and results.csv quote one pair: the step and
  # accuracy of the trial's last recorded evaluation.
  found = trial_run.evaluations(os.path.join(sweep_dir, "trial-0"),
                                "accuracy")
  step = max(found)
  accuracy = f"{found[step]:.4f}"
  lines = out.splitlines()
  assert re.search(rf"^sweep \| trial 0 KILLED \| accuracy {accuracy} \| "
                   rf"step {step} \| ", out, re.M), out
  assert [line.split()[:4] for line in lines
          if line.startswith("  0 ")] == [["0", "KILLED", accuracy,
                                           str(step)]]
  rows = {row["trial"]: row for row in test_sweep.read_csv(sweep_dir)}
  assert (rows["0"]["state"], float(rows["0"]["accuracy"]),
          rows["0"]["steps"]) == ("KILLED", found[step], str(step))
  assert rows["1"]["state"] == "COMPLETE"
  assert re.fullmatch(
      r"sweep\.py: error: trial 0 killed by SIGKILL at step \d+: out of "
      r"memory\?; rerun to resume it \(retry 1 of 2\)\.",
      err.strip().splitlines()[-1])
  again = test_sweep.run_sweep(args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "sweep | trial 0 resume | " in again.stdout
  rows = test_sweep.read_csv(sweep_dir)
  assert [(row["state"], row["steps"], row["cause"]) for row in rows] == [
      ("COMPLETE", "300", "")] * 2
  log = open(os.path.join(sweep_dir, "trial-0", "sweep.log")).read()
  assert re.search(r"resuming from ckpt-[1-9]\d*, step [1-9]", log), log
  assert log.count("finished at step 300") == 1


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_rerun_continues(tmp_path):
  with tmpfs(tmp_path / "disk", "256k") as disk:
    sweep_dir = os.path.join(disk, "sweep")
    args = test_sweep.sweep_args(sweep_dir, *TWO)
    full = test_sweep.run_sweep(args)
    assert full.returncode == 1, full.stderr[-3000:]
    assert re.fullmatch(
        r"sweep\.py: error: .*No space left on device.*: free some space, "
        r"then rerun the same command to continue\.", _one_line(full)), (
            full.stderr)
    subprocess.run(["mount", "-o", "remount,size=64m", disk], check=True)
    again = test_sweep.run_sweep(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "sweep | trial 0 resume | " in again.stdout
    rows = test_sweep.read_csv(sweep_dir)
    assert [(row["state"], row["steps"]) for row in rows] == [
        ("COMPLETE", "40")] * 2


@pytest.mark.slow
def test_a_read_only_sweep_dir_is_one_line_and_report_only_reads(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  args = test_sweep.sweep_args(
      sweep_dir, "--space=optimizer.learning_rate=[0.01]", "--sampler=grid",
      "--n_trials=1", "--metric=accuracy")
  first = test_sweep.run_sweep(args)
  assert first.returncode == 0, first.stderr[-3000:]
  table = first.stdout.splitlines()[-6:-3]
  before = helpers.snapshot(sweep_dir)
  with read_only(sweep_dir):
    alone = test_sweep.run_sweep([f"--sweep_dir={sweep_dir}", "--report"])
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert alone.stdout.splitlines()[:3] == table
    assert alone.stdout.splitlines()[3] == (
        f"sweep | results.csv and results.png not written: {sweep_dir} is "
        "read-only")
    refused = test_sweep.run_sweep(args)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert _one_line(refused) == (
        f"sweep.py: error: {sweep_dir}/.claims.lock: Read-only file system: "
        "a sweep writes its study, locks and trials in --sweep_dir; give one "
        "it can write (--report only reads).")
  assert helpers.snapshot(sweep_dir) == before
