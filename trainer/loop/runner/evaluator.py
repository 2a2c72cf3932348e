"""`TaskEvaluator`: the Orbit evaluator built from a `Task`, the inner eval
loop; `SetsEvaluator`: one of them for each named evaluation set.

It owns `strategy.run` over the eval split, the mean loss over every
evaluated example, and Model Garden's aggregation contract
(`aggregate_logs`, `reduce_aggregated_logs`); the Task owns the per-replica
maths. With named sets (`trainer.data.eval_sets`) each set has its own
`TaskEvaluator`, so its own metrics, input and aggregation, and the partial
last batch of each set is split over the replicas as one set's is.
"""

import contextlib
from typing import Callable, ContextManager, Dict, Mapping, Optional

import numpy as np
import orbit
import tensorflow as tf
import tf_keras

from trainer import errors
from trainer.data import data_loss
from trainer.data import eval_sets
from trainer.data import inputs as inputs_lib
from trainer.model import named
from trainer.model import task as task_lib


class TaskEvaluator(orbit.StandardEvaluator):
  """Runs a Task's `validation_step` over the eval split on every replica.

  Results: `loss` (mean per-example loss over every evaluated example), each
  task metric by name, and whatever `reduce_aggregated_logs` returns.
  """

  def __init__(self, task: task_lib.Task, model: tf_keras.Model,
               strategy: tf.distribute.Strategy,
               eval_input: inputs_lib.DistributedInput,
               global_step: tf.Variable, *, run_eagerly: bool = False,
               weights: Callable[[], ContextManager] = contextlib.nullcontext,
               set_name: Optional[str] = None):
    """Builds the evaluator.

    Args:
      task: Supplies `validation_step`, the eval metrics and aggregation.
      model: The model, built in `strategy.scope()`.
      strategy: Runs the replica steps.
      eval_input: The eval batches and their split over replicas.
      global_step: Passed to `reduce_aggregated_logs`.
      run_eagerly: Run steps without `tf.function`.
      weights: A context in which the model holds the weights to evaluate
        (the EMA averages, say); entered around every evaluation.
      set_name: The evaluation set's name, for messages; None for a Task's
        one unnamed set.
    """
    if named.several(model) and not task_lib.overrides(task,
                                                       "validation_step"):
      raise errors.ConfigError(
          f"{type(task).__name__} builds several models "
          f"({', '.join(model)}): it must override `validation_step`, which "
          "gets them by name.")
    self.task = task
    self.model = model
    self.strategy = strategy
    self.global_step = global_step
    self._input = eval_input
    with strategy.scope():
      self.metrics = task.build_metrics(training=False)
      self._loss = tf_keras.metrics.Mean("loss")
    # Only a task that aggregates outputs pays for returning them.
    self._aggregates = task_lib.overrides(task, "aggregate_logs")
    self._requested_steps = -1  # Of the current evaluation; -1: all.
    self._steps_run = 0
    self._logs_spec = _LogsSpec()
    self._weights = weights
    self.set_name = set_name
    self.images: Dict[str, np.ndarray] = {}  # Of the last evaluation.
    super().__init__(
        eval_input.dataset,
        options=orbit.StandardEvaluatorOptions(
            use_tf_function=not run_eagerly))

  def evaluate(self, num_steps: tf.Tensor):
    """Evaluates with the model holding the weights to evaluate.

    Raises:
      errors.ConfigError: If the eval set ended before `num_steps` batches,
        or `validation_step` synchronises the replicas.
      errors.RunError: If an input file is damaged, naming it.
    """
    self._requested_steps = int(num_steps)
    with self._weights():
      try:
        return super().evaluate(num_steps)
      except tf.errors.InvalidArgumentError as e:
        mistake = task_lib.broadcast_error(e)
        if mistake is None:
          raise
        raise mistake from e
      except tf.errors.DataLossError as e:
        raise errors.RunError(data_loss.describe(e, self._input.dataset)
                              ) from e
      except RuntimeError as e:
        if "`merge_call` called while defining" not in str(e):
          raise
        # A synchronisation point inside the `tf.cond` of `_replica_step`.
        raise errors.ConfigError(
            f"{type(self.task).__name__}.validation_step synchronises the "
            "replicas (an all-reduce, say), which this evaluation set "
            "cannot allow: its last batch leaves a replica without examples "
            "(or its size is unknown), and that replica skips the step. "
            "Return per-example values and reduce them in `aggregate_logs`, "
            "or use a metric.") from e

  def eval_begin(self):
    self._steps_run = 0
    for metric in self.metrics + [self._loss]:
      metric.reset_state()
    # No state yet: as in Model Garden, the first step's logs reach
    # `aggregate_logs` with `state=None`.
    return None

  def _replica_step(self, inputs):
    if not self._input.may_leave_replicas_empty:
      return self._validation_step(inputs)
    # A last batch smaller than the replica count leaves replicas with no
    # example, and a model called on an empty batch is not safe: oneDNN's
    # Conv2D and BiasAdd fail on one ("input depth must be evenly divisible
    # by filter depth"). Such a replica skips `validation_step`: what it
    # would add to the loss and the metrics (nothing) is exact without it,
    # where padding would need a weight for every example, which neither
    # `validation_step` nor the metrics take. Its logs for `aggregate_logs`
    # are empty: no row where they have one per example, 0 for a scalar.
    # (Inside `tf.cond`, a `validation_step` may not synchronise the
    # replicas, an all-reduce say: `evaluate` says so.)
    count = tf.shape(tf.nest.flatten(inputs)[0])[0]
    return tf.cond(count > 0, lambda: self._validation_step(inputs),
                   self._no_logs)

  def _validation_step(self, inputs):
    """`validation_step` on this replica's examples; folds the loss into
    the mean and returns the other logs."""
    logs = dict(self.task.validation_step(inputs, self.model, self.metrics))
    self._loss.update_state(logs.pop("loss"))
    # What `_no_logs` gives a replica without examples has this structure.
    self._logs_spec.value = tf.nest.map_structure(_spec, logs)
    return logs

  def _no_logs(self):
    """The logs of a replica given no example, shaped as its others'.

    `tf.cond` builds its true branch (`_validation_step`) first; running
    eagerly, the first replica, which always has examples, runs first.
    """
    if self._logs_spec.value is None:
      raise RuntimeError("the empty logs were asked for before the logs "
                         "of a replica with examples were built.")
    return tf.nest.map_structure(_empty, self._logs_spec.value)

  def eval_step(self, iterator):
    batch = self._input.split(next(iterator))
    logs = self.strategy.run(self._replica_step, args=(batch,))
    if not self._aggregates:
      return None
    return tf.nest.map_structure(self.strategy.experimental_local_results,
                                 logs)

  def eval_reduce(self, state=None, step_outputs=None):
    self._steps_run += 1  # Called eagerly after every step.
    if not self._aggregates:
      return None
    return self.task.aggregate_logs(state, step_outputs)

  def eval_end(self, aggregated_logs=None) -> Dict[str, float]:
    if not self._loss.count.numpy():
      # Losses of 0.0 would be reported, and look like the best ever.
      dataset = ("the evaluation dataset" if self.set_name is None else
                 f"the evaluation set {self.set_name!r}")
      raise errors.ConfigError(
          f"{dataset} yielded no example (filtered out entirely?); "
          "`build_inputs(training=False)` must return some.")
    # The input ended before the steps asked for (its size was unknown).
    inputs_lib.check_validation_steps(self._requested_steps, self._steps_run,
                                      self.set_name)
    results = {"loss": self._loss.result()}
    results.update({metric.name: metric.result() for metric in self.metrics})
    if self._aggregates:
      results.update(self.task.reduce_aggregated_logs(
          aggregated_logs, global_step=self.global_step))
    # Images ([height, width, channels]) go to `images`, for the image
    # summaries and PNG files written after the evaluation.
    self.images = {name: np.asarray(value) for name, value in results.items()
                   if np.ndim(value) == 3}
    # Python floats print readably in Orbit's eval line.
    return {name: float(value) for name, value in results.items()
            if name not in self.images}


class _LogsSpec:
  """The structure, shapes and types of `validation_step`'s logs (less the
  loss) once built. A plain object: `tf.Module` would wrap a dict attribute
  in a tracking proxy."""

  value = None


def _spec(value) -> tf.TensorSpec:
  """The shape and type of a log `validation_step` returned."""
  value = tf.convert_to_tensor(value)
  return tf.TensorSpec(value.shape, value.dtype)


def _empty(spec: tf.TensorSpec) -> tf.Tensor:
  """A log with no example: no row (other sizes unknown: 0), or 0 for a
  scalar."""
  if spec.shape.rank == 0:
    return tf.zeros([], spec.dtype)
  if spec.shape.rank is None:
    return tf.zeros([0], spec.dtype)
  return tf.zeros([0] + [size or 0 for size in spec.shape[1:]], spec.dtype)


class SetsEvaluator(orbit.AbstractEvaluator):
  """Evaluates every named evaluation set, each with its own
  `TaskEvaluator`, and names each result `<set>/<metric>`.

  Attributes:
    evaluators: Each set's evaluator, by name, in evaluation order.
  """

  def __init__(self, evaluators: Mapping[str, TaskEvaluator],
               steps: eval_sets.Steps = -1,
               weights: Callable[[], ContextManager] = contextlib.nullcontext):
    """Builds the evaluator.

    Args:
      evaluators: Each set's evaluator, by name (built without `weights`).
      steps: `trainer.validation_steps`: with counts by set name, each
        set's own count (a set not named: a full pass); one count is what
        the controller passes to `evaluate`.
      weights: A context in which the model holds the weights to evaluate;
        entered once around all the sets.
    """
    self.evaluators = dict(evaluators)
    # A function, not the dict: `tf.Module` would wrap a dict attribute in
    # a tracking proxy that is no `Mapping`.
    counts = dict(steps) if isinstance(steps, Mapping) else None
    self._steps_of = (None if counts is None else
                      lambda name: eval_sets.steps_for(counts, name))
    self._weights = weights

  def evaluate(self, num_steps: tf.Tensor) -> Dict[str, float]:
    """Evaluates each set with fresh metrics; returns `<set>/<metric>`.

    Args:
      num_steps: Batches of every set (-1: a full pass), where
        `trainer.validation_steps` does not count them by set.

    Raises:
      errors.ConfigError, errors.RunError: As `TaskEvaluator.evaluate`,
        naming the set; nothing is returned for the sets done before.
    """
    results = {}
    with self._weights():
      for name, evaluator in self.evaluators.items():
        steps = (int(num_steps) if self._steps_of is None else
                 self._steps_of(name))
        output = evaluator.evaluate(tf.convert_to_tensor(steps, tf.int32))
        results.update({eval_sets.result_name(name, metric): value
                        for metric, value in output.items()})
    return results

  @property
  def images(self) -> Dict[str, np.ndarray]:
    """The last evaluation's images, as `<set>/<name>`."""
    return {eval_sets.result_name(name, image): value
            for name, evaluator in self.evaluators.items()
            for image, value in evaluator.images.items()}
