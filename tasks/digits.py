"""`DigitsClassification`: scikit-learn's embedded 8x8 digits, no download.

The 1,797 images ship inside scikit-learn. A fixed permutation (seed 0) puts
1,437 images in the training split and 360 in the validation split, the same
on every machine.
"""

import gin
import numpy as np
import tensorflow as tf
import tf_keras

from tasks import classification
from trainer.data import inputs

NUM_CLASSES = 10
NUM_TRAIN = 1437


def load_split(training: bool):
  """Returns `(images [n, 8, 8, 1] float32 in [0, 1], labels [n] int32)`."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  order = np.random.RandomState(0).permutation(len(digits.target))
  chosen = order[:NUM_TRAIN] if training else order[NUM_TRAIN:]
  images = (digits.images[chosen] / 16.0).astype(np.float32)[..., None]
  return images, digits.target[chosen].astype(np.int32)


@gin.configurable
class DigitsClassification(classification.ClassificationTask):
  """A small CNN classifying the 8x8 digits; reaches ~0.98 accuracy."""

  def __init__(self, filters: int = 32, hidden_units: int = 128,
               shuffle_seed: int = 0):
    """Configures the task.

    Args:
      filters: Filters of the first convolution (the second has twice as
        many).
      hidden_units: Width of the dense layer.
      shuffle_seed: Seeds the training order, which is the same on every run
        and every replica count.
    """
    self.filters = filters
    self.hidden_units = hidden_units
    self.shuffle_seed = shuffle_seed

  def build_model(self) -> tf_keras.Model:
    # Named layers: `warm_start.modules` can pick them.
    return tf_keras.Sequential([
        tf_keras.Input((8, 8, 1)),
        tf_keras.layers.Conv2D(self.filters, 3, padding="same",
                               activation="relu", name="conv1"),
        tf_keras.layers.Conv2D(2 * self.filters, 3, activation="relu",
                               name="conv2"),
        tf_keras.layers.MaxPooling2D(name="pool"),
        tf_keras.layers.Flatten(name="flatten"),
        tf_keras.layers.Dense(self.hidden_units, activation="relu",
                              name="hidden"),
        tf_keras.layers.Dense(NUM_CLASSES, name="logits"),
    ], name="digits_cnn")

  def build_inputs(self, training, input_context=None) -> tf.data.Dataset:
    return inputs.examples_from_arrays(load_split(training), training,
                                       input_context, seed=self.shuffle_seed)
