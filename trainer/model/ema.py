"""Weight averaging (EMA), bound as `ema.<name>`: Model Garden's
`ExponentialMovingAverage` optimizer around the task's, and the swap that
puts the averaged weights into the model for evaluation and export.
"""

import contextlib
import dataclasses
from typing import Iterator, Optional

import gin
import tensorflow as tf
import tf_keras
from official.modeling.optimization import ema_optimizer

from trainer import checks
from trainer import errors
from trainer.model import optimization


@gin.configurable("ema")
@dataclasses.dataclass(frozen=True)
class EmaConfig:
  """An exponential moving average of the weights, bound as `ema.<name>`.

  When `decay` is set, evaluations, the best checkpoint and SavedModel
  exports use the averaged weights; checkpoints hold both.

  Attributes:
    decay: The averaging decay (e.g. 0.999); None turns EMA off.
    start_step: Averaging starts at this step (the average follows the
      weights before it).
    dynamic_decay: Ramp the decay up as `min(decay, (1 + t) / (10 + t))`,
      `t` the steps since `start_step` (as `tf.train.ExponentialMovingAverage`
      with `num_updates`).
    trainable_weights_only: Average only trainable weights; False averages
      every weight (batch-norm statistics too).
    model: With several models (`trainer.model.named`), the one averaged.
  """
  decay: Optional[float] = None
  start_step: int = 0
  dynamic_decay: bool = True
  trainable_weights_only: bool = True
  model: Optional[str] = None

  def __post_init__(self):
    checks.require(
        self.decay is None or (checks.is_number(self.decay) and
                               0 < self.decay < 1),
        f"`ema.decay` ({self.decay!r}) must be in (0, 1), or None.")
    checks.integer("ema.start_step", self.start_step, minimum=0)

  @property
  def enabled(self) -> bool:
    return self.decay is not None


class ExponentialMovingAverage(ema_optimizer.ExponentialMovingAverage):
  """Model Garden's EMA optimizer, passing on how gradients are aggregated.

  Model Garden's `apply_gradients` drops `experimental_aggregate_gradients`:
  gradients the training step already summed over replicas would be summed
  again, and a `LossScaleOptimizer` around it (float16), which always
  passes the argument, fails with a TypeError.
  """

  def apply_gradients(self, grads_and_vars, name: Optional[str] = None,
                      experimental_aggregate_gradients: bool = True):
    result = self._optimizer.apply_gradients(
        grads_and_vars, name,
        experimental_aggregate_gradients=experimental_aggregate_gradients)
    ema_optimizer.maybe_merge_call(self.update_average,
                                   tf.distribute.get_strategy())
    return result


def add(optimizer: tf_keras.optimizers.Optimizer, model: tf_keras.Model,
            config: EmaConfig) -> tf_keras.optimizers.Optimizer:
  """Wraps `optimizer` to average `model`'s weights; call in the scope.

  Raises:
    errors.ConfigError: If `optimizer` is not a legacy tf_keras optimizer,
      the only kind Model Garden's EMA wraps.
  """
  if not config.enabled:
    return optimizer
  if not isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
    raise errors.ConfigError(
        "`ema.decay` needs a `tf_keras.optimizers.legacy` optimizer (Model "
        f"Garden's EMA wraps no other); the task's is "
        f"{type(optimizer).__name__}.")
  ema = ExponentialMovingAverage(
      optimizer, trainable_weights_only=config.trainable_weights_only,
      average_decay=config.decay, start_step=config.start_step,
      dynamic_decay=config.dynamic_decay)
  ema.shadow_copy(model)
  return ema


def find(optimizer: Optional[tf_keras.optimizers.Optimizer]
             ) -> Optional[ExponentialMovingAverage]:
  """Returns the EMA optimizer inside `optimizer` (or itself), or None."""
  return next((wrapper for wrapper in optimization.wrappers(optimizer) if isinstance(
      wrapper, ema_optimizer.ExponentialMovingAverage)), None)


@contextlib.contextmanager
def averaged_weights(optimizer: Optional[tf_keras.optimizers.Optimizer],
                     strategy: tf.distribute.Strategy) -> Iterator[bool]:
  """Puts the EMA weights into the model for the `with` block, if any.

  Yields:
    Whether the model holds averaged weights inside the block.
  """
  ema = find(optimizer)
  if ema is None:
    yield False
    return
  _swap(ema, strategy)
  try:
    yield True
  finally:
    _swap(ema, strategy)


def _swap(ema: ExponentialMovingAverage,
          strategy: tf.distribute.Strategy) -> None:
  with strategy.scope():
    if tf.distribute.in_cross_replica_context():
      ema.swap_weights()
    else:
      # TensorFlow's default strategy has no cross-replica context, which
      # Model Garden's `swap_weights` demands; the swap it runs works there.
      ema._swap_weights()  # pylint: disable=protected-access
