"""`Controller`: Orbit's outer loop with a lean per-loop path.

Everything but the per-loop hot path is `orbit.Controller`'s own: `evaluate`,
eval summaries and actions. `train` and `_train_n_steps` are replaced
because Orbit's reads the global step from the device three times, converts
every output to NumPy, writes and flushes every output as a summary on every
loop and prints an unformatted dict; at `steps_per_loop=1` that kept raw
Orbit at 0.42-0.61x of a bare `tf.function` loop on this stack
(shared/NOTES.md). Here a loop costs one `tf.function` call, one small read
(the loop's status), and summaries only every `summary_interval` steps
(scripts/benchmark.py measures the result). Checkpoints are saved at
multiples of `checkpoint_interval`. `train_and_evaluate` is replaced to
evaluate at multiples of the interval and to stop early; `restore_checkpoint`
to fall back past damaged checkpoints.
"""

import contextlib
import os
import time
from typing import Callable, Dict, Iterator, Optional

from absl import logging
import numpy as np
import orbit
import tensorflow as tf

from trainer import checkpoints
from trainer import console
from trainer import errors
from trainer import preemption as preemption_lib
from trainer import profiler
from trainer import summaries


# Above this share of loop time spent waiting for the input pipeline,
# training is reported as input-bound.
INPUT_BOUND_FRACTION = 0.2


class Controller(orbit.Controller):
  """`orbit.Controller` that prints a progress line per loop.

  Train summaries (mean loss, every task metric, the gradient norm, the
  learning rate, steps/s, examples/s, the share of time spent waiting for
  input and what `scalars_fn` adds) are written
  to `train_summary_writer` every `summary_interval` steps and at the final
  step, `train_steps`; a scheduled learning rate also after every loop.
  """

  def __init__(self, *, train_steps: int = 0, global_batch_size: int = 0,
               checkpoint_interval: int = 1,
               train_summary_writer: Optional[summaries.Writer] = None,
               scalars_fn: Optional[Callable[[], Dict[str, float]]] = None,
               partial_restore: bool = False,
               restore_dir: Optional[str] = None,
               on_nonfinite: str = "stop", max_rollbacks: int = 0,
               finite_fn: Optional[Callable[[], bool]] = None,
               resume_input_fn: Optional[Callable[[int], None]] = None,
               preemption: Optional[preemption_lib.PreemptionWatcher] = None,
               preemption_exit_code: int = 42, num_workers: int = 1,
               stop_fn: Optional[Callable[[], Optional[str]]] = None,
               profile: Optional[profiler.ProfileWindow] = None,
               **kwargs):
    """Builds the controller; restores the newest checkpoint if there is one.

    Args:
      train_steps: The final step, for the progress line's ETA.
      checkpoint_interval: Save when the step reaches a multiple of this, and
        always at the end of training.
      global_batch_size: Examples per step, for examples/s.
      train_summary_writer: Where train summaries go; None for none.
      scalars_fn: Returns more train scalars (learning rate, loss scale).
      partial_restore: Restore only what this run built (eval modes), without
        warning about the rest of the checkpoint.
      restore_dir: Where to look for the checkpoint to restore when it is not
        where this process saves (a non-chief worker saves to a temporary
        directory but restores the chief's checkpoints); None for the
        checkpoint manager's directory.
      on_nonfinite: What a non-finite training loss does: "stop" raises
        `errors.NonFiniteError` naming the step; "rollback" restores the
        newest checkpoint and skips the offending batch.
      max_rollbacks: Rollbacks allowed before stopping anyway.
      finite_fn: Returns whether every checkpointed variable is finite;
        checked before each save, so no checkpoint holds NaN or Inf.
      resume_input_fn: Called with the restored step after a rollback when
        the input position is not part of the checkpoint.
      preemption: Watches for SIGTERM/SIGINT; checked after every loop and
        every evaluation between loops. Outside training (before it, in the
        final evaluation) a signal ends the process at once.
      preemption_exit_code: Carried by `errors.Preempted`.
      num_workers: Workers that must agree on stopping for a preemption.
      stop_fn: Returns why training should stop before `train_steps` (early
        stopping), or None; asked before every loop.
      profile: Traces a window of steps; loops are cut at its edges.
      **kwargs: Passed to `orbit.Controller`.
    """
    self._train_steps = train_steps
    self._checkpoint_interval = checkpoint_interval
    self._global_batch_size = global_batch_size
    self._train_summary_writer = train_summary_writer
    self._scalars_fn = scalars_fn
    self._partial_restore = partial_restore
    self._restore_dir = restore_dir
    self._on_nonfinite = on_nonfinite
    self._max_rollbacks = max_rollbacks
    self._rollbacks = 0
    self._discard_at = None  # The step whose batch a rollback skips.
    self._finite_fn = finite_fn
    self._resume_input_fn = resume_input_fn
    self._preemption = preemption
    self._preemption_exit_code = preemption_exit_code
    self._num_workers = num_workers
    self._learning_rate = None  # The last one written.
    self._step_tensors = {}  # Steps per loop -> the same as a tensor.
    self._input_bound = False  # Whether training was found input-bound.
    self._stop_fn = stop_fn
    self._profile = profile
    self.stop_reason: Optional[str] = None  # Why training stopped early.
    self.restored_path: Optional[str] = None  # The checkpoint restored last.
    self._step = None  # Python mirror of `global_step`, set at restore.
    # Every worker must take the same save decisions, so they are based on
    # the restored step, not on what this process's directory holds.
    self._last_saved_step = None
    self._newest_step = None  # The newest checkpoint's step; None: none.
    self._window_steps = 0  # Steps and loop seconds since the last summary.
    self._window_seconds = 0.0
    self._run_start = None  # (step, time) after the first loop, for the ETA.
    self._warned_past = False
    self._constructed = False
    if preemption is not None:
      preemption.progress_fn = lambda: (self._step, self._newest_step)
    super().__init__(**kwargs)
    self._constructed = True
    self._directory_identity = (
        _identity(self.checkpoint_manager.directory)
        if self.checkpoint_manager is not None else None)
    self._step = int(self.global_step.numpy())

  def restore_checkpoint(self, checkpoint_path: Optional[str] = None):
    """Restores `checkpoint_path`, or the newest checkpoint, or initialises.

    Returns:
      The restored path (also in `restored_path`), or None when nothing was
      restored or when called from the constructor.
    """
    self._require("checkpoint_manager", for_method="restore_checkpoint")
    with self.strategy.scope():
      path = checkpoints.restore(
          self.checkpoint_manager, checkpoint_path,
          partial=self._partial_restore,
          directory=self._restore_dir)
    self._step = int(self.global_step.numpy())
    self._last_saved_step = self._step
    self._newest_step = self._step if path else None
    self.restored_path = path
    if path:
      console.info(f"restored checkpoint {path} at step {self._step}")
    # Orbit's constructor prints a restored path again, in its own words:
    # it gets None (the path stays in `restored_path`).
    return path if self._constructed else None

  def train(self, steps: int, checkpoint_at_completion: bool = True) -> None:
    """Trains until the global step reaches `steps`; see `orbit.Controller`.

    Orbit's loop reads the step back from the device after every loop; the
    step is known here, so this one does not.
    """
    self._require("trainer", for_method="train")
    with self._saving_on_signal():
      if self._step < steps:
        console.info(f"train | from step {self._step} to step {steps}")
      self._warn_if_past(steps)
      if (self._on_nonfinite == "rollback" and self._step < steps and
          self.checkpoint_manager is not None and self._newest() is None):
        # A rollback needs a checkpoint to go back to, even at step 0.
        self._maybe_save_checkpoint(check_interval=False, force=True)
      while self._step < steps:
        if self._stop_early():
          break
        # Loops end at multiples of `steps_per_loop` (where summaries are
        # due), also after one that was cut short.
        num_steps = min(
            steps - self._step,
            self.steps_per_loop - self._step % self.steps_per_loop)
        if self._profile is not None:
          num_steps = self._profile.clip(self._step, num_steps)
          self._profile.before_loop(self._step)
        if self._discard_at is not None:
          if self._step == self._discard_at - 1:
            self.trainer.discard_batch()
            console.info(
                f"train | skipped the batch of step {self._discard_at}")
            self._discard_at = None
          else:
            num_steps = min(num_steps, self._discard_at - 1 - self._step)
        self._train_n_steps(num_steps)
        if self._profile is not None:
          self._profile.after_loop(self._step)
        self._maybe_save_checkpoint()
        self._check_preemption()
      if self._profile is not None:
        self._profile.stop(self._step)
      if checkpoint_at_completion or self.stop_reason:
        self._maybe_save_checkpoint(check_interval=False)
    self._sync_on_async_checkpointing()

  @contextlib.contextmanager
  def _saving_on_signal(self) -> Iterator[None]:
    """A window in which SIGTERM/SIGINT asks for a checkpoint; checked once
    more on leaving it.

    Raises:
      errors.Preempted: After saving at the step reached.
    """
    if self._preemption is None:
      yield
      return
    with self._preemption.armed():
      yield
      self._check_preemption()
    if self._preemption.received and not self._preemption.is_armed:
      # The signal came after the last check, and training is over: its
      # final checkpoint is saved.
      raise errors.Preempted(self._step, self._preemption_exit_code)

  def _check_preemption(self) -> None:
    """Saves and stops if any worker got a signal; every worker calls it at
    the same points.

    Raises:
      errors.Preempted: After saving at the step reached.
    """
    if self._preemption is not None and self._preemption.agreed(
        self.strategy, self._num_workers):
      self._maybe_save_checkpoint(check_interval=False)
      raise errors.Preempted(self._step, self._preemption_exit_code)

  def _stop_early(self) -> bool:
    """Whether `stop_fn` says to stop; logs the reason once."""
    if self.stop_reason is None and self._stop_fn is not None:
      self.stop_reason = self._stop_fn()
      if self.stop_reason:
        console.info(f"train | stopping early at step {self._step}: "
                     f"{self.stop_reason}")
    return self.stop_reason is not None

  def train_and_evaluate(self, train_steps: int, eval_steps: int = -1,
                         eval_interval: Optional[int] = None):
    """Trains to `train_steps`, evaluating at every multiple of
    `eval_interval` and at the end; see `orbit.Controller`.

    Orbit's counts the interval from the step it starts at, so a resumed run
    would evaluate at other steps than an uninterrupted one; and it cannot
    stop early.

    Returns:
      The last evaluation's results, or None if nothing was left to train.
    """
    self._require("trainer", for_method="train_and_evaluate")
    self._require("evaluator", for_method="train_and_evaluate")
    self._warn_if_past(train_steps)
    output = None
    final = False
    with self._saving_on_signal():
      while self._step < train_steps and not self._stop_early():
        target = train_steps
        if eval_interval:
          target = min(train_steps,
                       (self._step // eval_interval + 1) * eval_interval)
        # The final checkpoint (also of a run stopping early) is saved
        # before the final evaluation, so an evaluation that fails (or a
        # signal during it) loses no step.
        self.train(target, checkpoint_at_completion=target >= train_steps)
        if self._step >= train_steps or self.stop_reason:
          final = True
          break
        output = self.evaluate(eval_steps)
        # A signal during it saves now, not after one more loop.
        self._check_preemption()
      self._maybe_save_checkpoint(check_interval=False)
    if final:
      output = self.evaluate(eval_steps)
    self._sync_on_async_checkpointing()
    return output

  def _warn_if_past(self, train_steps: int) -> None:
    """Says so when the restored step is past the final one, once."""
    if self._step > train_steps and not self._warned_past:
      self._warned_past = True
      console.warning(
          f"the checkpoint is at step {self._step}, past `trainer.train_"
          f"steps` ({train_steps}): nothing to train; raise it to train more")

  def _newest(self) -> Optional[str]:
    return tf.train.latest_checkpoint(self._restore_dir or
                                      self.checkpoint_manager.directory)

  def _maybe_save_checkpoint(self, check_interval: bool = True,
                             force: bool = False) -> bool:
    """Saves when the step crosses a multiple of `checkpoint_interval`.

    `tf.train.CheckpointManager`'s own interval counts from the first save
    (steps 10, 30, 50 for an interval of 20 after a first loop of 10), and
    Orbit saves again at completion even if the step is already saved.

    Raises:
      errors.NonFiniteError: Instead of saving non-finite variables.
    """
    if self.checkpoint_manager is None or (
        self._last_saved_step == self._step and not force):
      return False
    if check_interval and (self._step // self._checkpoint_interval ==
                           self._last_saved_step // self._checkpoint_interval):
      return False
    directory = self.checkpoint_manager.directory
    if _identity(directory) != self._directory_identity:
      # TensorFlow would create it anew and save into it without a word.
      raise errors.RunError(
          f"model_dir {directory} was deleted or replaced during the run; "
          f"the checkpoint of step {self._step} is not saved.")
    if self._finite_fn is not None and not self._finite_fn():
      raise errors.NonFiniteError(
          f"variables are not finite at step {self._step}; not saved (the "
          f"newest checkpoint is step {self._last_saved_step}).", self._step)
    path = self.checkpoint_manager.save(checkpoint_number=self._step)
    self._last_saved_step = self._step
    self._newest_step = self._step
    console.info(f"saved checkpoint {path}")
    return True

  def _train_n_steps(self, num_steps: int) -> None:
    start = time.perf_counter()
    self.trainer.train(self._steps_tensor(num_steps))
    status = self.trainer.loop_status()
    if status.nonfinite_step >= 0:
      self._step = status.nonfinite_step
      self._recover_from_nonfinite(status.nonfinite_step)
      return
    self._step += num_steps
    train_output = {"loss": status.loss}
    if status.learning_rate is not None:
      train_output["learning_rate"] = status.learning_rate
    for action in self.train_actions:
      action(train_output)

    now = time.perf_counter()
    # Rates count time spent in training loops only, not in evaluations or
    # checkpoint saves between them; the ETA uses wall time, which does.
    steps_per_second = num_steps / max(now - start, 1e-9)
    self._window_steps += num_steps
    self._window_seconds += now - start
    if self._run_start is None:
      # The first loop includes tracing; the ETA starts after it.
      self._run_start = (self._step, now)
      eta = None
    else:
      done = self._step - self._run_start[0]
      rate = done / max(now - self._run_start[1], 1e-9)
      eta = max(self._train_steps - self._step, 0) / rate
    console.info(summaries.progress_line(
        self._step, self._train_steps, steps_per_second,
        steps_per_second * self._global_batch_size, status.loss, eta))

    if self._train_summary_writer is not None and (
        self._step % self.summary_interval == 0 or
        self._step >= self._train_steps):
      self._write_train_summaries()
    else:
      self._write_learning_rate(status.learning_rate)

  def _steps_tensor(self, num_steps: int) -> tf.Tensor:
    """`num_steps` as a tensor, made once per value (10 us a loop saved)."""
    if num_steps not in self._step_tensors:
      self._step_tensors[num_steps] = tf.constant(num_steps, tf.int32)
    return self._step_tensors[num_steps]

  def _write_learning_rate(self, rate: Optional[float]) -> None:
    """Writes a scheduled learning rate after a loop, if it changed.

    Between summaries only: an eager summary write costs ~0.3 ms (measured),
    a tenth of a small step.
    """
    if self._train_summary_writer is None or rate is None:
      return
    if rate != self._learning_rate:
      # Not flushed: the writer flushes with the next full summary.
      summaries.write_scalars(self._train_summary_writer,
                              {"learning_rate": rate}, self._step,
                              flush=False)
      self._learning_rate = rate

  def _write_train_summaries(self) -> None:
    steps_per_second = self._window_steps / max(self._window_seconds, 1e-9)
    scalars: Dict[str, object] = dict(self.trainer.read_and_reset_metrics())
    scalars["steps_per_second"] = steps_per_second
    scalars["examples_per_second"] = steps_per_second * self._global_batch_size
    if self._scalars_fn is not None:
      scalars.update(self._scalars_fn())
    if "learning_rate" in scalars:
      self._learning_rate = float(scalars["learning_rate"])
    waited = scalars.pop("input_wait_seconds", None)
    if waited is not None:
      scalars["input_wait_fraction"] = self._input_wait_fraction(waited)
    summaries.write_scalars(self._train_summary_writer, scalars, self._step)
    if not np.isfinite(float(scalars["loss"])):
      logging.warning("training loss is %s at step %d", scalars["loss"],
                      self._step)
    self._window_steps = 0
    self._window_seconds = 0.0

  def _input_wait_fraction(self, waited: float) -> float:
    """Returns the share of the window's loop time spent waiting for input;
    warns when it shows training is input-bound."""
    fraction = min(waited / max(self._window_seconds, 1e-9), 1.0)
    logging.info("steps %d to %d waited for input %.1f%% of the time",
                 self._step - self._window_steps, self._step, 100 * fraction)
    if fraction > INPUT_BOUND_FRACTION and not self._input_bound:
      self._input_bound = True  # Once per run: the advice does not change.
      console.warning(
          f"input-bound: the steps to {self._step} waited for the input "
          f"pipeline {100 * fraction:.0f}% of the time (`input_wait_fraction`"
          " in the train summaries). Do per-batch work in "
          "`Task.preprocess_batch`, raise `runtime.dataset_batch_parallel_"
          "calls`, or cache decoded data; python scripts/benchmark_input.py "
          "measures the pipeline alone. (Tiny models wait for any input.)")
    return fraction

  def _recover_from_nonfinite(self, step: int) -> None:
    """Stops, or rolls back to the newest checkpoint and skips the batch.

    Raises:
      errors.NonFiniteError: Under "stop", or when rollbacks are used up.
    """
    if self._on_nonfinite != "rollback" or (
        self._rollbacks >= self._max_rollbacks):
      reason = ("" if self._on_nonfinite != "rollback" else
                f" after {self._rollbacks} rollback(s)")
      saved = (f"the newest checkpoint (step {self._last_saved_step}) was "
               "saved before it and holds finite values" if self._newest()
               else "no checkpoint was saved before it")
      raise errors.NonFiniteError(
          f"the training loss is not finite at step {step}{reason}; "
          f"{saved}.", step)
    self._rollbacks += 1
    self.restore_checkpoint()
    self.trainer.read_and_reset_metrics()  # They include the bad step.
    self._window_steps, self._window_seconds = 0, 0.0
    if self._resume_input_fn is not None:
      self._resume_input_fn(self._step)
    self._discard_at = step
    console.info(f"train | non-finite loss at step {step}: rolled back to "
                 f"step {self._step}, skipping that step's batch (rollback "
                 f"{self._rollbacks} of {self._max_rollbacks})")

  @property
  def step(self) -> int:
    """The global step, without reading it from the device."""
    return self._step


def _identity(directory: str) -> Optional[tuple]:
  """`(device, inode)` of a local directory; None if it is missing or not
  local (`gs://...`)."""
  try:
    status = os.stat(directory)
  except OSError:
    return None
  return (status.st_dev, status.st_ino)
