"""`Controller`: Orbit's outer loop with a lean per-loop path.

The controller decides when: when to run a loop, save a checkpoint, evaluate,
stop. What happens then is its collaborators' concern: the runner's
(`runners.TaskTrainer`), the non-finite guard's (`rollback.NonFiniteGuard`),
the preemption watcher's, and its hooks' (`loop_hooks.LoopHook`: the
progress line and train summaries, the profile window, early stopping),
which it calls around every loop in the order
`trainer.loop.control.hooks` gives.

Orbit's `evaluate_continuously`, `save_checkpoint` and summary managers are
kept. `train` and `_train_n_steps` are replaced because Orbit's per-loop
reads, conversions and summary writes keep raw Orbit at about half the speed
of a bare `tf.function` loop at `steps_per_loop=1`, and it prints an
unformatted dict: here a loop costs one `tf.function` call and one small
read (`fast_loop`), and work that is not due at a loop (a save, a hook that
only cuts loops or asks to stop) costs no call. Saves fall at interval
multiples, one at a time (`checkpoint_saves`). `evaluate` prints one
formatted line; `train_and_evaluate` evaluates at multiples of the interval
and stops early; `restore_checkpoint` falls back past damaged checkpoints.

There is one loop, for every runner: one without the loop's capabilities
(any plain `orbit.AbstractTrainer`) is wrapped in an
`orbit_adapter.OrbitRunnerAdapter` built on its own `train` and output.
The loop keeps Orbit's contract (tests/loop/control/test_orbit_controller.py
runs Orbit's controller tests on it, with Orbit's plain runners and with
capable ones): with a `summary_dir` (or `summary_manager`) the runner trains
under that writer and Orbit's `summary_interval` (`tf.summary.record_if`),
and its output with `steps_per_second` is written after every loop; train
actions get the runner's output; a loop that did not advance the global
step by its steps is reported; saves follow the checkpoint manager's
interval unless `ControllerOptions` sets one. The framework passes no
`summary_dir`: its train summaries are the reporter's, in `train/`.
"""

import contextlib
import dataclasses
import time
from typing import (Any, Callable, Iterable, Iterator, Optional, Sequence,
                    Tuple, Union)

import orbit
import tensorflow as tf

from trainer import console
from trainer.loop.control import checkpoint_saves
from trainer.loop.control import fast_loop
from trainer.loop.control import hooks as loop_hooks
from trainer.loop.control import rollback
from trainer.loop.control import watcher as watcher_lib
from trainer.loop.runner import orbit_adapter
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
    input_stale_until: Restore no input position from checkpoints of steps
      up to this one (saved with another batch size); -1: from all.
    directory_identity: The checkpoint manager's directory's
      `files.directory_identity` when the run took it: one deleted or
      replaced since, while the controller was built, stops the first save
      as one deleted later does. None: as it is once the controller is
      built.
  """
  checkpoint_interval: Optional[int] = None
  restore_dir: Optional[str] = None
  partial_restore: bool = False
  input_stale_until: int = -1
  directory_identity: Optional[object] = None


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

  def __init__(
      self, *,
      global_step: tf.Variable,
      trainer: Optional[orbit.AbstractTrainer] = None,
      evaluator: Optional[orbit.AbstractEvaluator] = None,
      strategy: Optional[tf.distribute.Strategy] = None,
      train_actions: Iterable[Callable[[Any], None]] = (),
      eval_actions: Iterable[Callable[[Any], None]] = (),
      steps_per_loop: Optional[Union[int, Callable[[int], int]]] = None,
      checkpoint_manager: Optional[tf.train.CheckpointManager] = None,
      enable_async_checkpointing: bool = False,
      summary_interval: Optional[int] = None,
      summary_dir: Optional[str] = None,
      eval_summary_dir: Optional[str] = None,
      summary_manager: Optional[orbit.utils.SummaryManagerInterface] = None,
      eval_summary_manager: Optional[
          orbit.utils.SummaryManagerInterface] = None,
      options: ControllerOptions = ControllerOptions(),
      guard: Optional[rollback.NonFiniteGuard] = None,
      preemption: Optional[watcher_lib.Watcher] = None,
      hooks: Sequence[loop_hooks.LoopHook] = (),
      restored_fn: Optional[Callable[[], None]] = None,
      saved_fn: Optional[Callable[[str], None]] = None,
      saving_fn: Optional[Callable[[int], None]] = None,
      held_out_sets: Sequence[str] = ()):
    """Builds the controller; restores the newest checkpoint if there is one.

    The arguments from `global_step` to `eval_summary_manager` are
    `orbit.Controller`'s, with its meaning.

    Args:
      global_step: The global step, a `tf.Variable`.
      trainer: Runs the training loops (`train(num_steps)`). One without the
        loop's capabilities (`orbit_adapter.CAPABILITIES`) is wrapped in an
        adapter built on its own `train` and output.
      evaluator: Runs evaluations (`evaluate(num_steps)`).
      strategy: The distribution strategy (default: the one in scope).
      train_actions: Called after every loop with the runner's output.
      eval_actions: Called after every evaluation with its output.
      steps_per_loop: Steps per call of the trainer's `train` (or a function
        of the global step that returns them); required with a `trainer`.
        Loops end at its multiples.
      checkpoint_manager: Saves and restores; None: neither.
      enable_async_checkpointing: Saves in the background (Orbit's).
      summary_interval: The step interval at which `tf.summary` calls inside
        the runner's loop record, with a `summary_dir` or `summary_manager`.
      summary_dir: Where Orbit's train summaries go (the runner's output
        and `steps_per_second` after every loop); None: nowhere.
      eval_summary_dir: Where the eval summaries go (default: `summary_dir`).
      summary_manager: Orbit's train summary manager, in place of
        `summary_dir`.
      eval_summary_manager: Orbit's eval summary manager, in place of
        `eval_summary_dir`.
      options: Checkpoint cadence and where to restore from.
      guard: What a non-finite training loss does (default: stop).
      preemption: Watches for SIGTERM/SIGINT (a `watcher_lib.Watcher`: the
        command line's `trainer.preemption.PreemptionWatcher`, given here
        by the experiment); checked after every loop and every evaluation
        between loops. It learns the step reached from `progress`, given
        to it where it is built.
      hooks: Called around every loop, in this order (see
        `trainer.loop.control.hooks`): the progress line and train
        summaries, the profile window, early stopping, the Keras
        callbacks, `metrics.csv`.
      restored_fn: Called after every restore of a checkpoint (the first,
        a rollback's), in the strategy scope: puts the configured optimizer
        hyperparameters over the checkpoint's.
      saved_fn: Called with each checkpoint's path after the loop saved it
        (the input state's report, after the first).
      saving_fn: Called with the step before the loop saves it, on every
        worker (each worker's input position, `worker_inputs`).
      held_out_sets: The named evaluation sets never judged
        (`trainer.held_out_sets`): their results are marked `(held out)` in
        the `eval |` line.

    Raises:
      ValueError: As `orbit.Controller`'s, for a missing trainer and
        evaluator, a bad `steps_per_loop` or `summary_interval`.
    """
    # Set before `super().__init__`: it calls `restore_checkpoint`.
    self._options = options
    self._guard = guard or rollback.NonFiniteGuard()
    self._preemption = preemption
    self._hooks = tuple(hooks)
    self._restored_fn = restored_fn
    self._held_out_sets = tuple(held_out_sets)
    # Each hook is called only where it does something: a method it does not
    # override costs no call per loop.
    self._clipping_hooks = _overriding(self._hooks, "clip")
    self._before_hooks = _overriding(self._hooks, "before_loop")
    self._after_hooks = _overriding(self._hooks, "after_loop")
    self._stopping_hooks = _overriding(self._hooks, "stop_reason")
    # The one loop's view of the trainer: the trainer itself, or a plain
    # Orbit runner in an adapter.
    self._runner = orbit_adapter.adapt(trainer, global_step)
    self.stop_reason: Optional[str] = None  # Why training stopped early.
    self.restored_path: Optional[str] = None  # The checkpoint restored last.
    self._step = None  # Python mirror of `global_step`, set at restore.
    self._saves = checkpoint_saves.CheckpointSaves(
        self._guard, options.checkpoint_interval, options.restore_dir,
        lambda: self.checkpoint_manager, saved_fn, saving_fn)
    self._warned_past = False
    self._last_step: Optional[int] = None  # train_and_evaluate's.
    self._constructed = False
    super().__init__(
        global_step=global_step, trainer=trainer, evaluator=evaluator,
        strategy=strategy, train_actions=train_actions,
        eval_actions=eval_actions, steps_per_loop=steps_per_loop,
        checkpoint_manager=checkpoint_manager,
        enable_async_checkpointing=enable_async_checkpointing,
        summary_interval=summary_interval, summary_dir=summary_dir,
        eval_summary_dir=eval_summary_dir, summary_manager=summary_manager,
        eval_summary_manager=eval_summary_manager)
    self._constructed = True
    self._saves.watch_directory(options.directory_identity)
    if self._runner is not None:
      self._loop = fast_loop.FastLoop(
          self._runner, self.global_step, self.summary_manager,
          self.summary_interval,
          orbit_summaries=(summary_dir is not None or
                           summary_manager is not None))
      self._discard_batch = self._runner.discard_batch
    self._step = int(self.global_step.numpy())

  def _live_step(self) -> int:
    """The global step as a loop moves it, for another thread (a signal's
    exit line); between loops, and where reading it needs a parameter
    server that may be gone, the step the last loop reached."""
    if (self._step is None or self._runner is None or
        not self._runner.in_loop or
        isinstance(self.strategy,
                   tf.distribute.experimental.ParameterServerStrategy)):
      return self._step
    try:
      return int(self.global_step.numpy())
    except (tf.errors.OpError, ValueError, RuntimeError):
      return self._step

  def progress(self) -> Optional[watcher_lib.Progress]:
    """The step reached and the newest checkpoint's step (None: none), for
    another thread (a signal's exit line); None until the controller has
    restored its step."""
    if self._step is None:
      return None
    return (self._live_step(), self._saves.newest_step)

  def save_while_waiting(self) -> Optional[str]:
    """Saves the step a loop reached while it waits for input; called from
    another thread, the loop blocked in `next`. Returns what is saved, in
    words, or None if the loop moved during the save or has ended (its
    input came back: the checkpoint may mix two steps, as asynchronous
    training's do, and the next save supersedes it).
    """
    return self._saves.save_while_waiting(
        lambda: self._runner is not None and self._runner.in_loop,
        self._live_step)

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
          directory=self._options.restore_dir,
          input_stale_until=self._options.input_stale_until)
      if path and self._restored_fn is not None:
        self._restored_fn()
    self._step = int(self.global_step.numpy())
    self._saves.restored(self._step, path)
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
    self._require("trainer", for_method="train")
    self._step = int(self.global_step.numpy())
    with self._saving_on_signal():
      self._warn_if_past(steps)
      if (self._guard.rolls_back and self._step < steps and
          self.checkpoint_manager is not None and
          self._saves.newest() is None):
        # A rollback needs a checkpoint to go back to, even at step 0.
        self._maybe_save_checkpoint(check_interval=False, force=True)
      # What is not due after a loop costs no call: a save before its
      # step, a stop no hook can ask for, a watcher that is not there.
      while self._step < steps and not (self._stopping_hooks and
                                        self._stop_early()):
        self._train_n_steps(self._next_loop_steps(steps))
        if self._step >= self._saves.next_due:
          self._maybe_save_checkpoint()
        if self._preemption is not None:
          self._check_preemption()
      for hook in self._hooks:  # Once a call: not worth a list of its own.
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
    for hook in self._clipping_hooks:
      num_steps = hook.clip(self._step, num_steps)
    num_steps = self._guard.clip(self._step, num_steps, self._discard_batch)
    for hook in self._before_hooks:
      hook.before_loop(self._step)
    return num_steps

  def evaluate(self, steps: int = -1):
    """Evaluates `steps` batches (-1: all); see `orbit.Controller.evaluate`.

    As Orbit's, with one line for the results formatted as the summary's
    (`eval | step 500 | accuracy 0.9944 | loss 0.0198 | 0.2 s`) in place of
    Orbit's two, the second an unformatted dict.
    """
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
    console.info(f"eval | step {step} | "
                 f"{run_report.format_results(values, self._held_out_sets)} "
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
    self._require("trainer", for_method="train_and_evaluate")
    self._require("evaluator", for_method="train_and_evaluate")
    self._step = int(self.global_step.numpy())
    self._warn_if_past(train_steps)
    self._last_step = train_steps
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
      raise self._preemption.stopped(self._step, last=self._at_last_step())

  def _check_preemption(self) -> None:
    """Saves and stops if any worker got a signal; every worker calls it at
    the same points.

    Raises:
      errors.Preempted: After saving at the step reached.
    """
    if self._preemption is not None and self._preemption.agreed(
        self.strategy):
      self._maybe_save_checkpoint(check_interval=False)
      raise self._preemption.stopped(self._step, agreed=True,
                                     last=self._at_last_step())

  def _at_last_step(self) -> bool:
    """Whether `train_and_evaluate` has trained its last step."""
    return self._last_step is not None and self._step >= self._last_step

  def _stop_early(self) -> bool:
    """Whether a hook says to stop (the first that gives a reason); logs the
    reason once."""
    if self.stop_reason is None:
      for hook in self._stopping_hooks:
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

  def _maybe_save_checkpoint(self, check_interval: bool = True,
                             force: bool = False) -> bool:
    """Saves when the step crosses a multiple of `checkpoint_interval`
    (`checkpoint_saves.CheckpointSaves.save_if_due`).

    Raises:
      errors.NonFiniteError: Instead of saving non-finite variables.
      errors.RunError: If the model_dir was deleted or replaced.
    """
    return self._saves.save_if_due(self._step, check_interval, force)

  def _train_n_steps(self, num_steps: int) -> None:
    """Runs one loop of `num_steps` steps (`fast_loop.FastLoop`), then its
    actions, Orbit's summaries and the hooks; rolls back a non-finite step.
    """
    start = time.perf_counter()
    output = self._loop.run(num_steps)
    status = self._runner.loop_status()
    if status.nonfinite_step >= 0:
      self._step = status.nonfinite_step
      self._roll_back(status.nonfinite_step)
      return
    self._step = self._loop.step_reached(self._step, num_steps, status.step)
    train_output = fast_loop.train_output(output, status)
    for action in self.train_actions:
      action(train_output)
    self._loop.write_summaries(train_output, num_steps,
                               time.perf_counter() - start)
    if self._after_hooks:
      result = loop_hooks.LoopResult(
          num_steps=num_steps, seconds=time.perf_counter() - start,
          loss=status.loss, learning_rate=status.learning_rate,
          output=train_output,
          read_metrics=self._runner.read_and_reset_metrics)
      for hook in self._after_hooks:
        hook.after_loop(self._step, result)

  def _roll_back(self, step: int) -> None:
    """Rolls back to the newest checkpoint, the guard permitting.

    Raises:
      errors.NonFiniteError: If the guard stops instead.
    """
    self._guard.start_rollback(step, self._saves.last_saved_step,
                               has_checkpoint=self._saves.newest() is not None)
    self.restore_checkpoint()
    self._runner.read_and_reset_metrics()  # They include the bad step.
    self._guard.finish_rollback(self._step)
    for hook in self._hooks:
      hook.after_rollback(self._step)



def _overriding(hooks: Sequence[loop_hooks.LoopHook],
                method: str) -> Tuple[loop_hooks.LoopHook, ...]:
  """The hooks whose `method` is their own, not `LoopHook`'s no-op."""
  default = getattr(loop_hooks.LoopHook, method)
  return tuple(hook for hook in hooks
               if getattr(type(hook), method, default) is not default)
