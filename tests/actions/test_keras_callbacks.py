"""The Keras callbacks run as a loop hook and an eval action: the calls in
`fit`'s order with their logs, `model.stop_training` honoured, and the
callbacks that cannot work refused in one line."""

import csv
import json
import os
import pty
import re
import subprocess
import sys

import pytest
import tf_keras

from trainer import config as config_lib
from trainer import errors
from trainer.actions import keras_callbacks
from trainer.loop.control import hooks as loop_hooks

import helpers


class _Recorder(tf_keras.callbacks.Callback):
  """Records every call it gets, with its arguments."""

  def __init__(self):
    super().__init__()
    self.calls = []

  def on_train_begin(self, logs=None):
    self.calls.append(("train_begin", logs))

  def on_train_end(self, logs=None):
    self.calls.append(("train_end", logs))

  def on_epoch_begin(self, epoch, logs=None):
    self.calls.append(("epoch_begin", epoch))

  def on_epoch_end(self, epoch, logs=None):
    self.calls.append(("epoch_end", epoch, logs))

  def on_train_batch_begin(self, batch, logs=None):
    self.calls.append(("batch_begin", batch))

  def on_train_batch_end(self, batch, logs=None):
    self.calls.append(("batch_end", batch, logs))

  def on_test_end(self, logs=None):
    self.calls.append(("test_end", logs))


def _model():
  return tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])


def _result(loss, learning_rate=None):
  return loop_hooks.LoopResult(num_steps=10, seconds=1.0, loss=loss,
                               learning_rate=learning_rate,
                               output={"loss": loss},
                               read_metrics=lambda: {})


def _run(hook, steps, step_holder, summary_at=(), eval_at=()):
  """Drives `hook` as the controller and the reporter do: loops of 10
  steps, a summary (loss and accuracy) and an evaluation where asked."""
  for step in steps:
    if hook.stop_reason():
      return step - 10
    hook.before_loop(step - 10)
    step_holder["step"] = step
    if step in summary_at:
      hook.train_summary(step, {"loss": step / 100, "accuracy": 0.5})
    hook.after_loop(step, _result(step / 100))
    if step in eval_at:
      hook({"loss": 1.0 / step, "accuracy": step / 100})
  return steps[-1]


def test_calls_follow_fits_order_with_the_loops_logs():
  recorder = _Recorder()
  model = _model()
  steps = {"step": 0}
  hook = keras_callbacks.KerasCallbacks(
      [recorder], model, lambda: steps["step"], train_steps=30,
      epoch_steps=20, evaluating=True)
  assert recorder.model is model
  assert recorder.params == {"verbose": 0, "epochs": 2, "steps": 20}
  hook.train_begin(0)
  _run(hook, [10, 20, 30], steps, summary_at=(20, 30), eval_at=(20, 30))
  hook.train_end()
  summary = {"loss": 0.2, "accuracy": 0.5}
  assert recorder.calls == [
      ("train_begin", {}), ("epoch_begin", 0),
      ("batch_begin", 0), ("batch_end", 9, {"loss": 0.1}),
      ("batch_begin", 10), ("batch_end", 19, summary),
      ("test_end", {"loss": 0.05, "accuracy": 0.2}),
      ("epoch_end", 0, {**summary, "val_loss": 0.05, "val_accuracy": 0.2}),
      ("epoch_begin", 1),
      ("batch_begin", 20), ("batch_end", 29, {"loss": 0.3,
                                              "accuracy": 0.5}),
      ("test_end", {"loss": 1 / 30, "accuracy": 0.3}),
      ("epoch_end", 1, {"loss": 0.3, "accuracy": 0.5,
                        "val_loss": 1 / 30, "val_accuracy": 0.3}),
      ("train_end", {"loss": 0.3, "accuracy": 0.5})]


def test_in_train_mode_an_epoch_ends_at_each_summary(tmp_path):
  path = tmp_path / "log.csv"
  steps = {"step": 0}
  recorder = _Recorder()
  hook = keras_callbacks.KerasCallbacks(
      [tf_keras.callbacks.CSVLogger(str(path)), recorder], _model(),
      lambda: steps["step"], train_steps=40, epoch_steps=20,
      evaluating=False)
  hook.train_begin(0)
  _run(hook, [10, 20, 30, 40], steps, summary_at=(20, 40))
  hook.train_end()
  # The epoch ends after its last batch, as in `fit`; none begins after
  # the last.
  assert [call[:2] for call in recorder.calls] == [
      ("train_begin", {}), ("epoch_begin", 0), ("batch_begin", 0),
      ("batch_end", 9), ("batch_begin", 10), ("batch_end", 19),
      ("epoch_end", 0), ("epoch_begin", 1), ("batch_begin", 20),
      ("batch_end", 29), ("batch_begin", 30), ("batch_end", 39),
      ("epoch_end", 1), ("train_end", {"loss": 0.4, "accuracy": 0.5})]
  with open(path, newline="") as f:
    # CSVLogger adds `val_` columns where the first epoch has none, as in
    # `fit` without validation data.
    assert list(csv.reader(f)) == [
        ["epoch", "accuracy", "loss", "val_accuracy", "val_loss"],
        ["0", "0.5", "0.2", "NA", "NA"], ["1", "0.5", "0.4", "NA", "NA"]]


def test_early_stopping_stops_the_loop_and_says_which_callback():
  model = _model()
  steps = {"step": 0}
  stopper = tf_keras.callbacks.EarlyStopping(monitor="val_accuracy",
                                             mode="max", patience=1,
                                             min_delta=0.5)
  hook = keras_callbacks.KerasCallbacks(
      [stopper], model, lambda: steps["step"], train_steps=100,
      epoch_steps=10, evaluating=True)
  hook.train_begin(0)
  stopped_at = _run(hook, list(range(10, 101, 10)), steps,
                    eval_at=range(10, 101, 10))
  # The first evaluation sets the best; the second does not improve on it
  # by 0.5, and patience is 1.
  assert stopped_at == 20 and model.stop_training
  assert hook.stop_reason() == "EarlyStopping set model.stop_training"
  assert stopper.stopped_epoch == 1


def test_lambda_callback_batch_hooks_run_at_each_loop():
  seen = []
  hook = keras_callbacks.KerasCallbacks(
      [tf_keras.callbacks.LambdaCallback(
          on_batch_end=lambda batch, logs: seen.append((batch, logs)))],
      _model(), lambda: 0, train_steps=20, epoch_steps=20, evaluating=True)
  hook.after_loop(10, _result(0.5, learning_rate=0.25))
  assert seen == [(9, {"loss": 0.5, "learning_rate": 0.25})]


def test_a_function_returning_callbacks_is_called():
  recorder = _Recorder()
  assert keras_callbacks.check(lambda: [recorder]) == (recorder,)
  assert keras_callbacks.check(recorder) == (recorder,)
  assert keras_callbacks.check(None) == ()


class _Keras3Callback:
  pass


_Keras3Callback.__module__ = "keras.src.callbacks.callback"


@pytest.mark.parametrize("callback, message", [
    (tf_keras.callbacks.ReduceLROnPlateau(),
     "`trainer.callbacks`: ReduceLROnPlateau cannot work here: it sets "
     "`model.optimizer.lr`, and the optimizer is the trainer's, not the "
     "model's; use a `learning_rate.*` schedule."),
    (tf_keras.callbacks.BackupAndRestore("/tmp/unused"),
     "`trainer.callbacks`: BackupAndRestore cannot work here: a resumed run "
     "restores model, optimizer, step and input position from the "
     "checkpoints in `model_dir`, never from its backup."),
    (tf_keras.callbacks.EarlyStopping(restore_best_weights=True),
     "`trainer.callbacks`: EarlyStopping(restore_best_weights=True) would "
     "change the weights after the last checkpoint is saved; use "
     "`best_checkpoint.metric` to keep the best weights."),
    (_Keras3Callback(),
     "`trainer.callbacks`: _Keras3Callback is a Keras 3 callback "
     "(`keras.callbacks`); this trainer runs tf_keras (Keras 2): use "
     "`tf_keras.callbacks._Keras3Callback`, or subclass "
     "`tf_keras.callbacks.Callback`."),
    (object(),
     "`trainer.callbacks`: object is not a Keras callback (builtins."
     "object): subclass `tf_keras.callbacks.Callback`."),
])
def test_what_cannot_work_is_refused_in_one_line(callback, message):
  with pytest.raises(errors.ConfigError) as raised:
    keras_callbacks.check([callback])
  assert str(raised.value) == message


_USER_MODULE = '''
import json

import gin
import tf_keras


@gin.configurable
class Recorder(tf_keras.callbacks.Callback):
  """A user's own callback: every call, one JSON line."""

  def __init__(self, path):
    super().__init__()
    self.path = path

  def _write(self, *call):
    with open(self.path, "a") as f:
      f.write(json.dumps(call) + "\\n")

  def on_train_begin(self, logs=None):
    self._write("train_begin", self.params, type(self.model).__name__)

  def on_train_batch_end(self, batch, logs=None):
    self._write("batch_end", batch, logs["loss"])

  def on_test_end(self, logs=None):
    self._write("test_end", logs)

  def on_train_end(self, logs=None):
    self._write("train_end")


@gin.configurable
def mark_done(logs):
  open("done", "w").close()
'''

_USER_GIN = '''
import my_callbacks

trainer.callbacks = [@CSVLogger(), @EarlyStopping(), @LambdaCallback(),
                     @Recorder()]
CSVLogger.filename = "keras_log.csv"
CSVLogger.append = True
# The second evaluation cannot improve on the first by 0.5: it stops there.
EarlyStopping.monitor = "val_accuracy"
EarlyStopping.mode = "max"
EarlyStopping.patience = 1
EarlyStopping.min_delta = 0.5
LambdaCallback.on_train_end = @mark_done
Recorder.path = "calls.jsonl"
'''


def _read_csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _run_on_a_terminal(args, cwd):
  """Runs train.py with stdout on a pseudo-terminal; returns what the
  terminal got, the exit code and stderr."""
  primary, secondary = pty.openpty()
  process = subprocess.Popen(
      [sys.executable, helpers.TRAIN_PY, *args], cwd=cwd, stdout=secondary,
      stderr=subprocess.PIPE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
  os.close(secondary)
  shown = b""
  while True:
    try:
      chunk = os.read(primary, 65536)
    except OSError:  # EIO: the process closed the terminal.
      break
    if not chunk:
      break
    shown += chunk
  os.close(primary)
  process.wait(timeout=300)
  stderr = process.stderr.read().decode()
  return shown.decode(), process.returncode, stderr


@pytest.mark.slow
def test_a_fit_users_callbacks_metrics_csv_and_bar_through_train_py(
    tmp_path):
  (tmp_path / "my_callbacks.py").write_text(_USER_MODULE)
  (tmp_path / "callbacks.gin").write_text(_USER_GIN)
  args = ["--gin_file=gin/digits.gin", "--gin_file=callbacks.gin",
          "--gin_param=trainer.train_steps=600",
          "--gin_param=trainer.validation_interval=200",
          "--gin_param=trainer.checkpoint_interval=200",
          "--mode=train_and_eval", "--model_dir=run"]
  # Not a terminal (a pipe): today's lines, a loop each.
  first = helpers.run_cli(args, cwd=str(tmp_path))
  assert first.returncode == 0, first.stderr
  assert ("train | stopping early at step 400: EarlyStopping set "
          "model.stop_training") in first.stdout
  assert "\r" not in first.stdout
  assert [line.split("|")[1].strip() for line in first.stdout.splitlines()
          if line.startswith("train | step")] == [
              f"step {step}/600" for step in (100, 200, 300, 400)]
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 400
  rows = _read_csv(tmp_path / "run" / "metrics.csv")
  assert [(row["step"], row["split"]) for row in rows] == [
      ("100", "train"), ("200", "train"), ("200", "eval"), ("300", "train"),
      ("400", "train"), ("400", "eval")]
  # Keras's CSVLogger: one row an evaluation, its results as `val_`.
  keras_rows = _read_csv(tmp_path / "keras_log.csv")
  assert [row["epoch"] for row in keras_rows] == ["0", "1"]
  assert [row["val_accuracy"] for row in keras_rows] == [
      row["accuracy"] for row in rows if row["split"] == "eval"]
  assert [row["loss"] for row in keras_rows] == [
      row["loss"] for row in rows
      if row["split"] == "train" and row["step"] in ("200", "400")]
  calls = [json.loads(line)
           for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
  assert calls[0] == ["train_begin", {"verbose": 0, "epochs": 3,
                                      "steps": 200}, "Sequential"]
  assert [call[1] for call in calls if call[0] == "batch_end"] == [
      99, 199, 299, 399]
  assert [call[0] for call in calls[-2:]] == ["test_end", "train_end"]
  assert (tmp_path / "done").exists()  # LambdaCallback's on_train_end.

  # A run killed after writing rows past its last checkpoint (400).
  with open(tmp_path / "run" / "metrics.csv", "a") as f:
    f.write("500,1.0,train," + ",".join(["123"] * (len(rows[0]) - 3)) +
            "\n")
  # Resumed on a terminal: the bar, and no `train |` line; Keras's
  # EarlyStopping starts again (its state is not in the checkpoint).
  shown, code, stderr = _run_on_a_terminal(args, str(tmp_path))
  assert code == 0, stderr
  assert re.search(r"\r\x1b\[Kstep 500/600 \[#+\.+\]  83% \| [0-9.]+ "
                   r"steps/s \| loss [0-9.]+ \| ETA ", shown)
  assert re.search(r"\r\x1b\[Kstep 600/600 \[#+\] 100% \| ", shown)
  assert "train | step" not in shown
  assert "\neval | step 600 | accuracy " in shown
  rows = _read_csv(tmp_path / "run" / "metrics.csv")
  assert [(row["step"], row["split"]) for row in rows] == [
      ("100", "train"), ("200", "train"), ("200", "eval"), ("300", "train"),
      ("400", "train"), ("400", "eval"), ("500", "train"), ("600", "train"),
      ("600", "eval")]
  assert rows[6]["loss"] != "123"


def test_evaluations_between_train_summaries_are_refused_with_callbacks():
  # The epoch's logs would hold an older summary's values (a user's
  # CSVLogger fixed its columns from a first epoch without them).
  settings = dict(train_steps=200, steps_per_loop=25, summary_interval=100,
                  validation_interval=50)
  with pytest.raises(errors.ConfigError) as raised:
    config_lib.TrainerConfig(callbacks=[_Recorder()], **settings)
  # Gin adds a line naming the configurable.
  assert str(raised.value).splitlines()[0] == (
      "`trainer.callbacks` end an epoch at each evaluation (every 50 steps) "
      "with the train summary's values, written every 100 steps: make "
      "`trainer.summary_interval` divide `trainer.validation_interval`.")
  config_lib.TrainerConfig(**settings)  # Without callbacks nothing is refused.
  config_lib.TrainerConfig(callbacks=[_Recorder()],
                           **dict(settings, summary_interval=50))
