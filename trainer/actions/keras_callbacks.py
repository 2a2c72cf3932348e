"""The Keras callbacks of a `model.fit` user (`trainer.callbacks`), run by
the loop: a loop hook and an eval action.

`fit` calls its callbacks at its batches and epochs. Here a loop of
`trainer.steps_per_loop` steps plays the batch (one `tf.function` call, as
`fit`'s `steps_per_execution`), and an evaluation plays the end of an
epoch, as `fit` evaluates its `validation_data` there:

    on_train_begin(logs)            before the first loop (`train_begin`)
    on_epoch_begin(epoch)           then, and after every epoch's end
    on_train_batch_begin(batch)     before every loop
    on_train_batch_end(batch, logs) after every loop: `batch` is the
                                    0-based index of its last step (the
                                    global step - 1); logs: the loop's
                                    mean `loss`, a scheduled
                                    `learning_rate`, and at a summary step
                                    the train summary's scalars
    on_test_end(logs)               after every evaluation, with its
                                    results (`<set>/<metric>` for named
                                    sets)
    on_epoch_end(epoch, logs)       then: the last train summary's scalars
                                    and the results as `val_<name>`, as
                                    `fit` names its validation metrics
    on_train_end(logs)              after the last evaluation of a run that
                                    ends well (`train_end`)

In `train` mode (no evaluation) an epoch ends at every train summary
(`trainer.summary_interval`), with its scalars. `params` are `{"verbose":
0, "epochs": the evaluations (or summaries) up to train_steps, "steps":
the steps between them}`. A callback that sets `model.stop_training`
(`EarlyStopping`, `TerminateOnNaN`, one's own) stops training before the
next loop, with a checkpoint at the step reached, as `early_stopping.*`
does.

The callbacks' own state (`EarlyStopping`'s `wait` and `best`, a
`CSVLogger`'s open file) is not in the checkpoint: a resumed run starts
them again, as `fit` in a new process does; `early_stopping.*` keeps its
record in `model_dir`.
"""

import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import gin
import tf_keras

from trainer import errors
from trainer.actions import metrics_csv
from trainer.loop.control import hooks as loop_hooks

# The callbacks that cannot work here, and why (each measured in a run of
# the digits Task, see docs/features.md): refused when the config is read.
UNSUPPORTED = {
    # Measured: `AttributeError: 'NoneType' object has no attribute 'lr'`
    # at the first evaluation.
    "ReduceLROnPlateau": (
        "it sets `model.optimizer.lr`, and the optimizer is the trainer's, "
        "not the model's; use a `learning_rate.*` schedule"),
    # Measured: `ValueError: Optimizer must have a "lr" attribute.`
    "LearningRateScheduler": (
        "it sets `model.optimizer.lr`, and the optimizer is the trainer's, "
        "not the model's; use a `learning_rate.*` schedule"),
    # Measured: prints nothing (`params["verbose"]` is 0).
    "ProgbarLogger": (
        "the progress bar (on a terminal) or the `train |` lines report "
        "progress already"),
    # Measured: killed after the evaluation of step 300 (its backup of
    # step 300, the newest checkpoint of step 200), the resumed run had the
    # checkpoint's weights, with it as without it: a backup kept for
    # nothing.
    "BackupAndRestore": (
        "a resumed run restores model, optimizer, step and input position "
        "from the checkpoints in `model_dir`, never from its backup"),
}

# Every callback class of tf_keras, configurable in gin by its name
# (`trainer.callbacks = [@CSVLogger()]`), as `@tf_keras.callbacks.<Name>`
# too; the unsupported ones so that their error is ours.
for _name in ("CSVLogger", "EarlyStopping", "LambdaCallback",
              "ModelCheckpoint", "TensorBoard", "TerminateOnNaN",
              "RemoteMonitor", "History", *UNSUPPORTED):
  gin.external_configurable(getattr(tf_keras.callbacks, _name),
                            module="tf_keras.callbacks")


def check(callbacks: Any) -> tuple:
  """Returns `trainer.callbacks` as a tuple of callbacks.

  Args:
    callbacks: None, a callback, a list of them, or a function returning
      one or a list (called here, with no arguments).

  Raises:
    errors.ConfigError: For what is not a tf_keras callback (a Keras 3 one
      named as such), or one that cannot work here (`UNSUPPORTED`).
  """
  if callbacks is None:
    return ()
  if callable(callbacks) and not isinstance(callbacks,
                                            tf_keras.callbacks.Callback):
    callbacks = callbacks()
  if not isinstance(callbacks, (list, tuple)):
    callbacks = [callbacks]
  for callback in callbacks:
    name = type(callback).__name__
    if not isinstance(callback, tf_keras.callbacks.Callback):
      keras3 = type(callback).__module__.split(".")[0] == "keras"
      raise errors.ConfigError(
          f"`trainer.callbacks`: {name} is "
          + ("a Keras 3 callback (`keras.callbacks`); this trainer runs "
             "tf_keras (Keras 2): use `tf_keras.callbacks." + name + "`, "
             "or subclass `tf_keras.callbacks.Callback`."
             if keras3 else
             f"not a Keras callback ({type(callback).__module__}.{name}): "
             "subclass `tf_keras.callbacks.Callback`."))
    for unsupported, why in UNSUPPORTED.items():
      if isinstance(callback, getattr(tf_keras.callbacks, unsupported)):
        raise errors.ConfigError(
            f"`trainer.callbacks`: {name} cannot work here: {why}.")
    if (isinstance(callback, tf_keras.callbacks.EarlyStopping) and
        callback.restore_best_weights):
      raise errors.ConfigError(
          "`trainer.callbacks`: EarlyStopping(restore_best_weights=True) "
          "would change the weights after the last checkpoint is saved; "
          "use `best_checkpoint.metric` to keep the best weights.")
  return tuple(callbacks)


class KerasCallbacks(loop_hooks.LoopHook):
  """Runs Keras callbacks at the loop's cadence (a loop hook), after every
  evaluation (an eval action, `__call__`) and at every train summary
  (`train_summary`); see the module's docstring for when each method is
  called and with which logs.
  """

  def __init__(self, callbacks: Sequence[tf_keras.callbacks.Callback],
               model: tf_keras.Model, step_fn: Callable[[], int], *,
               train_steps: int, epoch_steps: int, evaluating: bool):
    """Gives the callbacks the model and the run's `params`.

    Args:
      callbacks: The callbacks (`check`'s).
      model: The Task's model: `model.stop_training` is watched.
      step_fn: Returns the global step, for an evaluation's epoch.
      train_steps: The final step.
      epoch_steps: The steps of an epoch: between evaluations
        (`evaluating`), or between train summaries.
      evaluating: Whether epochs end at evaluations (`train_and_eval`),
        or at train summaries (`train`).
    """
    self._callbacks = tuple(callbacks)
    self._model = model
    self._step_fn = step_fn
    self._train_steps = train_steps
    self._epoch_steps = epoch_steps
    self._evaluating = evaluating
    # Only the callbacks with batch hooks are called at every loop.
    self._batch_callbacks = tuple(
        callback for callback in self._callbacks
        if callback._implements_train_batch_hooks())  # pylint: disable=protected-access
    self._train_logs: Dict[str, float] = {}  # The last train summary's.
    self._summary_step = -1
    self._stopped_by: Optional[str] = None
    params = {"verbose": 0, "epochs": math.ceil(train_steps / epoch_steps),
              "steps": epoch_steps}
    model.stop_training = False
    for callback in self._callbacks:
      callback.set_model(model)
      callback.set_params(params)

  def _call(self, callbacks: Sequence[tf_keras.callbacks.Callback],
            method: str, *args) -> None:
    """Calls `method` of each callback; notes the first that asks to stop."""
    for callback in callbacks:
      getattr(callback, method)(*args)
      if self._model.stop_training and self._stopped_by is None:
        self._stopped_by = type(callback).__name__

  def train_begin(self, step: int) -> None:
    """Before training resumes or starts at `step`."""
    self._call(self._callbacks, "on_train_begin", {})
    self._call(self._callbacks, "on_epoch_begin", step // self._epoch_steps,
               {})

  def train_end(self) -> None:
    """After the last loop (and evaluation) of a run that ends well."""
    self._call(self._callbacks, "on_train_end", dict(self._train_logs))

  def before_loop(self, step: int) -> None:
    self._call(self._batch_callbacks, "on_train_batch_begin", step, {})

  def after_loop(self, step: int, result: loop_hooks.LoopResult) -> None:
    logs = {}
    if step == self._summary_step:
      logs.update(self._train_logs)
    if result.loss is not None:
      logs["loss"] = float(result.loss)
    if result.learning_rate is not None:
      logs["learning_rate"] = float(result.learning_rate)
    self._call(self._batch_callbacks, "on_train_batch_end", step - 1, logs)
    if step == self._summary_step and not self._evaluating:
      # In `train` mode a summary ends an epoch, after its last batch.
      self._end_epoch(step, dict(self._train_logs))

  def train_summary(self, step: int, scalars: Mapping[str, Any]) -> None:
    """A train summary written at `step` (by the reporter, in its
    `after_loop`, before this hook's): the logs from now on."""
    self._summary_step = step
    self._train_logs = metrics_csv.scalars(scalars)

  def __call__(self, output: Mapping[str, Any]) -> None:
    """Eval action: `on_test_end` with the results, then the epoch's end."""
    results = metrics_csv.scalars(output)
    self._call(self._callbacks, "on_test_end", dict(results))
    logs = dict(self._train_logs)
    logs.update({f"val_{name}": value for name, value in results.items()})
    self._end_epoch(self._step_fn(), logs)

  def _end_epoch(self, step: int, logs: Dict[str, float]) -> None:
    """Ends the epoch that `step` ends (the last, cut short, included)."""
    epoch = max(math.ceil(step / self._epoch_steps) - 1, 0)
    self._call(self._callbacks, "on_epoch_end", epoch, logs)
    if not self._model.stop_training and step < self._train_steps:
      self._call(self._callbacks, "on_epoch_begin", epoch + 1, {})

  def stop_reason(self) -> Optional[str]:
    """Why training stops: a callback set `model.stop_training`."""
    if not self._model.stop_training:
      return None
    return f"{self._stopped_by or 'a callback'} set model.stop_training"
