"""`idle_optimizers`: a Task of several models must step every optimizer."""

import pytest
import tf_keras

from trainer import errors
from trainer.loop.runner import idle_optimizers


def _optimizer(steps: int) -> tf_keras.optimizers.Optimizer:
  optimizer = tf_keras.optimizers.SGD(0.1)
  optimizer.iterations.assign(steps)
  return optimizer


def test_the_optimizers_that_took_no_step_are_named_in_order():
  optimizers = {"generator": _optimizer(1), "discriminator": _optimizer(0),
                "classifier": _optimizer(0)}
  with pytest.raises(errors.ConfigError) as raised:
    idle_optimizers.check("Gan", optimizers)
  assert str(raised.value) == (
      "Gan.train_step applied no gradients with the optimizer of "
      "'classifier', 'discriminator': call `trainer.minimize(tape, loss, "
      "model.trainable_variables, optimizer[name])` for each trained model, "
      "or freeze the model (`model.trainable = False`), which then gets no "
      "optimizer.")


def test_a_wrapped_optimizer_counts_its_inner_steps():
  inner = _optimizer(2)
  wrapped = tf_keras.mixed_precision.LossScaleOptimizer(inner)
  idle_optimizers.check("Gan", {"generator": wrapped, "critic": _optimizer(1)})


def test_one_optimizer_is_not_checked():
  idle_optimizers.check("Regression", _optimizer(0))
