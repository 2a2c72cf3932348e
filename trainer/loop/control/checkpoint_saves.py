"""The controller's checkpoint saves: at which steps, and one at a time.

`tf.train.CheckpointManager`'s own interval counts from the first save (steps
10, 30, 50 for an interval of 20 after a first loop of 10), and Orbit saves
again at completion even if the step is already saved: here saves fall when
the step crosses a multiple of the interval, once per step. Every worker
must take the same save decisions, so they are based on the restored step,
not on what this process's directory holds. The stall watch's thread saves
while a loop waits for input, and the loop saves on its own once a batch
comes: one at a time. No save writes non-finite variables (the guard
refuses them) or into a model_dir replaced during the run.
"""

import math
import threading
from typing import Callable, Optional

import tensorflow as tf

from trainer import console
from trainer import errors
from trainer.loop.control import rollback
from trainer.storage import files
from trainer.storage import lease


class CheckpointSaves:
  """Which steps are saved, and saving them.

  Attributes:
    last_saved_step: The step saved (or restored) last; None before the
      first restore.
    newest_step: The newest checkpoint's step; None: none.
    next_due: The first step that `save_if_due` saves at (infinity: none),
      so a caller asks only then.
  """

  def __init__(self, guard: rollback.NonFiniteGuard,
               interval: Optional[int], restore_dir: Optional[str],
               manager_fn: Callable[[], Optional[tf.train.CheckpointManager]],
               saved_fn: Optional[Callable[[str], None]] = None,
               saving_fn: Optional[Callable[[int], None]] = None):
    """Builds the bookkeeping.

    Args:
      guard: Refuses to save non-finite variables.
      interval: `ControllerOptions.checkpoint_interval`: save at its
        multiples; None: at the checkpoint manager's.
      restore_dir: Where the checkpoints to restore are, if not in the
        manager's directory.
      manager_fn: Returns the checkpoint manager (None: no saves).
      saved_fn: Called with each checkpoint's path once the loop saved it.
      saving_fn: Called with the step before the loop saves it (not before
        a save while the loop waits for input, from another thread).
    """
    self._guard = guard
    self._interval = interval
    self._restore_dir = restore_dir
    self._manager_fn = manager_fn
    self._saved_fn = saved_fn
    self._saving_fn = saving_fn
    self.last_saved_step: Optional[int] = None
    self.newest_step: Optional[int] = None
    self.next_due: float = math.inf
    self._lock = threading.Lock()
    self._directory_identity = None

  def restored(self, step: int, path: Optional[str]) -> None:
    """Records the restore of `path` (None: nothing restored) at `step`."""
    self.last_saved_step = step
    self.newest_step = step if path else None
    self._set_next_due()

  def _set_next_due(self) -> None:
    """The next interval multiple after the last save (or restore)."""
    interval = self.interval()
    self.next_due = math.inf
    if interval is not None and self._manager_fn() is not None:
      self.next_due = (self.last_saved_step // interval + 1) * interval

  def watch_directory(self,
                      identity: Optional[object] = None) -> None:
    """Remembers the manager's directory, to notice its replacement.

    Args:
      identity: The directory's `files.directory_identity` when the run
        took it, so that one deleted or replaced since (while the
        checkpoint was restored) is noticed too; None: as it is now.
    """
    manager = self._manager_fn()
    if manager is None:
      self._directory_identity = None
    elif identity is not None:
      self._directory_identity = identity
    else:
      self._directory_identity = files.directory_identity(manager.directory)

  def newest(self) -> Optional[str]:
    """The newest checkpoint to restore; None: none."""
    return tf.train.latest_checkpoint(self._restore_dir or
                                      self._manager_fn().directory)

  def interval(self) -> Optional[int]:
    """The save interval: ours, else the checkpoint manager's (Orbit saves
    on the manager's only); None: no saves."""
    if self._interval is not None:
      return self._interval
    return getattr(self._manager_fn(), "checkpoint_interval", None)

  def save_if_due(self, step: int, check_interval: bool = True,
                  force: bool = False) -> bool:
    """Saves `step` when it crossed a multiple of the interval since the
    last save (any step not saved yet without `check_interval`; even a
    saved one with `force`); returns whether it saved.

    Raises:
      errors.NonFiniteError: Instead of saving non-finite variables.
      errors.RunError: If the model_dir was deleted or replaced.
    """
    manager = self._manager_fn()
    interval = self.interval()
    if interval is None or manager is None or (
        self.last_saved_step == step and not force):
      return False
    if check_interval and (step // interval ==
                           self.last_saved_step // interval):
      return False
    directory = manager.directory
    if files.directory_identity(directory) != self._directory_identity:
      # TensorFlow would create it anew and save into it without a word.
      raise errors.RunError(
          f"model_dir {directory} was deleted or replaced during the run; "
          f"the checkpoint of step {step} is not saved.")
    # On an object store, where no lock keeps a second run out.
    lease.verify(directory)
    self._guard.check_saveable(step, self.last_saved_step)
    if self._saving_fn is not None:
      self._saving_fn(step)
    with self._lock:
      # The cadence is decided here: a manager with an interval of its own
      # would skip the save and return None.
      try:
        path = manager.save(checkpoint_number=step, check_interval=False)
      except tf.errors.OpError:
        # A second run that took an object store's lease after the check
        # above removes this save's `_temp` folder as a killed save's: the
        # rename or the cleanup then finds nothing. Name the cause.
        lease.verify(directory)
        raise
      self.last_saved_step = step
      self.newest_step = step
      self._set_next_due()
    console.info(f"saved checkpoint {path}")
    if self._saved_fn is not None:
      self._saved_fn(path)
    return True

  def save_while_waiting(self, in_loop_fn: Callable[[], bool],
                         step_fn: Callable[[], int]) -> Optional[str]:
    """Saves the step a loop reached while it waits for input; called from
    another thread, the loop blocked in `next`.

    Args:
      in_loop_fn: Whether the loop is still running.
      step_fn: The step the loop reached.

    Returns:
      What is saved, in words, or None if the loop moved during the save or
      has ended (its input came back: the checkpoint may mix two steps, as
      asynchronous training's do, and the next save supersedes it).
    """
    with self._lock:
      if not in_loop_fn():
        return None  # The loop came back: the controller goes on.
      step = step_fn()
      manager = self._manager_fn()
      if manager is None:
        return f"no checkpoint is kept (steps to {step} are not saved)"
      if step == self.newest_step:
        return f"the checkpoint of step {step} is saved"
      try:
        self._guard.check_saveable(step, self.last_saved_step)
      except errors.NonFiniteError as e:
        return f"step {step} is not saved ({e})"
      path = manager.save(checkpoint_number=step, check_interval=False)
      if step_fn() != step:
        return None
      self.newest_step = step
      console.info(f"saved checkpoint {path}")
      return f"the checkpoint of step {step} is saved"

