"""Signals while TensorFlow is busy, and input that fails or hangs.

Real processes: a user's task whose training input blocks forever (or
raises) at example 640, inside a `tf.py_function`, so the main thread waits
inside TensorFlow where Python signal handlers never run. Each process runs
under a timeout.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import helpers
import tensorflow as tf
from trainer import errors
from trainer import preemption
from trainer.distribute import slurm

FAULTY_TASK = textwrap.dedent('''
    import time

    import gin
    import tensorflow as tf
    from tasks import digits


    @gin.configurable
    class FaultyDigits(digits.DigitsClassification):
      """Digits whose training input blocks or raises at example `fault_at`;
      its eval input waits `eval_delay` seconds before the first example."""

      def __init__(self, fault: str = "raise", fault_at: int = 640,
                   eval_delay: float = 0.0):
        super().__init__()
        self.fault = fault
        self.fault_at = fault_at
        self.eval_delay = eval_delay

      def build_inputs(self, training, input_context=None):
        dataset = super().build_inputs(training, input_context)
        fault, fault_at, delay = self.fault, self.fault_at, self.eval_delay

        def check(index):
          index = int(index)
          if not training:
            if index == 0 and delay:
              print("eval input | waiting", flush=True)
              time.sleep(delay)
          elif index >= fault_at and fault == "block":
            while True:
              time.sleep(1)
          elif index >= fault_at:
            raise RuntimeError(f"simulated read failure at example {index}")
          return index

        def mark(index, example):
          image, label = example
          index = tf.py_function(check, [index], tf.int64)
          return image, label + tf.cast(index * 0, label.dtype)

        if training:
          dataset = dataset.repeat()
        return dataset.enumerate().map(mark)
''')

# Batches of 64: example 640 is in step 11. Loops of 2 steps and a
# checkpoint every 4: step 10 is reached, step 8 is the newest checkpoint.
FAULTY_GIN = textwrap.dedent('''
    import faulty_task
    experiment.task = @FaultyDigits()
    trainer.train_steps = 100000
    trainer.steps_per_loop = 2
    trainer.summary_interval = 2
    trainer.checkpoint_interval = 4
    trainer.global_batch_size = 64
''')

# The input blocks in step 12 (`fault_at=704`), in the loop of steps 11 and
# 12: step 11 is trained, step 8 is the newest checkpoint.
STUCK_AT = "--gin_param=FaultyDigits.fault_at=704"


def _kept(signal_name):
  return (f"the checkpoint of step 8 was saved before {signal_name}; steps "
          "9-11 are not saved; run the same command again to resume from "
          "step 8 (exit code 42)")


@pytest.fixture(name="faulty_gin")
def fixture_faulty_gin(tmp_path):
  directory = tmp_path / "user"
  directory.mkdir()
  (directory / "faulty_task.py").write_text(FAULTY_TASK)
  (directory / "faulty.gin").write_text(FAULTY_GIN)
  return f"--gin_file={directory / 'faulty.gin'}"


def _last_stderr_line(run):
  return run.stderr.strip().splitlines()[-1]


def _stuck_at_step_10(faulty_gin, model_dir, *params):
  """Starts a run whose input blocks in step 11; returns once it waits."""
  run = helpers.TrainProcess(
      [faulty_gin, f"--model_dir={model_dir}", "--mode=train",
       '--gin_param=FaultyDigits.fault="block"', STUCK_AT, *params])
  run.wait_for(r"train \| step\s+10/", timeout=120)
  time.sleep(1)  # Into the loop of steps 11 and 12, waiting for input.
  return run


def _assert_step_8_intact(model_dir):
  assert helpers.checkpoint_step(str(model_dir)) == 8
  assert not [name for name in os.listdir(model_dir)
              if "temp" in name or name.startswith(".tmp")]
  assert helpers.checkpoint_numbers(str(model_dir / "ckpt-8"))


@pytest.mark.slow
@pytest.mark.serial  # Times a grace period.
def test_sigterm_while_the_input_blocks_exits_after_the_grace_period(
    tmp_path, faulty_gin):
  model_dir = tmp_path / "run"
  run = _stuck_at_step_10(faulty_gin, model_dir,
                          "--gin_param=trainer.preemption_grace_seconds=3")
  try:
    run.process.send_signal(signal.SIGTERM)
    sent = time.time()
    returncode = run.finish(timeout=30)
  finally:
    run.close()
  waited = time.time() - sent
  assert 3 <= waited < 8, waited
  assert returncode == 42, run.stderr[-2000:]
  assert ("warning | received SIGTERM: saving a checkpoint after this loop"
          in run.output)
  assert _last_stderr_line(run) == (
      "train.py: error: preempted at step 11: training did not stop within "
      "3 s of SIGTERM (`trainer.preemption_grace_seconds`); " +
      _kept("SIGTERM"))
  _assert_step_8_intact(model_dir)

  # The same command resumes from it (here up to step 10, before the fault).
  resumed = helpers.TrainProcess(
      [faulty_gin, f"--model_dir={model_dir}", "--mode=train",
       '--gin_param=FaultyDigits.fault="block"',
       "--gin_param=trainer.train_steps=10"])
  assert resumed.finish(timeout=120) == 0, resumed.stderr[-2000:]
  assert "at step 8" in resumed.output
  assert helpers.checkpoint_step(str(model_dir)) == 10


def test_a_second_signal_exits_at_once(tmp_path, faulty_gin):
  model_dir = tmp_path / "run"
  run = _stuck_at_step_10(faulty_gin, model_dir,
                          "--gin_param=trainer.preemption_grace_seconds=60")
  try:
    run.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    run.process.send_signal(signal.SIGINT)
    sent = time.time()
    returncode = run.finish(timeout=30)
  finally:
    run.close()
  assert time.time() - sent < 5
  assert returncode == 42, run.stderr[-2000:]
  assert _last_stderr_line(run) == (
      "train.py: error: preempted at step 11: a second signal (SIGINT) ended "
      "it at once; " + _kept("SIGTERM"))
  _assert_step_8_intact(model_dir)


def test_the_same_signal_twice_at_once_saves_as_one(tmp_path):
  # `timeout` signals the process, then its group: two SIGTERMs at once.
  model_dir = tmp_path / "run"
  run = helpers.TrainProcess(
      ["--gin_file=gin/digits.gin", f"--model_dir={model_dir}",
       "--mode=train", "--gin_param=trainer.train_steps=100000",
       "--gin_param=trainer.checkpoint_interval=100"])
  try:
    run.wait_for(r"^saved checkpoint .*ckpt-100$", timeout=120)
    run.process.send_signal(signal.SIGTERM)
    run.process.send_signal(signal.SIGTERM)
    returncode = run.finish(timeout=60)
  finally:
    run.close()
  assert returncode == 42, run.stderr[-2000:]
  last = _last_stderr_line(run)
  step = helpers.checkpoint_step(str(model_dir))
  assert last == (f"train.py: error: preempted at step {step}: checkpoint "
                  "saved; run the same command again to resume (exit code "
                  "42)"), run.stderr[-2000:]


def _blocked_signals(pid):
  """Returns the signals blocked in the main thread of process `pid`."""
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("SigBlk:"):
        mask = int(line.split()[1], 16)
        return {s for s in signal.Signals if mask & (1 << (s - 1))}
  return set()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="reads /proc")
def test_sigterm_during_startup_exits_with_the_preemption_code(tmp_path):
  run = helpers.TrainProcess(
      ["--gin_file=gin/digits.gin", f"--model_dir={tmp_path / 'run'}",
       "--gin_param=trainer.preemption_exit_code=75"])
  try:
    # As soon as train.py's first line has run, long before training.
    deadline = time.time() + 30
    while not {signal.SIGTERM, signal.SIGINT} <= _blocked_signals(
        run.process.pid):
      assert time.time() < deadline and run.process.poll() is None
      time.sleep(0.01)
    run.process.send_signal(signal.SIGTERM)
    returncode = run.finish(timeout=60)
  finally:
    run.close()
  assert returncode == 75, run.stderr[-2000:]
  assert _last_stderr_line(run) == (
      "train.py: error: preempted by SIGTERM before training started: "
      "nothing to save; run the same command again (exit code 75)")
  assert "train |" not in run.output


def test_sigint_during_the_final_evaluation_exits_at_once(tmp_path,
                                                          faulty_gin):
  model_dir = tmp_path / "run"
  run = helpers.TrainProcess(
      [faulty_gin, f"--model_dir={model_dir}", "--mode=train_and_eval",
       "--gin_param=trainer.train_steps=4",
       "--gin_param=FaultyDigits.eval_delay=1000"])
  try:
    run.wait_for("eval input | waiting", timeout=120)
    run.process.send_signal(signal.SIGINT)
    sent = time.time()
    returncode = run.finish(timeout=30)
  finally:
    run.close()
  assert time.time() - sent < 5
  assert returncode == 42, run.stderr[-2000:]
  assert _last_stderr_line(run) == (  # Ctrl-C: asked for, not an error.
      "train.py: preempted by SIGINT after training: the final "
      "checkpoint (step 4) is saved; run the same command again to finish "
      "(exit code 42)")
  assert helpers.checkpoint_step(str(model_dir)) == 4


@pytest.mark.slow
@pytest.mark.serial  # Times a grace period.
def test_an_input_that_raises_always_exits_with_its_message(tmp_path,
                                                            faulty_gin):
  # Exit used to hang in ~IteratorResource in 3 runs of 4: five at once.
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  runs = [subprocess.Popen(
      [sys.executable, helpers.TRAIN_PY, faulty_gin, "--mode=train",
       f"--model_dir={tmp_path / str(index)}"], cwd=helpers.REPO_ROOT,
      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
          for index in range(5)]
  for returncode, _, stderr in helpers.finish(runs, timeout=120):
    assert returncode == 1, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: "), last
    assert last.endswith(
        "RuntimeError: simulated read failure at example 640"), last


class _Exited(Exception):
  pass


def _receiver(progress=(10, 8)):
  """A receiver with a fake clock whose exits raise `_Exited(line, code)`."""
  now = [0.0]

  def exit_fn(line, code, asked=False):
    raise _Exited(line, code, asked)

  receiver = preemption.Receiver(exit_fn, slurm.requeue_outcome,
                                 clock=lambda: now[0])
  watcher = preemption.PreemptionWatcher(progress_fn=lambda: progress)
  receiver.watcher = watcher
  return receiver, watcher


def test_receiver_waits_for_the_configured_exit_code():
  receiver, _ = _receiver()
  receiver.handle(signal.SIGTERM)  # During flag parsing: nothing yet.
  with pytest.raises(_Exited) as exited:
    receiver.configure(75, 10.0, training=False)
  assert exited.value.args == (
      "preempted by SIGTERM: nothing to save; run the same command again "
      "(exit code 75)", 75, False)


def test_receiver_defers_while_armed_and_exits_when_the_time_is_up():
  receiver, watcher = _receiver(progress=(10, None))
  receiver.configure(42, 3.0, training=True)
  with watcher.armed():
    receiver.handle(signal.SIGINT)  # Recorded; the loop will save.
    assert watcher.received
    with pytest.raises(_Exited) as exited:
      receiver.expire()
  assert exited.value.args[0] == (
      "preempted at step 10: training did not stop within 3 s of SIGINT "
      "(`trainer.preemption_grace_seconds`); no checkpoint is saved yet; "
      "steps 1-10 are not saved; run the same command again to start over "
      "(exit code 42)")
  assert exited.value.args[2]  # Ctrl-C: asked for, not an error.


def test_receiver_says_which_steps_a_forced_exit_leaves_unsaved():
  progress = [(507, 500)]
  exits, asked_for = [], []
  receiver = preemption.Receiver(
      lambda line, code, asked=False: exits.append(line) or asked_for.append(
          asked), slurm.requeue_outcome, clock=lambda: now[0])
  now = [0.0]
  watcher = preemption.PreemptionWatcher(progress_fn=lambda: progress[0])
  receiver.watcher = watcher
  receiver.configure(42, 25.0, training=True)
  with watcher.armed():
    receiver.handle(signal.SIGTERM)
    now[0] = 0.5
    receiver.handle(signal.SIGTERM)  # The same delivery: `timeout`'s.
    assert not exits
    now[0] = 30.0
    receiver.expire()
    progress[0] = (510, 510)  # The loop came back and saved for SIGTERM.
    receiver.handle(signal.SIGINT)
    progress[0] = (3, None)
    receiver.handle(signal.SIGINT)
  assert exits == [
      "preempted at step 507: training did not stop within 25 s of SIGTERM "
      "(`trainer.preemption_grace_seconds`); the checkpoint of step 500 was "
      "saved before SIGTERM; steps 501-507 are not saved; run the same "
      "command again to resume from step 500 (exit code 42)",
      "preempted at step 510: a second signal (SIGINT) ended it at once; "
      "the checkpoint of step 510 was saved for SIGTERM; run the same "
      "command again to resume from step 510 (exit code 42)",
      "preempted at step 3: a second signal (SIGINT) ended it at once; no "
      "checkpoint is saved yet; steps 1-3 are not saved; run the same "
      "command again to start over (exit code 42)"]
  assert asked_for == [False] * 3  # SIGTERM came first: a preemption.


def test_receiver_ends_a_wait_for_input_once_its_step_is_saved():
  # The stall watch of the tf.data service saved the step reached while the
  # loop waits for a batch: the signal's exit does not wait for the loop.
  progress = [(106, 100)]
  exits = []
  receiver = preemption.Receiver(
      lambda line, code, asked=False: exits.append((line, code, asked)),
      slurm.requeue_outcome, clock=lambda: 0.0)
  watcher = preemption.PreemptionWatcher(progress_fn=lambda: progress[0])
  receiver.watcher = watcher
  receiver.configure(42, 25.0, training=True)
  with watcher.armed():
    receiver.handle(signal.SIGTERM)
    assert not exits
    progress[0] = (106, 106)  # Saved while the loop waits.
    receiver.end_waiting("no batch from the tf.data service for 31 s (WHY)")
  assert exits == [(
      "preempted at step 106: no batch from the tf.data service for 31 s "
      "(WHY); the checkpoint of step 106 was saved for SIGTERM; run the same "
      "command again to resume from step 106 (exit code 42)", 42, False)]


def test_receiver_after_training_names_the_final_checkpoint():
  receiver, watcher = _receiver(progress=(100, 100))
  receiver.configure(42, 3.0, training=True)
  with watcher.armed():
    pass
  with pytest.raises(_Exited) as exited:
    receiver.handle(signal.SIGTERM)
  assert exited.value.args[0] == (
      "preempted by SIGTERM after training: the final checkpoint (step 100) "
      "is saved; run the same command again to finish (exit code 42)")


def test_sigusr1_before_training_waits_for_the_first_loop(monkeypatch):
  monkeypatch.delenv("SLURM_JOB_ID", raising=False)
  receiver = preemption.Receiver(lambda *args: pytest.fail(f"exit {args}"),
                                 slurm.requeue_outcome)
  receiver.configure(42, 3.0, training=True)
  receiver.handle(signal.SIGUSR1)  # Building the model: nothing to save.
  watcher = preemption.PreemptionWatcher()
  receiver.attach(watcher)  # Training starts; the first check stops it.
  assert watcher.received and watcher.agreed(strategy=None)
  stop = watcher.stopped(100, agreed=True)
  assert (stop.step, stop.requeue, stop.exit_code) == (100, True, 42)
  assert stop.line(slurm.requeue_outcome(True)) == (
      "preempted at step 100 by SIGUSR1 (the time limit is near): checkpoint "
      "saved; not in a SLURM job, so nothing to requeue: run the same "
      "command again, to resume from step 100 (exit code 42)")


def test_sigusr1_in_a_task_that_does_not_train_changes_nothing():
  receiver, _ = _receiver()
  receiver.configure(42, 3.0, training=False)
  receiver.handle(signal.SIGUSR1)  # A ps, a worker server, an evaluator.
  with pytest.raises(_Exited) as exited:
    receiver.handle(signal.SIGTERM)  # The chief's requeue.
  assert exited.value.args == (
      "preempted by SIGTERM: nothing to save; run the same command again "
      "(exit code 42)", 42, False)


def test_sigusr1_after_training_requeues_at_once(monkeypatch):
  monkeypatch.setenv("SLURM_JOB_ID", "5")
  receiver, watcher = _receiver(progress=(100, 100))
  watcher.is_chief = False  # The chief runs `scontrol requeue`.
  receiver.configure(42, 3.0, training=True)
  with watcher.armed():
    pass
  with pytest.raises(_Exited) as exited:
    receiver.handle(signal.SIGUSR1)
  line, code, asked = exited.value.args
  assert not asked  # SLURM's, not the user's.
  assert code == 42 and line() == (
      "preempted by SIGUSR1 after training: the final checkpoint (step 100) "
      "is saved; the chief requeues SLURM job 5, to finish (exit code 42)")


def test_sigusr1_while_training_saves_and_asks_for_a_requeue():
  receiver, watcher = _receiver(progress=(10, 8))
  receiver.configure(42, 3.0, training=True)
  with watcher.armed():
    receiver.handle(signal.SIGUSR1)
    assert watcher.agreed(strategy=None)
  assert watcher.stopped(10, agreed=True).requeue
  # SIGTERM alone asks for none.
  receiver, watcher = _receiver(progress=(10, 8))
  receiver.configure(42, 3.0, training=True)
  with watcher.armed():
    receiver.handle(signal.SIGTERM)
    assert watcher.agreed(strategy=None)
  assert not watcher.stopped(10, agreed=True).requeue


def test_the_requeues_sigterm_after_the_save_keeps_the_tasks_own_line(
    monkeypatch):
  # A worker saved for SIGUSR1 and is on its way out when the chief's
  # requeue sends SIGTERM to every task: its line stays the requeue line.
  monkeypatch.setenv("SLURM_JOB_ID", "7")
  receiver, watcher = _receiver(progress=(1000, 1000))
  watcher.is_chief = False
  receiver.configure(42, 25.0, training=True)
  with watcher.armed():
    receiver.handle(signal.SIGUSR1)
    assert watcher.agreed(strategy=None)
  stop = watcher.stopped(1000, agreed=True)
  with pytest.raises(_Exited) as exited:
    receiver.handle(signal.SIGTERM)
  line, code, asked = exited.value.args
  assert not asked  # SLURM's, not the user's.
  assert code == 42 and line() == stop.line(
      "the chief requeues SLURM job 7") == (
          "preempted at step 1000 by SIGUSR1 (the time limit is near): "
          "checkpoint saved; the chief requeues SLURM job 7, to resume from "
          "step 1000 (exit code 42)")
  # A second Ctrl-C after a save for the first: the same saved line.
  receiver, watcher = _receiver(progress=(10, 10))
  receiver.configure(42, 25.0, training=True)
  with watcher.armed():
    receiver.handle(signal.SIGINT)
  stop = watcher.stopped(10)
  with pytest.raises(_Exited) as exited:
    receiver.handle(signal.SIGTERM)
  assert exited.value.args == (str(stop), 42, True)  # Asked for: Ctrl-C.


class _OtherWorkerGotSigusr1:
  """The all-reduce of `PreemptionWatcher.agreed` where another worker (the
  chief) got SIGUSR1 and this one got nothing."""

  def experimental_distribute_values_from_function(self, value_fn):
    return value_fn(None)

  def reduce(self, unused_op, flags, axis):
    assert axis is None
    return flags + tf.constant([1.0, 1.0])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_a_worker_stopped_for_anothers_keeps_the_saved_line(
    monkeypatch, signum):
  # The chief got SIGUSR1; both workers saved step 100 and are on their way
  # out when the chief's requeue sends SIGTERM to every task. Worker 1 got
  # no signal of its own before it: its line is still its save's.
  monkeypatch.setenv("SLURM_JOB_ID", "7")
  receiver, watcher = _receiver(progress=(100, 100))
  watcher.is_chief, watcher.num_workers = False, 2
  receiver.configure(42, 25.0, training=True)
  with pytest.raises(errors.Preempted):
    with watcher.armed():
      assert watcher.agreed(_OtherWorkerGotSigusr1())
      raise watcher.stopped(100, agreed=True)
  assert not watcher.trained and not watcher.received
  with pytest.raises(_Exited) as exited:
    receiver.handle(signum)
  line, code, asked = exited.value.args
  assert (code, asked) == (42, False)
  assert line() == (
      "preempted at step 100 by SIGUSR1 (the time limit is near): checkpoint "
      "saved; the chief requeues SLURM job 7, to resume from step 100 (exit "
      "code 42)")


@pytest.mark.parametrize("signals, asked", [
    ((signal.SIGINT,), True), ((signal.SIGTERM,), False),
    ((signal.SIGINT, signal.SIGTERM), True),
    ((signal.SIGTERM, signal.SIGINT), False)])
def test_a_stop_is_asked_for_where_ctrl_c_came_first(signals, asked):
  watcher = preemption.PreemptionWatcher()
  for signum in signals:
    watcher.defer(signum)
  assert watcher.stopped(10).asked == asked
