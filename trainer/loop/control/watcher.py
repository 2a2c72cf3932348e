"""`Watcher`: what the controller asks of the watcher it is given, the one
that turns a signal into a checkpoint and a stop.

The controller does not own the process's signals: the command line and
the experiment do (`trainer.preemption.PreemptionWatcher` is the watcher
they build). What the controller needs is a window in which a signal asks
for a checkpoint, a check between loops that every worker makes together,
and the error to stop with after the save. Any object with these members
will do (a fake in a test); the controller calls nothing else on it.
"""

from typing import ContextManager, Optional, Protocol, Tuple
from typing import runtime_checkable

import tensorflow as tf

from trainer import errors

# The step reached and the newest checkpoint's step (None: none yet): what
# `Controller.progress` tells the watcher's thread, for a signal's exit line.
Progress = Tuple[int, Optional[int]]


@runtime_checkable
class Watcher(Protocol):
  """The controller's view of the preemption watcher.

  The controller enters `armed()` around training, asks `agreed` after
  every loop (and every evaluation between loops) and, where it is true,
  saves and raises `stopped(step, agreed=True)`. A signal that came after
  the last check, once the window is closed, is raised as `stopped(step)`.
  """

  def armed(self) -> ContextManager[None]:
    """A window (nestable) in which a signal asks for a checkpoint."""

  @property
  def is_armed(self) -> bool:
    """Whether a signal now asks for a checkpoint."""

  @property
  def received(self) -> bool:
    """Whether this process got a signal."""

  def agreed(self, strategy: tf.distribute.Strategy) -> bool:
    """Whether any worker got a signal; every worker calls it at the same
    points, so that all stop after the same loop."""

  def stopped(self, step: int, agreed: bool = False,
              last: bool = False) -> errors.Preempted:
    """The error to stop with after saving `step` (`agreed`: after
    `agreed` said so; `last`: the run's last step)."""
