"""The sums over a summary window of what each training step reports.

Each step adds its loss, a count, its gradient norm (where the step reports
one), whether that norm is finite, and the seconds it waited for input; and
the replica mean of every other scalar it returned (an override's `penalty`,
say). The summaries read the window's means and reset it. Orbit's loop
discards step outputs, so the sums are kept here, in variables.

The compiled loop reads the sums once, carries them through its steps as a
loop variable (`step_sums` gives a step's share) and writes them back once
(`value`, `assign`): a variable update per step is an op and a resource
lock a bare loop does not pay. The additions are the same, in the same
order, as `add` makes one step at a time, so the means are bit for bit the
same. (A loop that fails part-way, where the tf.data service lost the job
and `job_retry` goes on with a new one, leaves its steps before the failure
out of the window: the summaries average the steps after it.)
"""

from typing import Callable, ContextManager, Dict, List, Optional, Tuple

import tensorflow as tf

from trainer import console
from trainer import errors
from trainer import graph_code


class SummaryWindow:
  """Per-step sums since the last summary.

  Attributes:
    reports_norm: Whether the step returns a gradient norm (set when it is
      first traced).
  """

  def __init__(self, strategy: tf.distribute.Strategy, task_name: str,
               host_scope: Callable[[], ContextManager]):
    """Builds the window.

    Args:
      strategy: Runs the steps whose logs are added.
      task_name: The Task's class name, for warnings and errors.
      host_scope: Where variables live that steps add to in cross-replica
        context.
    """
    self._strategy = strategy
    self._task_name = task_name
    self._host_scope = host_scope
    # Loss, steps, gradient norm, steps with a finite norm, seconds waited
    # for input: in one variable so a step adds to it with one op.
    with host_scope():
      self._sums = tf.Variable(tf.zeros([5], tf.float64), trainable=False,
                               name="window_sums")
    self.reports_norm = False
    # Made at the first trace: the other scalars' sums, and their names.
    self._extras: Optional[tf.Variable] = None
    self._extra_names: List[str] = []
    self._dropped = set()  # Non-scalar names, warned about once.

  @graph_code.written_for_graphs
  def add(self, loss: tf.Tensor, logs: Dict[str, object],
          waited: tf.Tensor) -> tf.Tensor:
    """Adds a step's global loss, its logs' gradient norm and other scalars,
    and the seconds it waited for input; returns the updated sums (to order
    what must follow the step)."""
    return self.add_sums(self.step_sums(loss, logs, waited))

  def add_sums(self, step_sums: tf.Tensor) -> tf.Tensor:
    """Adds a step's `step_sums` in one op (steps that may run at once, on
    parameter-server workers, each add their own); returns the sums."""
    return self._sums.assign_add(step_sums)

  @graph_code.written_for_graphs
  def step_sums(self, loss: tf.Tensor, logs: Dict[str, object],
                waited: tf.Tensor) -> tf.Tensor:
    """Returns what a step adds to the sums (`value`): its global loss, a
    count, its logs' gradient norm, whether that norm is finite, and the
    seconds it waited for input; adds its other scalars to their own sums
    (only where the step returns any)."""
    self._add_extra_scalars(logs)
    norm = finite = tf.constant(0.0, tf.float64)
    if "gradient_norm" in logs:
      self.reports_norm = True
      # Computed from the summed gradients: the same on every replica.
      norm = self._strategy.experimental_local_results(
          logs["gradient_norm"])[0]
      # A skipped float16 step's norm is not finite; it would swamp the mean.
      is_finite = tf.math.is_finite(norm)
      finite = tf.cast(is_finite, tf.float64)
      norm = tf.where(is_finite, tf.cast(norm, tf.float64), 0.0)
    return tf.stack([tf.cast(loss, tf.float64), tf.constant(1.0, tf.float64),
                     norm, finite, waited])

  def value(self) -> tf.Tensor:
    """Returns the sums, `[loss, steps, norm, steps with a finite norm,
    seconds waited]`, for a loop to add its steps' `step_sums` to."""
    return self._sums.read_value()

  def assign(self, sums: tf.Tensor) -> tf.Operation:
    """Sets the sums to `sums`: `value` plus a loop's steps' `step_sums`."""
    return self._sums.assign(sums)

  @graph_code.written_for_graphs
  def _add_extra_scalars(self, logs: Dict[str, object]) -> None:
    """Adds the replica mean of every other scalar the step returned to the
    window.

    The window variable is made at the first trace, when the names are
    known, outside the function (`init_scope`), as Keras makes optimizer
    slots.

    Raises:
      errors.ConfigError: If a step returns other scalars than the first.
    """
    names = []
    for name in sorted(set(logs) - {"loss", "gradient_norm"}):
      value = self._strategy.experimental_local_results(logs[name])[0]
      if (isinstance(value, tf.Tensor) and value.shape.rank == 0 and
          (value.dtype.is_floating or value.dtype.is_integer)):
        names.append(name)
      elif name not in self._dropped:
        self._dropped.add(name)
        console.warning(
            f"{self._task_name}.train_step returned `{name}` "
            f"({getattr(value, 'shape', type(value).__name__)}): only "
            "scalars go to the train summaries")
    if not names:
      return
    if self._extras is None:
      with tf.init_scope(), self._host_scope():
        self._extras = tf.Variable(tf.zeros([len(names)], tf.float64),
                                   trainable=False, name="window_extras")
      self._extra_names = names
    if names != self._extra_names:
      raise errors.ConfigError(
          f"{self._task_name}.train_step returned the scalars "
          f"{names}, then {self._extra_names}: return the same keys in "
          "every step.")
    # The mean over replicas (a sum of per-replica shares, like `loss`,
    # would need the task to say so).
    means = [tf.cast(self._strategy.reduce(tf.distribute.ReduceOp.SUM,
                                           logs[name], axis=None), tf.float64)
             / self._strategy.num_replicas_in_sync for name in names]
    self._extras.assign_add(tf.stack(means))

  def read_and_reset(self) -> Tuple[Dict[str, float], float]:
    """Returns the window's means (`loss`, `gradient_norm` where the step
    reports one, the other scalars) and the seconds waited for input;
    resets the window."""
    loss, steps, norm, finite, waited = self._sums.numpy()
    results = {"loss": loss / max(steps, 1.0)}
    if self.reports_norm:
      results["gradient_norm"] = norm / max(finite, 1.0)
    if self._extras is not None:
      results.update(zip(self._extra_names,
                         self._extras.numpy() / max(steps, 1.0)))
      self._extras.assign(tf.zeros_like(self._extras))
    self._sums.assign(tf.zeros([5], tf.float64))
    return results, waited
