"""One loop of the controller's own loop, at the cost of a bare loop.

Orbit's `Controller._train_n_steps` reads the global step from the device
three times, converts every output to NumPy, writes and flushes every output
as a summary on every loop; at `steps_per_loop=1` that keeps raw Orbit at
about half the speed of a bare `tf.function` loop (`scripts/benchmark.py`,
docs/benchmarks.md). Here a loop costs one `tf.function` call and one small
read (the runner's `loop_status`, which also reports the step reached).
Orbit's train summaries are kept where they go somewhere: with a
`summary_dir` (or `summary_manager`) the runner trains under that writer and
Orbit's `summary_interval` (`tf.summary.record_if`), and its output with
`steps_per_second` is written after every loop.
"""

from typing import Any, Dict, Optional

import orbit
import tensorflow as tf

from trainer import console
from trainer.loop.runner import runners


class FastLoop:
  """Calls a runner's `train` as Orbit's controller does, cheaply."""

  def __init__(self, trainer: orbit.AbstractTrainer, global_step: tf.Variable,
               summary_manager: orbit.utils.SummaryManager,
               summary_interval: Optional[int], orbit_summaries: bool):
    """Builds the loop.

    Args:
      trainer: The runner.
      global_step: The global step.
      summary_manager: Orbit's train summary manager.
      summary_interval: Orbit's `summary_interval` (None: no `tf.summary`
        calls recorded inside the loop).
      orbit_summaries: Whether Orbit's summaries go somewhere (a directory
        or a manager of the caller's): without them the loop skips the
        writer and `record_if` (Orbit's no-op writer costs a few us a loop).
    """
    self._trainer = trainer
    self._global_step = global_step
    self._summary_manager = summary_manager
    self._summary_interval = summary_interval
    self._orbit_summaries = orbit_summaries
    self._step_tensors = {}  # Steps per loop -> the same as a tensor.

  def run(self, num_steps: int) -> Any:
    """Calls the runner's `train`; returns its output.

    With Orbit's summaries on, as Orbit calls it: under the train summary
    writer, recording `tf.summary` calls inside the loop at steps that are
    multiples of `summary_interval` (none without one).
    """
    steps = self._steps_tensor(num_steps)
    if not self._orbit_summaries:
      return self._trainer.train(steps)
    should_record = False
    if self._summary_interval:
      interval = self._summary_interval
      should_record = lambda: self._global_step % interval == 0
    with (self._summary_manager.summary_writer().as_default(),
          tf.summary.record_if(should_record)):
      return self._trainer.train(steps)

  def step_reached(self, start: int, num_steps: int,
                   reported: Optional[int]) -> int:
    """The global step after a loop of `num_steps` from `start`: the
    runner's report, or a read where it gives none; warns, as Orbit does,
    where the loop did not advance it by `num_steps`."""
    expected = start + num_steps
    step = int(self._global_step.numpy()) if reported is None else reported
    if step != expected:
      console.warning(
          f"a training loop of {num_steps} step(s) from step {start} "
          f"reached step {step}, not {expected}: the runner's `train` must "
          f"add 1 to the global step per step; going on from step {step}")
    return step

  def write_summaries(self, train_output: Dict[str, Any], num_steps: int,
                      seconds: float) -> None:
    """Writes a loop's output with its `steps_per_second` as Orbit's train
    summaries, where they go somewhere."""
    if not self._orbit_summaries:
      return
    values = tf.nest.map_structure(orbit.utils.get_value, train_output)
    values["steps_per_second"] = num_steps / max(seconds, 1e-9)
    self._summary_manager.write_summaries(values)
    self._summary_manager.flush()

  def _steps_tensor(self, num_steps: int) -> tf.Tensor:
    """`num_steps` as a tensor, made once per value (10 us a loop saved)."""
    if num_steps not in self._step_tensors:
      self._step_tensors[num_steps] = tf.constant(num_steps, tf.int32)
    return self._step_tensors[num_steps]


def train_output(output: Optional[Dict[str, Any]],
                 status: runners.LoopStatus) -> Dict[str, Any]:
  """The runner's whole output, as Orbit gives it; the loop's mean loss and
  scheduled rate (from its `loop_status`) where the output has none (a
  `TaskTrainer`'s loop reports them through `loop_status` only)."""
  result = dict(output or {})
  if status.loss is not None:
    result.setdefault("loss", status.loss)
  if status.learning_rate is not None:
    result.setdefault("learning_rate", status.learning_rate)
  return result
