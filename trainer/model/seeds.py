"""Seeds and op determinism, set before the model is built so that runs
start from the same weights (`runtime.seed`, `runtime.deterministic`)."""

import tensorflow as tf
import tf_keras

from trainer import runtime as runtime_lib


def seed_everything(config: runtime_lib.RuntimeConfig) -> None:
  """Seeds Python, NumPy and TensorFlow from `config.seed` if it is set.

  With `config.deterministic`, also makes TensorFlow's ops deterministic and
  seeds with 0 when no seed is set.
  """
  seed = config.seed
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
    seed = 0 if seed is None else seed
  if seed is not None:
    tf_keras.utils.set_random_seed(seed)
