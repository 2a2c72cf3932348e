"""The loop's part of the loss-scaling check on a new run's first step.

`trainer.model.loss_scaling` holds the check's maths; this module runs it:
the first loop of a new run runs its first step alone, with the reference
losses of the step's batch (`loss_scaling.reference_losses`) or, with
several models, the first replica's batch and loss recorded; then the loop's
other steps; then `check` compares. The step is traced twice, not three
times (measured on a ResNet-18). Orbit has no hook between a loop's steps,
so the first loop is replaced for that one call.
"""

from typing import Callable, List

import tensorflow as tf

from trainer import graph_code
from trainer.model import loss_scaling
from trainer.model import named
from trainer.model import task as task_lib

# `loop(iterator, num_steps, check_first_step=False)`: the trainer's loop.
LoopFn = Callable[..., object]


class FirstStepCheck:
  """Checks an overridden `train_step`'s loss scaling on the first step of
  a new run of such a Task on several replicas.

  Attributes:
    pending: Whether the first loop is still to be checked (only a new
      run's is).
  """

  def __init__(self, task: task_lib.Task, model, optimizer,
               strategy: tf.distribute.Strategy, status: tf.Variable,
               enabled: bool):
    """Builds the check.

    Args:
      task: The Task; its `train_step` runs the checked step.
      model: Its model, or models by name.
      optimizer: Its optimizer, or optimizers by name.
      strategy: Runs the replica steps.
      status: The trainer's loop status (mean loss, non-finite step,
        learning rate, step), which the first loop reports through.
      enabled: `trainer.check_loss_scaling`.
    """
    self._task = task
    self._model = model
    self._optimizer = optimizer
    self._strategy = strategy
    self._status = status
    self.pending = enabled and loss_scaling.applies(
        task, model, strategy.num_replicas_in_sync)
    # The first step's loss and: for one model, the sum and count of
    # `build_losses` on its batch; for several, the first replica's loss
    # and 0.
    self._losses = tf.Variable(tf.zeros([3], tf.float64), trainable=False,
                               name="loss_check")
    self._one_device = None
    self._first_batch: List[object] = []

  def starts(self, global_step: tf.Variable) -> bool:
    """Whether the coming loop is a new run's first, to be checked; asked
    once (a resumed run was checked when it was new)."""
    if not self.pending:
      return False
    self.pending = False
    return not int(global_step.numpy())

  def first_loop(self, loop_fn: LoopFn) -> Callable[[object, tf.Tensor],
                                                     None]:
    """Returns `loop_fn`'s first loop: the checked step alone, then the
    loop's other steps, reported as one loop."""
    if named.several(self._model):
      # Copies of the models, made before the step updates them.
      self._one_device = loss_scaling.OneDeviceStep(
          self._task, self._model, self._optimizer)

    def first_loop(iterator, num_steps):
      self._first_batch.append(
          loop_fn(iterator, num_steps, check_first_step=True))
      first_loss, nonfinite_step, _, _ = self._status.numpy()
      rest = int(num_steps) - 1
      if nonfinite_step >= 0 or rest <= 0:
        return
      loop_fn(iterator, tf.constant(rest, tf.int32))
      mean_loss, nonfinite_step, rate, step = self._status.numpy()
      self._status.assign([(first_loss + rest * mean_loss) / (rest + 1),
                           nonfinite_step, rate, step])

    return first_loop

  def check(self) -> None:
    """Checks what the first loop recorded.

    Raises:
      errors.ConfigError: If the step's loss is averaged per replica.
    """
    loss, total, count = self._losses.numpy()
    name = type(self._task).__name__
    replicas = self._strategy.num_replicas_in_sync
    if self._one_device is not None:
      loss_scaling.check_several(name, replicas, total,
                                 self._one_device.loss(self._first_batch[0]))
      return
    loss_scaling.check(name, replicas, loss, total, count)

  def replica_step(self, replica_step: Callable) -> Callable:
    """Returns `replica_step` run after the reference losses of its batch
    (on the weights before the update: automatic control dependencies order
    variable reads and writes as written), returning `(logs, reference)`;
    with several models, the step alone (its reference runs on one device,
    `loss_scaling.OneDeviceStep`)."""

    def checked(inputs):
      if named.several(self._model):
        return replica_step(inputs), ()
      reference = loss_scaling.reference_losses(self._task, self._model,
                                                inputs)
      with tf.control_dependencies(reference):
        return replica_step(inputs), reference

    return checked

  @graph_code.written_for_graphs
  def record(self, loss: tf.Tensor, logs, batch, reference):
    """Records the checked step's global loss with its reference: the sum
    and count of the reference losses, or with several models the first
    replica's loss; returns the first replica's batch with several models,
    else None."""
    strategy = self._strategy
    if named.several(self._model):
      first = tf.cast(strategy.experimental_local_results(logs["loss"])[0],
                      tf.float64)
      zero = tf.constant(0.0, tf.float64)
      self._losses.assign(tf.stack([tf.cast(loss, tf.float64), first, zero]))
      return strategy.experimental_local_results(batch)[0]
    total, count = (strategy.reduce(tf.distribute.ReduceOp.SUM, value,
                                    axis=None) for value in reference)
    self._losses.assign(tf.stack([tf.cast(loss, tf.float64), total, count]))
    return None
