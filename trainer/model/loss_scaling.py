"""The first-step check of an overridden `train_step`'s loss scaling.

On N replicas a step's loss must be this replica's share of the global-batch
mean: per-example losses summed and divided by the GLOBAL batch
(`tf.nn.compute_average_loss`). A `tf.reduce_mean` over the replica's own
batch trains too, with N times the loss and N times every gradient (the
replicas' gradients are summed), and nothing fails. So on the first step of
a new run on several replicas, with the Task's own `train_step`, the same
batch also goes through the model and `build_losses` (`reference_losses`),
and `check` stops the run where the step's loss, summed over replicas, is N
times their global mean.

The reference forward pass runs in training mode, so that batch
normalisation sees the same batch statistics as the step (in inference mode
its moving statistics, untrained at the first step, give another loss); the
variables it may write (moving statistics, a random generator's state) are
read before it and written back after, so the step runs on exactly the state
it would have run on without the check. A Task whose model or `build_losses`
cannot be called that way (its own step calls them otherwise) is not
checked: the error tracing the reference raises is dropped. Dropout makes
the two passes differ a little; the band is wide (a correct loss is within
a few per cent of the reference; the mistake gives N times it).

A Task of several models (`trainer.model.named`) has no one model for its
`build_losses` (a GAN's losses are the models' outputs on each other's), so
its reference is its own step (`OneDeviceStep`): on one device the mistake
and the correct scaling give the same loss, so the first replica's batch
goes through the same `train_step` on one device, on copies of the models
made before the first step, and `check_several` stops the run where the
first replica's loss is N times its 1/N share of that one-device loss.
"""

import concurrent.futures
import math
from typing import Any, List, Optional, Tuple

import tensorflow as tf
import tf_keras

from trainer import console
from trainer import errors
from trainer import user_errors
from trainer.model import named
from trainer.model import task as task_lib

# How far from N times the reference a loss may be and still be the mistake:
# within 20 % of it (N >= 2 keeps the band clear of 1, a correct loss).
TOLERANCE = 0.2


# The fix, the same for both checks.
_FIX = ("average over the GLOBAL batch: "
        "tf.nn.compute_average_loss(per_example_losses) "
        "(`trainer.check_loss_scaling=False` skips this check).")


def applies(task: task_lib.Task, model, num_replicas: int) -> bool:
  """Whether a new run of `task` on `num_replicas` replicas is checked: the
  Task overrides `train_step` and builds several models, or one model and
  its own `build_losses`."""
  return (num_replicas > 1 and task_lib.overrides(task, "train_step") and
          (named.several(model) or
           task_lib.overrides(task, "build_losses")))


def _restorable(model: tf_keras.Model) -> List[tf.Variable]:
  """The variables a forward pass on a replica can write: a replica may
  assign only those synchronised on read or aggregated on write (batch
  normalisation's moving statistics are the first kind)."""
  return [v for v in model.non_trainable_variables
          if v.synchronization == tf.VariableSynchronization.ON_READ or
          v.aggregation != tf.VariableAggregation.NONE]


def reference_losses(task: task_lib.Task, model: tf_keras.Model,
                     inputs) -> Tuple[tf.Tensor, tf.Tensor]:
  """Runs this replica's batch through the model and `build_losses`,
  leaving the model's state as it was.

  Returns:
    The sum of the per-example losses and their count, float64, to be
    summed over replicas.
  """
  features, labels = inputs
  variables = _restorable(model)
  saved = [tf.identity(v.read_value()) for v in variables]
  try:
    outputs = task_lib.float32_outputs(model(features, training=True))
    losses = tf.cast(task.build_losses(labels, outputs), tf.float64)
    total = tf.reduce_sum(losses)
    count = tf.cast(tf.size(losses), tf.float64)
  except errors.ConfigError:
    raise  # A mistake in `build_losses` the default steps name as well.
  except Exception:  # pylint: disable=broad-except
    # Traced only: the Task's own step calls them otherwise. A count of 0
    # says nothing.
    total = count = tf.constant(0.0, tf.float64)
  with tf.control_dependencies([total, count]):
    restores = [v.assign(value) for v, value in zip(variables, saved)]
  with tf.control_dependencies(restores):
    return tf.identity(total), tf.identity(count)


def check(task_name: str, num_replicas: int, loss: float, total: float,
          count: float) -> None:
  """Stops the run if the first step's `loss` (summed over replicas) is
  `num_replicas` times the global mean `total / count` of `build_losses`.

  Raises:
    errors.ConfigError: Naming the figures and the fix.
  """
  ratio = _ratio(loss, total, count)
  if ratio is None or abs(ratio / num_replicas - 1.0) > TOLERANCE:
    return
  raise errors.ConfigError(
      f"{task_name}.train_step's loss on the first step, summed over "
      f"{num_replicas} replicas, is {loss:.4g}: {ratio:.2f} times the "
      f"global-batch mean of build_losses on the same batch "
      f"({total / count:.4g}), so it is averaged over each replica's batch "
      f"and every gradient is {num_replicas} times too large; " + _FIX)


def _ratio(loss: float, total: float, count: float) -> Optional[float]:
  """`loss` over the mean loss, or None where it says nothing (no examples,
  a non-finite or non-positive figure)."""
  if not all(map(math.isfinite, (loss, total, count))) or count <= 0:
    return None
  mean = total / count
  if mean <= 0 or loss <= 0:
    return None
  return loss / mean


class OneDeviceStep:
  """A Task's own `train_step` on one device (the host's CPU: no
  accelerator memory), on copies of its several models.

  The copies are built by `build_model` when the object is made, with the
  weights the models have then (before the first step); each trained model
  gets SGD at learning rate 0 (wrapped for float16 loss scaling where the
  run's optimizer is), so the step leaves the copies as they were, and
  fresh metrics. A Task whose models cannot be copied or whose step cannot
  run there is not checked: `loss` prints a line saying why.

  Both run in a thread of their own: the run's loop is inside its
  strategy's scope, which is per thread, and TensorFlow refuses to enter
  another strategy's scope inside it.
  """

  def __init__(self, task: task_lib.Task, models, optimizers):
    self._task = task
    self._strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    self._failure = None
    try:
      # Read here, in the run's strategy: its variables refuse another's.
      weights = [w.numpy() for w in named.weights(models)]
      _alone(self._copy, weights, optimizers)
    except Exception as e:  # pylint: disable=broad-except
      self._failure = e

  def _copy(self, weights, optimizers) -> None:
    """Builds the copies, with `weights` (`named.weights`' values)."""
    with self._strategy.scope():
      self._models = self._task.build_model()
      copies = named.weights(self._models)
      if [tuple(w.shape) for w in copies] != [w.shape for w in weights]:
        raise ValueError("build_model built other weights the second time")
      for copy, value in zip(copies, weights):
        copy.assign(value)
      self._optimizers = {
          name: _still(optimizer)
          for name, optimizer in named.named(optimizers).items()}
      self._metrics = self._task.build_metrics(training=True)

  def _loss(self, batch: Any) -> float:
    step = tf.function(lambda inputs: self._strategy.run(
        self._task.train_step,
        args=(inputs, self._models, self._optimizers, self._metrics)))
    return float(step(batch)["loss"])

  def loss(self, batch: Any) -> Optional[float]:
    """What the step reports as `loss` for `batch` (one replica's), or None
    where it cannot run (a line says why)."""
    if self._failure is None:
      try:
        return _alone(self._loss, batch)
      except Exception as e:  # pylint: disable=broad-except
        self._failure = e
    console.warning(
        f"{type(self._task).__name__}.train_step's loss scaling is not "
        "checked: its step could not run on one device for the reference "
        f"({user_errors.cause(self._failure)}); scripts/check_task.py with "
        "these gin files checks it against one device")
    return None


def _alone(fn, *args):
  """`fn(*args)`, in a thread of its own (outside the run's strategy)."""
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(fn, *args).result()


def _still(optimizer: tf_keras.optimizers.Optimizer
           ) -> tf_keras.optimizers.Optimizer:
  """SGD at learning rate 0, loss-scaled where `optimizer` is."""
  sgd = tf_keras.optimizers.SGD(0.0)
  if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
    return tf_keras.mixed_precision.LossScaleOptimizer(sgd)
  return sgd


def check_several(task_name: str, num_replicas: int, loss: float,
                  reference: Optional[float]) -> None:
  """Stops the run if the first replica's first-step `loss` is
  `num_replicas` times its share of `reference`, what the same step reports
  for that replica's batch on one device (`OneDeviceStep`).

  Raises:
    errors.ConfigError: Naming the figures and the fix.
  """
  if (reference is None or not math.isfinite(loss) or
      not math.isfinite(reference) or reference == 0):
    return
  ratio = loss * num_replicas / reference
  if abs(ratio / num_replicas - 1.0) > TOLERANCE:
    return
  raise errors.ConfigError(
      f"{task_name}.train_step's loss on the first step, on replica 1 of "
      f"{num_replicas}, is {loss:.4g}: {ratio:.2f} times its share (1/"
      f"{num_replicas}) of what the same step reports for that replica's "
      f"batch on one device ({reference:.4g}), so it is averaged over each "
      f"replica's batch and every gradient is {num_replicas} times too "
      "large; " + _FIX)
