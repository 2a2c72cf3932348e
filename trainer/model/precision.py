"""Numeric precision: the tf_keras mixed-precision policy and loss scaling,
through Model Garden's `official.modeling.performance`."""

import tensorflow as tf
import tf_keras
from official.modeling import performance

from trainer import runtime as runtime_lib


def set_precision_policy(config: runtime_lib.RuntimeConfig) -> None:
  """Sets the global tf_keras mixed-precision policy from `config`."""
  performance.set_mixed_precision_policy(
      tf.dtypes.as_dtype(config.mixed_precision_dtype))


def wrap_optimizer(optimizer: tf_keras.optimizers.Optimizer,
                   config: runtime_lib.RuntimeConfig
                   ) -> tf_keras.optimizers.Optimizer:
  """Adds loss scaling to `optimizer` when training in float16."""
  loss_scale = None if config.loss_scale == "dynamic" else config.loss_scale
  return performance.configure_optimizer(
      optimizer,
      use_float16=config.mixed_precision_dtype == "float16",
      loss_scale=loss_scale)
