"""Weight averaging: Model Garden's EMA around the task's optimizer, and the
swap of the averaged weights into the model."""

import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer.model import ema as ema_lib
from trainer.model import optimization


def _ema_model():
  model = tf_keras.Sequential([tf_keras.Input((1,)),
                               tf_keras.layers.Dense(1, use_bias=False)])
  model.layers[0].kernel.assign([[1.0]])
  return model


@pytest.mark.parametrize("wrap_in_loss_scale", [False, True])
def test_ema_averages_the_weights_and_swaps_them_in(wrap_in_loss_scale):
  strategy = tf.distribute.get_strategy()
  model = _ema_model()
  optimizer = ema_lib.add(
      optimization.build_optimizer(
          optimization.OptimizerConfig(name="sgd", learning_rate=1.0),
          optimization.ScheduleConfig(), 100), model,
      ema_lib.EmaConfig(decay=0.5, dynamic_decay=False))
  if wrap_in_loss_scale:
    # Model Garden's own EMA fails here: the loss-scale optimizer passes
    # `experimental_aggregate_gradients`, which it does not take.
    optimizer = tf_keras.mixed_precision.LossScaleOptimizer(
        optimizer, dynamic=False, initial_scale=1.0)
  kernel = model.layers[0].kernel
  average = 0.0  # Model Garden's averages start at zero.
  for _ in range(3):
    optimizer.apply_gradients([(tf.constant([[0.25]]), kernel)])
    average = 0.5 * average + 0.5 * float(kernel.numpy()[0, 0])
  assert float(kernel.numpy()[0, 0]) == pytest.approx(0.25)
  with ema_lib.averaged_weights(optimizer, strategy) as averaged:
    assert averaged
    assert float(kernel.numpy()[0, 0]) == pytest.approx(average)
  assert float(kernel.numpy()[0, 0]) == pytest.approx(0.25)
  assert ema_lib.find(optimizer) is not None


def test_ema_needs_a_legacy_optimizer():
  with pytest.raises(trainer.ConfigError, match="needs a `tf_keras.optimizers"
                     r".legacy` optimizer .* the task's is Adam\.$"):
    ema_lib.add(tf_keras.optimizers.Adam(), _ema_model(),
                ema_lib.EmaConfig(decay=0.9))
