"""`DigitsClassification`: scikit-learn's embedded 8x8 digits, no download.

The 1,797 images ship inside scikit-learn. A fixed permutation (seed 0) puts
1,437 images in the training split and 360 in the validation split, the same
on every machine.
"""

import functools
import importlib.util
import os
from typing import Tuple

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
  all_images, all_labels = load_digits()
  order = np.random.RandomState(0).permutation(len(all_labels))
  chosen = order[:NUM_TRAIN] if training else order[NUM_TRAIN:]
  images = (all_images[chosen] / 16.0).astype(np.float32)[..., None]
  return images, all_labels[chosen].astype(np.int32)


@functools.lru_cache(maxsize=1)
def load_digits() -> Tuple[np.ndarray, np.ndarray]:
  """Returns all 1,797 `(images [n, 8, 8] float64 in 0..16, labels [n])`,
  as `sklearn.datasets.load_digits` does (read-only: they are shared).

  Read by hand from the file scikit-learn ships and `load_digits` reads
  (`sklearn/datasets/data/digits.csv.gz`: 64 pixels and the label a row),
  found without importing scikit-learn: the import costs about 0.7 s of CPU
  a process (`python -X importtime train.py`), more than the task's own
  modules, in every digits run. Where the file is not there, `load_digits`.
  """
  spec = importlib.util.find_spec("sklearn")
  roots = spec.submodule_search_locations if spec else None
  for root in roots or []:
    path = os.path.join(root, "datasets", "data", "digits.csv.gz")
    if os.path.exists(path):  # local-path: scikit-learn's installed file
      table = np.loadtxt(path, delimiter=",")
      # Both are new arrays: the reshape of a column slice copies.
      images, labels = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
      break
  else:
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    images, labels = digits.images, digits.target
  labels = labels.astype(int)
  images.flags.writeable = labels.flags.writeable = False
  return images, labels


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
