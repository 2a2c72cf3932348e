"""A plain Orbit runner given what the controller's loop needs from it.

The controller (`trainer.loop.control.controller.Controller`) drives every
runner through one loop, which asks the runner for four things besides
`train`:

    loop_status()            the loop's loss, a non-finite step, the step
    discard_batch()          skip the batch of a rolled-back step
    read_and_reset_metrics() the metrics since the last summary
    in_loop                  whether a `train` call runs (another thread's
                             save while the loop waits for input)

`runners.TaskTrainer` has them, computed inside its compiled loop. Any other
`orbit.AbstractTrainer` gets them from `OrbitRunnerAdapter`, built on its
own `train` and the output it returns, so an Orbit user's `StandardTrainer`
runs under the same cadence, saves, guard and hooks as ours.
"""

import math
from typing import Any, Dict, Optional

import orbit
import tensorflow as tf

from trainer import errors
from trainer.loop.runner import runners

# What the controller's loop uses of a runner, besides `train`.
CAPABILITIES = ("loop_status", "discard_batch", "read_and_reset_metrics",
                "in_loop")


def adapt(trainer: Optional[orbit.AbstractTrainer],
          global_step: tf.Variable) -> Optional[Any]:
  """Returns `trainer` if it has every one of `CAPABILITIES`, else the
  trainer wrapped in an `OrbitRunnerAdapter`; None for no trainer."""
  if trainer is None or all(hasattr(trainer, name) for name in CAPABILITIES):
    return trainer
  return OrbitRunnerAdapter(trainer, global_step=global_step)


class OrbitRunnerAdapter:
  """The loop's capabilities for a runner that lacks some: those it has are
  its own, the others built on its `train` and output.

  The loop's loss is the `loss` of the runner's output (none where the
  output has none); a non-finite one is reported at the step the loop
  reached, since the runner cannot tell which of its steps went wrong. The
  metrics are the last output's values: an Orbit runner resets its metrics
  itself at the start of each loop.
  """

  def __init__(self, runner: orbit.AbstractTrainer, *,
               global_step: tf.Variable):
    """Wraps `runner`.

    Args:
      runner: The Orbit trainer.
      global_step: The controller's global step, read only after a loop
        whose loss is not finite.
    """
    self.runner = runner
    self._global_step = global_step
    self._in_loop = False
    self._output: Optional[Dict[str, Any]] = None
    # A capability the runner has stays its own.
    for name in ("loop_status", "discard_batch", "read_and_reset_metrics"):
      own = getattr(runner, name, None)
      if callable(own):
        setattr(self, name, own)

  @property
  def in_loop(self) -> bool:
    """Whether a `train` call runs (the runner's own word, where it has
    one)."""
    return self._in_loop or bool(getattr(self.runner, "in_loop", False))

  def train(self, num_steps: tf.Tensor) -> Optional[Dict[str, Any]]:
    """Runs the runner's `train`; returns its output."""
    self._in_loop = True
    try:
      self._output = self.runner.train(num_steps)
    finally:
      self._in_loop = False
    return self._output

  def loop_status(self) -> runners.LoopStatus:
    """The last loop's status, from its output; the step is left to the
    controller to read (`step=None`)."""
    loss = None
    value = (self._output or {}).get("loss")
    if value is not None:
      try:
        loss = float(orbit.utils.get_value(value))
      except (TypeError, ValueError):  # Not one number: no loop loss.
        loss = None
    nonfinite_step = -1
    if loss is not None and not math.isfinite(loss):
      nonfinite_step = int(self._global_step.numpy())
    return runners.LoopStatus(loss, nonfinite_step, learning_rate=None)

  def discard_batch(self) -> None:
    """Reads the next training batch and throws it away (a
    `StandardTrainer`'s; other runners cannot skip one).

    Raises:
      errors.ConfigError: For a runner that is no `orbit.StandardTrainer`.
    """
    if not isinstance(self.runner, orbit.StandardTrainer):
      raise errors.ConfigError(
          f"{type(self.runner).__name__} cannot skip a batch after a "
          "rollback: give it a `discard_batch()` method, or stop on a "
          "non-finite loss (`trainer.on_nonfinite=\"stop\"`).")
    # pylint: disable=protected-access
    # As `StandardTrainer.train` makes its iterator on its first loop.
    if self.runner._train_iter is None:
      self.runner._train_iter = tf.nest.map_structure(
          iter, self.runner.train_dataset)
    next(self.runner._train_iter)

  def read_and_reset_metrics(self) -> Dict[str, Any]:
    """The last loop's output, as host values."""
    return tf.nest.map_structure(orbit.utils.get_value, self._output or {})
