"""The digits as a `fit` user has them: a model function written with
`tf.keras` and datasets of `(x, y)` examples, for `KerasModelTask`
(`gin/keras_model.gin`).

`tf.keras` here is tf_keras: `train.py` imports `trainer` first, which
selects Keras 2 before TensorFlow first touches `tf.keras`.
"""

import gin
import tensorflow as tf

from tasks import digits


@gin.configurable
def digits_keras_model() -> tf.keras.Model:
  """The digits CNN of `DigitsClassification`, written with `tf.keras`."""
  return tf.keras.Sequential([
      tf.keras.Input((8, 8, 1)),
      tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
      tf.keras.layers.Conv2D(64, 3, activation="relu"),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128, activation="relu"),
      tf.keras.layers.Dense(digits.NUM_CLASSES),
  ], name="digits_cnn")


@gin.configurable
def digits_train_examples() -> tf.data.Dataset:
  """The 1,437 training digits, `(image [8, 8, 1], label)`, in order."""
  return tf.data.Dataset.from_tensor_slices(digits.load_split(True))


@gin.configurable
def digits_eval_examples() -> tf.data.Dataset:
  """The 360 validation digits, `(image [8, 8, 1], label)`."""
  return tf.data.Dataset.from_tensor_slices(digits.load_split(False))
