"""SIGTERM/SIGINT: a checkpoint at the step reached, the preemption exit code,
and a resume that ends where an uninterrupted run does. Real processes and
real signals, each bounded in time."""

import os
import signal
import time

import pytest

import helpers
from trainer import errors
from trainer import preemption

DIGITS = ["--gin_file=gin/digits.gin", "--gin_param=runtime.deterministic=True",
          "--gin_param=trainer.steps_per_loop=10",
          "--gin_param=trainer.summary_interval=10",
          "--gin_param=trainer.checkpoint_interval=100000", "--mode=train"]


def _fingerprint(process):
  return process.wait_for(r"weights fingerprint (\w+)", 5).group(1)


@pytest.mark.parametrize("signum", [
    signal.SIGTERM,
    # Not `serial`: its limits are the SIGTERM case's, which runs two at a
    # time in the default suite.
    pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_signal_saves_exits_42_and_resumes_exactly(tmp_path, signum):
  model_dir = tmp_path / "run"
  run = helpers.TrainProcess(
      DIGITS + ["--gin_param=trainer.train_steps=100000",
                f"--model_dir={model_dir}"])
  try:
    run.wait_for(r"train \| step\s+[5-9]0/", timeout=120)
    run.process.send_signal(signum)
    sent = time.time()
    returncode = run.finish(timeout=60)
  finally:
    run.close()
  assert time.time() - sent < 30  # Within a loop or so, not at the end.
  assert returncode == 42, run.stderr[-2000:]
  last = run.stderr.strip().splitlines()[-1]
  step = int(last.split("preempted at step ")[1].split(":")[0])
  # Ctrl-C is a stop the user asked for, not an error.
  label = "" if signum == signal.SIGINT else "error: "
  assert last == (f"train.py: {label}preempted at step {step}: checkpoint "
                  "saved; run the same command again to resume (exit code "
                  "42)")
  assert step >= 50 and step % 10 == 0
  # The checkpoint is at the step reached, not at an interval.
  assert helpers.checkpoint_step(str(model_dir)) == step

  final = step + 50
  resumed = helpers.TrainProcess(
      DIGITS + [f"--gin_param=trainer.train_steps={final}",
                f"--model_dir={model_dir}"])
  straight = helpers.TrainProcess(
      DIGITS + [f"--gin_param=trainer.train_steps={final}",
                f"--model_dir={tmp_path / 'straight'}"])
  assert resumed.finish() == 0, resumed.stderr[-2000:]
  assert straight.finish() == 0, straight.stderr[-2000:]
  assert f"at step {step}" in resumed.output
  assert _fingerprint(resumed) == _fingerprint(straight)


@pytest.mark.slow  # Not `serial`: it times nothing (60 s to exit).
def test_exit_code_is_configurable(tmp_path):
  run = helpers.TrainProcess(
      DIGITS + ["--gin_param=trainer.train_steps=100000",
                "--gin_param=trainer.preemption_exit_code=75",
                f"--model_dir={tmp_path}"])
  try:
    run.wait_for(r"train \| step\s+\d+/", timeout=120)
    run.process.send_signal(signal.SIGTERM)
    assert run.finish(timeout=60) == 75
  finally:
    run.close()
  assert os.path.exists(tmp_path / "checkpoint")


def test_watcher_records_a_signal_and_restores_handlers():
  before = signal.getsignal(signal.SIGTERM)
  with preemption.PreemptionWatcher() as watcher:
    assert not watcher.received
    os.kill(os.getpid(), signal.SIGTERM)
    assert watcher.received
    assert watcher.agreed(None)
  assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_for_sigusr1_requeues_through_the_function_given():
  # The scheduler is the caller's (the command line passes SLURM's): the
  # requeue is made once the process is sure to exit, by the chief.
  calls = []

  def requeue(is_chief):
    calls.append(is_chief)
    return "job 9 requeued"

  stop = errors.Preempted(100, 42, requeue=True, is_chief=False)
  line = preemption.exit_line(stop, requeue)
  assert not calls
  assert line() == (
      "preempted at step 100 by SIGUSR1 (the time limit is near): "
      "checkpoint saved; job 9 requeued, to resume from step 100 (exit code "
      "42)")
  assert calls == [False]
  plain = errors.Preempted(100, 42)
  assert preemption.exit_line(plain, requeue) == str(plain)
  assert calls == [False]
