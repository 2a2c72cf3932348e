"""trainer.model.precision: the mixed-precision policy and loss scaling."""

import pytest
import tensorflow as tf
import tf_keras

from trainer import runtime as runtime_lib
from trainer.model import precision


@pytest.mark.parametrize("dtype,policy,scaled", [
    ("float32", "float32", False),
    ("bfloat16", "mixed_bfloat16", False),
    ("float16", "mixed_float16", True),
])
def test_precision_policy_and_loss_scaling(dtype, policy, scaled):
  config = runtime_lib.RuntimeConfig(mixed_precision_dtype=dtype)
  precision.set_precision_policy(config)
  assert tf_keras.mixed_precision.global_policy().name == policy
  optimizer = precision.wrap_optimizer(tf_keras.optimizers.SGD(0.1), config)
  assert isinstance(optimizer,
                    tf_keras.mixed_precision.LossScaleOptimizer) == scaled
  layer = tf_keras.layers.Dense(2)
  layer.build((None, 3))
  assert layer.kernel.dtype == tf.float32  # Variables stay float32.


def test_fixed_loss_scale():
  config = runtime_lib.RuntimeConfig(mixed_precision_dtype="float16",
                                 loss_scale=128)
  optimizer = precision.wrap_optimizer(tf_keras.optimizers.SGD(0.1), config)
  assert not optimizer.dynamic
  assert float(optimizer.loss_scale) == 128.0
