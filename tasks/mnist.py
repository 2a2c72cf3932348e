"""`MnistClassification`: tfds `mnist` with the CNN of TensorFlow's
distributed-training tutorial (Conv2D 32x3 relu, MaxPool, Flatten, Dense 64
relu, Dense 10).
"""

from typing import Optional

import gin
import tensorflow as tf
import tf_keras

from tasks import classification
from tasks import tfds_inputs


@gin.configurable
class MnistClassification(classification.ClassificationTask):
  """The tutorial CNN on MNIST; the data comes from tensorflow-datasets."""

  def __init__(self, data_dir: Optional[str] = None,
               shuffle_buffer: int = 10000, shuffle_seed: int = 0):
    """Configures the task.

    Args:
      data_dir: Where tfds keeps `mnist` (prepared beforehand; nothing is
        downloaded at training time). None is tfds's default.
      shuffle_buffer: Examples in the training shuffle buffer.
      shuffle_seed: Seeds the training order.
    """
    self.data_dir = data_dir
    self.shuffle_buffer = shuffle_buffer
    self.shuffle_seed = shuffle_seed

  def build_model(self) -> tf_keras.Model:
    return tf_keras.Sequential([
        tf_keras.Input((28, 28, 1)),
        tf_keras.layers.Conv2D(32, 3, activation="relu"),
        tf_keras.layers.MaxPooling2D(),
        tf_keras.layers.Flatten(),
        tf_keras.layers.Dense(64, activation="relu"),
        tf_keras.layers.Dense(10),
    ], name="mnist_cnn")

  def build_inputs(self, training, input_context=None) -> tf.data.Dataset:
    dataset = tfds_inputs.load_shard(
        "mnist", "train" if training else "test", data_dir=self.data_dir,
        input_context=input_context, shuffle_files=training,
        shuffle_seed=self.shuffle_seed)
    dataset = dataset.map(_normalize, num_parallel_calls=tf.data.AUTOTUNE)
    if training:
      dataset = dataset.shuffle(self.shuffle_buffer, seed=self.shuffle_seed)
    return dataset


def _normalize(image, label):
  return tf.cast(image, tf.float32) / 255.0, tf.cast(label, tf.int32)
