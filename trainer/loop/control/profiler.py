"""Profiling a window of training steps with the TensorFlow profiler.

`trainer.profile_steps = (start, end)` traces the steps taken while the
global step goes from `start` to `end` into `model_dir/train`, where
TensorBoard's Profile tab finds it (`plugins/profile/<run>/`). As a loop
hook, the window cuts the controller's loops at its edges so the trace holds
exactly those steps.
A profiler that cannot start (another one running) is logged, not raised:
profiling is optional. Nor does it write into a `model_dir` deleted under
the run: the trace is dropped, and the next save stops the run.
"""

from typing import Optional, Tuple

import tensorflow as tf

from trainer import checks
from trainer import console
from trainer.loop.control import hooks as loop_hooks
from trainer.storage import files


class ProfileWindow(loop_hooks.LoopHook):
  """Loop hook: starts and stops the profiler around a window of steps."""

  def __init__(self, steps: Tuple[int, int], logdir: str,
               model_dir: Optional[str] = None):
    """Builds the hook.

    Args:
      steps: The window, `(first, last)`.
      logdir: Where the trace goes.
      model_dir: The run's folder, holding `logdir`: no trace is started
        or written once it is deleted (None: not watched).
    """
    self.first, self.last = steps  # The window: steps first to last.
    self._logdir = logdir
    self._model_dir = model_dir
    self._running = False
    self.traced = False  # Whether a trace was written.

  def clip(self, step: int, num_steps: int) -> int:
    """Shortens a loop starting at `step` so it ends at the window's edges."""
    for edge in (self.first, self.last):
      if step < edge < step + num_steps:
        return edge - step
    return num_steps

  def before_loop(self, step: int) -> None:
    """Starts tracing if the loop from `step` is inside the window."""
    if (self._running or self.traced or not self.first <= step < self.last
        or files.directory_gone(self._model_dir)):
      return
    try:
      tf.profiler.experimental.start(self._logdir)
      self._running = True
      console.log(f"profiling from step {step} to {self.last} into "
                  f"{self._logdir}")
    except Exception as e:  # pylint: disable=broad-except
      console.warning(f"the profiler did not start: {e}")
      self.traced = True  # Do not try again.

  def after_loop(self, step: int, result: loop_hooks.LoopResult) -> None:
    """Stops tracing once `step` reaches the window's end."""
    del result  # Unused.
    if self._running and step >= self.last:
      self.stop(step)

  def end(self, step: int) -> None:
    """Stops tracing where training stops before the window's end."""
    self.stop(step)

  def stop(self, step: int) -> None:
    """Stops tracing at `step` (the window's end, or where training ended)."""
    if not self._running:
      return
    self._running = False
    try:
      if files.directory_gone(self._model_dir):
        tf.profiler.experimental.stop(save=False)
        return
      tf.profiler.experimental.stop()
      self.traced = True
      console.info(f"profile | steps {self.first} to {min(step, self.last)} "
                   f"traced into {self._logdir}")
    except Exception as e:  # pylint: disable=broad-except
      console.warning(f"the profiler did not stop cleanly: {e}")


def check_steps(steps: Optional[Tuple[int, int]]) -> None:
  """Checks a `trainer.profile_steps` value: None, or `(start, end)`.

  Raises:
    errors.ConfigError: Unless it is None or two integers with
      0 <= start < end.
  """
  checks.require(
      steps is None or (
          isinstance(steps, (tuple, list)) and len(steps) == 2 and
          all(checks.is_int(s) for s in steps) and 0 <= steps[0] < steps[1]),
      f"`trainer.profile_steps` ({steps!r}) must be (start, end) with "
      "0 <= start < end.")
