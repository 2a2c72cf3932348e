"""`Controller`: Orbit's outer loop with a lean per-loop path.

The controller decides when: when to run a loop, save a checkpoint, evaluate,
stop. What happens then is its collaborators' concern: the runner's
(`runners.TaskTrainer`), the non-finite guard's (`rollback.NonFiniteGuard`),
the preemption watcher's, and its hooks' (`loop_hooks.LoopHook`: the
progress line and train summaries, the profile window, early stopping),
which it calls around every loop in the order `trainer.loop_hooks` gives.

Everything but the per-loop hot path is `orbit.Controller`'s own: `evaluate`,
eval summaries and actions. `train` and `_train_n_steps` are replaced
because Orbit's reads the global step from the device three times, converts
every output to NumPy, writes and flushes every output as a summary on every
loop and prints an unformatted dict; at `steps_per_loop=1` that keeps raw
Orbit at about half the speed of a bare `tf.function` loop
(`scripts/benchmark.py`, docs/benchmarks.md). Here a loop costs one
`tf.function` call and one small read (the runner's `loop_status`).
`train_and_evaluate` is replaced to evaluate at multiples of the interval and
to stop early; `restore_checkpoint` to fall back past damaged checkpoints.

The own loop keeps Orbit's contract (tests/test_orbit_controller.py runs
Orbit's controller tests on it): with a `summary_dir` (or `summary_manager`)
the runner trains under that writer and Orbit's `summary_interval`
(`tf.summary.record_if`), and its output with `steps_per_second` is written
after every loop; train actions get the runner's output; a loop that did not
advance the global step by its steps is reported; saves follow the checkpoint
manager's interval unless `ControllerOptions` sets one. The framework passes
no `summary_dir`: its train summaries are the reporter's, in `train/`.

A runner without `loop_status` (any `orbit.AbstractTrainer`) gets Orbit's own
loop, cadence and summaries unchanged.
"""

import contextlib
import dataclasses
import os
import threading
import time
from typing import Iterator, Optional, Sequence

import orbit
import tensorflow as tf

from trainer import console
from trainer import errors
from trainer.loop import hooks as loop_hooks
from trainer.loop import preemption as preemption_lib
from trainer.loop import rollback
from trainer.report import run_report
from trainer.storage import checkpoints


@dataclasses.dataclass(frozen=True)
class ControllerOptions:
  """How the controller saves and restores checkpoints.

  Attributes:
    checkpoint_interval: Save when the step reaches a multiple of this, and
      always at the end of training. None (the default): the checkpoint
      manager's own `checkpoint_interval`, as in Orbit (its multiples here
      too); no saves at all, as in Orbit, where the manager has none.
    restore_dir: Where to look for the checkpoint to restore when it is not
      where this process saves (a non-chief worker saves to a temporary
      directory but restores the chief's checkpoints); None for the
      checkpoint manager's directory.
    partial_restore: Restore only what this run built (eval modes), without
      warning about the rest of the checkpoint.
  """
  checkpoint_interval: Optional[int] = None
  restore_dir: Optional[str] = None
  partial_restore: bool = False


class Controller(orbit.Controller):
  """`orbit.Controller` that runs our runners' loops at the cost of a bare
  loop, saves at interval multiples, stops early or on a signal, and rolls
  back non-finite steps.

  What runs at the loop's cadence without changing its course is a hook
  (`loop_hooks.LoopHook`): it may shorten a loop or ask to stop, and the
  controller does the rest. The non-finite guard and the preemption watcher
  are not hooks, but arguments of their own: they change the course of the
  loop at points the controller must choose. The guard is asked before every
  save (and refuses non-finite variables), starts a rollback that restores a
  checkpoint or raises, and skips a batch on the runner; the watcher opens
  the window in which a signal asks for a checkpoint, makes every worker
  agree, and ends training with `errors.Preempted` after the save. Each is
  one of a kind, and the order of their calls against saves is the
  controller's contract, not a hook's.
  """

  def __init__(self, *, options: ControllerOptions = ControllerOptions(),
               guard: Optional[rollback.NonFiniteGuard] = None,
               preemption: Optional[preemption_lib.PreemptionWatcher] = None,
               hooks: Sequence[loop_hooks.LoopHook] = (),
               **kwargs):
    """Builds the controller; restores the newest checkpoint if there is one.

    Args:
      options: Checkpoint cadence and where to restore from.
      guard: What a non-finite training loss does (default: stop).
      preemption: Watches for SIGTERM/SIGINT; checked after every loop and
        every evaluation between loops. It learns the step reached from
        `progress`, given to it where it is built.
      hooks: Called around every loop of the own loop, in this order (see
        `trainer.loop_hooks`): the progress line and train summaries, the
        profile window, early stopping.
      **kwargs: Passed to `orbit.Controller` (trainer, evaluator,
        global_step, strategy, steps_per_loop, checkpoint_manager, actions,
        summary settings).
    """
    # Set before `super().__init__`: it calls `restore_checkpoint`.
    self._options = options
    self._guard = guard or rollback.NonFiniteGuard()
    self._preemption = preemption
    self._hooks = tuple(hooks)
    self._own_loop = callable(getattr(kwargs.get("trainer"), "loop_status",
                                      None))
    # Whether Orbit's summary manager writes anything: without a directory
    # or a manager of the caller's, the own loop skips its writer and
    # `record_if` (Orbit's no-op writer costs a few us a loop).
    self._orbit_summaries = (kwargs.get("summary_dir") is not None or
                             kwargs.get("summary_manager") is not None)
    self._step_tensors = {}  # Steps per loop -> the same as a tensor.
    self.stop_reason: Optional[str] = None  # Why training stopped early.
    self.restored_path: Optional[str] = None  # The checkpoint restored last.
    self._step = None  # Python mirror of `global_step`, set at restore.
    # Every worker must take the same save decisions, so they are based on
    # the restored step, not on what this process's directory holds.
    self._last_saved_step = None
    self._newest_step = None  # The newest checkpoint's step; None: none.
    self._warned_past = False
    # The stall watch's thread saves while a loop waits for input, and the
    # loop saves on its own once a batch comes: one at a time.
    self._saving = threading.Lock()
    self._constructed = False
    super().__init__(**kwargs)
    self._constructed = True
    self._directory_identity = (
        _identity(self.checkpoint_manager.directory)
        if self.checkpoint_manager is not None else None)
    self._step = int(self.global_step.numpy())

  def _live_step(self) -> int:
    """The global step as a loop moves it, for another thread (a signal's
    exit line); between loops, and where reading it needs a parameter
    server that may be gone, the step the last loop reached."""
    if (self._step is None or not getattr(self.trainer, "in_loop", False) or
        isinstance(self.strategy,
                   tf.distribute.experimental.ParameterServerStrategy)):
      return self._step
    try:
      return int(self.global_step.numpy())
    except (tf.errors.OpError, ValueError, RuntimeError):
      return self._step

  def progress(self) -> Optional[preemption_lib.Progress]:
    """The step reached and the newest checkpoint's step (None: none), for
    another thread (a signal's exit line); None until the controller has
    restored its step."""
    if self._step is None:
      return None
    return (self._live_step(), self._newest_step)

  def save_while_waiting(self) -> Optional[str]:
    """Saves the step a loop reached while it waits for input; called from
    another thread, the loop blocked in `next`. Returns what is saved, in
    words, or None if the loop moved during the save or has ended (its
    input came back: the checkpoint may mix two steps, as asynchronous
    training's do, and the next save supersedes it).
    """
    with self._saving:
      if not getattr(self.trainer, "in_loop", False):
        return None  # The loop came back: the controller goes on.
      step = self._live_step()
      if self.checkpoint_manager is None:
        return f"no checkpoint is kept (steps to {step} are not saved)"
      if step == self._newest_step:
        return f"the checkpoint of step {step} is saved"
      try:
        self._guard.check_saveable(step, self._last_saved_step)
      except errors.NonFiniteError as e:
        return f"step {step} is not saved ({e})"
      path = self.checkpoint_manager.save(checkpoint_number=step,
                                          check_interval=False)
      if self._live_step() != step:
        return None
      self._newest_step = step
      console.info(f"saved checkpoint {path}")
      return f"the checkpoint of step {step} is saved"

  @property
  def step(self) -> int:
    """The global step, without reading it from the device."""
    return self._step

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
          partial=self._options.partial_restore,
          directory=self._options.restore_dir)
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

    Orbit's loop reads the step back from the device after every loop;
    this one reads it once per call (as Orbit, it starts from the step the
    variable holds, which a caller may have set), then takes it from the
    runner's loop status.
    """
    if not self._own_loop:
      super().train(steps, checkpoint_at_completion)
      self._step = int(self.global_step.numpy())
      return
    self._require("trainer", for_method="train")
    self._step = int(self.global_step.numpy())
    with self._saving_on_signal():
      self._warn_if_past(steps)
      if (self._guard.rolls_back and self._step < steps and
          self.checkpoint_manager is not None and self._newest() is None):
        # A rollback needs a checkpoint to go back to, even at step 0.
        self._maybe_save_checkpoint(check_interval=False, force=True)
      while self._step < steps and not self._stop_early():
        self._train_n_steps(self._next_loop_steps(steps))
        self._maybe_save_checkpoint()
        self._check_preemption()
      for hook in self._hooks:
        hook.end(self._step)
      if checkpoint_at_completion or self.stop_reason:
        self._maybe_save_checkpoint(check_interval=False)
    self._sync_on_async_checkpointing()

  def _next_loop_steps(self, steps: int) -> int:
    """Returns the steps of the next loop, towards `steps`.

    Loops end at multiples of `steps_per_loop` (where summaries are due),
    also after one that was cut short, where a hook cuts them (a profile
    window's edges) and before a batch the guard skips.
    """
    num_steps = min(steps - self._step,
                    self.steps_per_loop - self._step % self.steps_per_loop)
    for hook in self._hooks:
      num_steps = hook.clip(self._step, num_steps)
    num_steps = self._guard.clip(self._step, num_steps,
                                 self.trainer.discard_batch)
    for hook in self._hooks:
      hook.before_loop(self._step)
    return num_steps

  def evaluate(self, steps: int = -1):
    """Evaluates `steps` batches (-1: all); see `orbit.Controller.evaluate`.

    As Orbit's, with one line for the results formatted as the summary's
    (`eval | step 500 | accuracy 0.9944 | loss 0.0198 | 0.2 s`) in place of
    Orbit's two, the second an unformatted dict.
    """
    if not self._own_loop and self.trainer is not None:
      return super().evaluate(steps)
    self._require("evaluator", for_method="evaluate")
    if steps <= 0 and steps != -1:
      raise ValueError(f"`steps` ({steps}) should be > 0, or == -1.")
    step = int(self.global_step.numpy())
    start = time.time()
    with self.eval_summary_manager.summary_writer().as_default():
      output = self.evaluator.evaluate(tf.convert_to_tensor(steps, tf.int32))
    elapsed = time.time() - start
    output = output or {}
    values = tf.nest.map_structure(orbit.utils.get_value, output)
    if steps > 0:
      values["steps_per_second"] = steps / elapsed
    console.info(f"eval | step {step} | {run_report.format_results(values)} "
                 f"| {elapsed:.1f} s")
    for action in self.eval_actions:  # Their lines after the results.
      action(output)
    output = values
    self.eval_summary_manager.write_summaries(output)
    self.eval_summary_manager.flush()
    return output

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
    if not self._own_loop:
      return super().train_and_evaluate(train_steps, eval_steps, eval_interval)
    self._require("trainer", for_method="train_and_evaluate")
    self._require("evaluator", for_method="train_and_evaluate")
    self._step = int(self.global_step.numpy())
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
      raise self._preemption.stopped(self._step)

  def _check_preemption(self) -> None:
    """Saves and stops if any worker got a signal; every worker calls it at
    the same points.

    Raises:
      errors.Preempted: After saving at the step reached.
    """
    if self._preemption is not None and self._preemption.agreed(
        self.strategy):
      self._maybe_save_checkpoint(check_interval=False)
      raise self._preemption.stopped(self._step, agreed=True)

  def _stop_early(self) -> bool:
    """Whether a hook says to stop (the first that gives a reason); logs the
    reason once."""
    if self.stop_reason is None:
      for hook in self._hooks:
        reason = hook.stop_reason()
        if reason:
          self.stop_reason = reason
          console.info(f"train | stopping early at step {self._step}: "
                       f"{reason}")
          break
    return self.stop_reason is not None

  def _warn_if_past(self, train_steps: int) -> None:
    """Says so when the restored step is past the final one, once."""
    if self._step > train_steps and not self._warned_past:
      self._warned_past = True
      console.warning(
          f"the checkpoint is at step {self._step}, past `trainer.train_"
          f"steps` ({train_steps}): nothing to train; raise it to train more")

  def _newest(self) -> Optional[str]:
    return tf.train.latest_checkpoint(self._options.restore_dir or
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
    if not self._own_loop:
      return super()._maybe_save_checkpoint(check_interval)
    interval = self._checkpoint_interval()
    if interval is None or self.checkpoint_manager is None or (
        self._last_saved_step == self._step and not force):
      return False
    if check_interval and (self._step // interval ==
                           self._last_saved_step // interval):
      return False
    directory = self.checkpoint_manager.directory
    if _identity(directory) != self._directory_identity:
      # TensorFlow would create it anew and save into it without a word.
      raise errors.RunError(
          f"model_dir {directory} was deleted or replaced during the run; "
          f"the checkpoint of step {self._step} is not saved.")
    self._guard.check_saveable(self._step, self._last_saved_step)
    with self._saving:
      # The cadence is decided here: a manager with an interval of its own
      # would skip the save and return None.
      path = self.checkpoint_manager.save(checkpoint_number=self._step,
                                          check_interval=False)
      self._last_saved_step = self._step
      self._newest_step = self._step
    console.info(f"saved checkpoint {path}")
    return True

  def _checkpoint_interval(self) -> Optional[int]:
    """The save interval: ours, else the checkpoint manager's (Orbit saves
    on the manager's only); None: no saves."""
    if self._options.checkpoint_interval is not None:
      return self._options.checkpoint_interval
    return getattr(self.checkpoint_manager, "checkpoint_interval", None)

  def _train_n_steps(self, num_steps: int) -> None:
    """Runs one loop of `num_steps` steps, then its actions, Orbit's
    summaries and the hooks; rolls back a non-finite step.

    As Orbit's, but with one read from the device (the runner's
    `loop_status`, which also reports the step reached), and Orbit's
    summaries only where they go somewhere.
    """
    if not self._own_loop:
      super()._train_n_steps(num_steps)
      return
    start = time.perf_counter()
    output = self._run_loop(num_steps)
    status = self.trainer.loop_status()
    if status.nonfinite_step >= 0:
      self._step = status.nonfinite_step
      self._roll_back(status.nonfinite_step)
      return
    self._step = self._step_reached(num_steps, status.step)
    # The runner's whole output, as Orbit gives it; the loop's mean loss
    # and scheduled rate where the output has none (a `TaskTrainer`'s loop
    # reports them through `loop_status` only).
    train_output = dict(output or {})
    train_output.setdefault("loss", status.loss)
    if status.learning_rate is not None:
      train_output.setdefault("learning_rate", status.learning_rate)
    for action in self.train_actions:
      action(train_output)
    if self._orbit_summaries:
      values = tf.nest.map_structure(orbit.utils.get_value, train_output)
      values["steps_per_second"] = num_steps / max(
          time.perf_counter() - start, 1e-9)
      self.summary_manager.write_summaries(values)
      self.summary_manager.flush()
    if self._hooks:
      result = loop_hooks.LoopResult(
          num_steps=num_steps, seconds=time.perf_counter() - start,
          loss=status.loss, learning_rate=status.learning_rate,
          output=train_output,
          read_metrics=self.trainer.read_and_reset_metrics)
      for hook in self._hooks:
        hook.after_loop(self._step, result)

  def _run_loop(self, num_steps: int):
    """Calls the runner's `train`; returns its output.

    With Orbit's summaries on, as Orbit calls it: under the train summary
    writer, recording `tf.summary` calls inside the loop at steps that are
    multiples of `summary_interval` (none without one).
    """
    steps = self._steps_tensor(num_steps)
    if not self._orbit_summaries:
      return self.trainer.train(steps)
    should_record = False
    if self.summary_interval:
      should_record = lambda: self.global_step % self.summary_interval == 0
    with (self.summary_manager.summary_writer().as_default(),
          tf.summary.record_if(should_record)):
      return self.trainer.train(steps)

  def _step_reached(self, num_steps: int, reported: Optional[int]) -> int:
    """The global step after a loop of `num_steps` from `self._step`: the
    runner's report, or a read where it gives none; warns, as Orbit does,
    where the loop did not advance it by `num_steps`."""
    expected = self._step + num_steps
    step = int(self.global_step.numpy()) if reported is None else reported
    if step != expected:
      console.warning(
          f"a training loop of {num_steps} step(s) from step {self._step} "
          f"reached step {step}, not {expected}: the runner's `train` must "
          f"add 1 to the global step per step; going on from step {step}")
    return step

  def _steps_tensor(self, num_steps: int) -> tf.Tensor:
    """`num_steps` as a tensor, made once per value (10 us a loop saved)."""
    if num_steps not in self._step_tensors:
      self._step_tensors[num_steps] = tf.constant(num_steps, tf.int32)
    return self._step_tensors[num_steps]

  def _roll_back(self, step: int) -> None:
    """Rolls back to the newest checkpoint, the guard permitting.

    Raises:
      errors.NonFiniteError: If the guard stops instead.
    """
    self._guard.start_rollback(step, self._last_saved_step,
                               has_checkpoint=self._newest() is not None)
    self.restore_checkpoint()
    self.trainer.read_and_reset_metrics()  # They include the bad step.
    self._guard.finish_rollback(self._step)
    for hook in self._hooks:
      hook.after_rollback(self._step)


def _identity(directory: str) -> Optional[tuple]:
  """`(device, inode)` of a local directory; None if it is missing or not
  local (`gs://...`)."""
  try:
    status = os.stat(directory)
  except OSError:
    return None
  return (status.st_dev, status.st_ino)
