"""trainer/sweeps/trial_run.py with a URL model_dir: the process's output
kept locally while it runs, then copied to `model_dir/sweep.log`."""

import os
import threading
import time

import pytest

from trainer.storage import files
from trainer.sweeps import trial_run

# A stand-in for train.py: its progress to its last step, and the end.
FAKE_TRAIN = """
print("train | step  40/40 | 100.0 steps/s", flush=True)
print("train | finished at step 40", flush=True)
"""


def test_a_url_trials_log_is_local_then_copied_to_its_model_dir(
    url_sweep_dir, tmp_path):
  script = tmp_path / "fake_train.py"
  script.write_text(FAKE_TRAIN)
  model_dir = url_sweep_dir + "/trial-0"
  # The run's evaluations, as train.py records them in its model_dir.
  files.write_json(model_dir + "/eval/evaluated.json",
                   {"steps": [40], "results": {"40": {"accuracy": 0.9}}})
  # What an earlier run of the trial, on another machine, said.
  files.write_text(model_dir + "/sweep.log", "train | step  20/40 | x\n")
  local = str(tmp_path / "cache" / "trial-0" / trial_run.LOG)
  process = trial_run.TrialProcess(
      ["python", str(script)], model_dir, "accuracy", launcher=("env",),
      log_path=local)
  outcome = process.run(lambda step, value: False, threading.Event(),
                        poll_seconds=0.05)
  assert (outcome.state, outcome.value, outcome.step) == (
      trial_run.COMPLETE, 0.9, 40)
  assert files.read_text(model_dir + "/sweep.log").splitlines() == [
      "train | step  20/40 | x", "train | step  40/40 | 100.0 steps/s",
      "train | finished at step 40"]
  with open(local) as f:
    assert f.read() == files.read_text(model_dir + "/sweep.log")


def test_a_url_trials_log_is_copied_while_it_runs(url_sweep_dir, tmp_path,
                                                  monkeypatch):
  """A sweep killed with its machine leaves the URL the log up to its last
  copy, not nothing."""
  monkeypatch.setattr(trial_run, "LOG_COPY_SECONDS", 0.1)
  started = tmp_path / "seen"
  script = tmp_path / "fake_train.py"
  script.write_text(
      "import os, time\n"
      "print('train | step  20/40 | 5.0 steps/s', flush=True)\n"
      # Never copied: the test fails, not hangs.
      "deadline = time.time() + 20\n"
      f"while not os.path.exists({str(started)!r}) and\\\n"
      "    time.time() < deadline:\n"
      "  time.sleep(0.05)\n"
      "print('train | finished at step 40', flush=True)\n")
  model_dir = url_sweep_dir + "/trial-0"
  copies = []

  def report(step, value):
    del step, value
    return False

  def seen():
    # Polled as the sweep polls: the URL's log while the process waits.
    deadline = time.time() + 20
    while not started.exists() and time.time() < deadline:
      text = files.read_text(model_dir + "/sweep.log")
      if text:
        copies.append(text)
        started.write_text("")
      threading.Event().wait(0.05)

  watcher = threading.Thread(target=seen)
  watcher.start()
  process = trial_run.TrialProcess(
      ["python", str(script)], model_dir, "accuracy", launcher=("env",),
      log_path=str(tmp_path / "cache" / trial_run.LOG))
  process.run(report, threading.Event(), poll_seconds=0.05)
  watcher.join(timeout=30)
  assert copies == ["train | step  20/40 | 5.0 steps/s\n"]
  assert files.read_text(model_dir + "/sweep.log").splitlines()[-1] == (
      "train | finished at step 40")


def test_a_copy_of_the_log_that_fails_is_one_warning_and_the_trial_goes_on(
    url_sweep_dir, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(trial_run, "LOG_COPY_SECONDS", 0.0)
  script = tmp_path / "fake_train.py"
  script.write_text("import time\ntime.sleep(0.5)\n" + FAKE_TRAIN)
  model_dir = url_sweep_dir + "/trial-0"
  files.write_json(model_dir + "/eval/evaluated.json",
                   {"steps": [40], "results": {"40": {"accuracy": 0.9}}})
  copy = files.copy
  failures = []

  def flaky_copy(source, target):
    if not failures:  # The store out of reach once, as the trial runs.
      failures.append(target)
      raise RuntimeError("UnavailableError: the store is out of reach")
    copy(source, target)

  monkeypatch.setattr(trial_run.files, "copy", flaky_copy)
  local = str(tmp_path / "cache" / trial_run.LOG)
  process = trial_run.TrialProcess(
      ["python", str(script)], model_dir, "accuracy", launcher=("env",),
      log_path=local)
  outcome = process.run(lambda step, value: False, threading.Event(),
                        poll_seconds=0.05)
  assert (outcome.state, outcome.value) == (trial_run.COMPLETE, 0.9)
  assert failures == [model_dir + "/sweep.log"]
  assert (f"warning | sweep | {model_dir}/sweep.log not copied "
          f"(RuntimeError); the log is whole in {local}") in (
              capsys.readouterr().out)
  assert files.read_text(model_dir + "/sweep.log").splitlines()[-1] == (
      "train | finished at step 40")


def test_a_url_model_dir_needs_a_local_log(url_sweep_dir):
  for log_path in (None, url_sweep_dir + "/trial-0/sweep.log"):
    with pytest.raises(ValueError) as raised:
      trial_run.TrialProcess(["python", "train.py"],
                             url_sweep_dir + "/trial-0", "accuracy",
                             log_path=log_path)
    assert str(raised.value) == (
        f"{url_sweep_dir}/trial-0/sweep.log is a URL: a process writes its "
        "output to a local file, give one as `log_path`.")
  assert not os.path.exists(os.path.join(os.getcwd(), "ram:"))
