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
"""

import math
from typing import List, Optional, Tuple

import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import named
from trainer import task as task_lib

# How far from N times the reference a loss may be and still be the mistake:
# within 20 % of it (N >= 2 keeps the band clear of 1, a correct loss).
TOLERANCE = 0.2


def applies(task: task_lib.Task, model, num_replicas: int) -> bool:
  """Whether a new run of `task` on `num_replicas` replicas is checked: the
  Task overrides `train_step` and defines `build_losses`, and builds one
  model."""
  return (num_replicas > 1 and not named.several(model) and
          task_lib.overrides(task, "train_step") and
          task_lib.overrides(task, "build_losses"))


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
      f"and every gradient is {num_replicas} times too large; average over "
      "the GLOBAL batch: tf.nn.compute_average_loss(per_example_losses) "
      "(`trainer.check_loss_scaling=False` skips this check).")


def _ratio(loss: float, total: float, count: float) -> Optional[float]:
  """`loss` over the mean loss, or None where it says nothing (no examples,
  a non-finite or non-positive figure)."""
  if not all(map(math.isfinite, (loss, total, count))) or count <= 0:
    return None
  mean = total / count
  if mean <= 0 or loss <= 0:
    return None
  return loss / mean
