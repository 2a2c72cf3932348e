"""`Cifar10Classification`: CIFAR-10 with the CNN of TensorFlow's scaling
guide (Conv2D 32, MaxPool, Conv2D 64, MaxPool, Flatten, Dense 64, Dense 10),
trained with random crops and flips.
"""

import gin
import tensorflow as tf
import tf_keras

from tasks import classification
from tasks import image_inputs


@gin.configurable
class Cifar10Classification(classification.ImageClassificationTask):
  """The scaling guide's CNN on CIFAR-10, from tfds or TFRecords.

  The 50,000 training images (150 MB) are held in memory once read, and
  gathered a batch at a time. Each training image is padded by 4 pixels,
  cropped back to 32x32 at a random place and flipped left-right half the
  time. The input pipeline draws each image's crop and flip (stateless,
  seeded per batch: a resumed run is exact, and the draws do not depend on
  the replica count); the training step applies them, on the device. Done
  in the pipeline, the pixel work competed with training for the CPU
  (docs/benchmarks.md).
  """

  tfds_name = "cifar10"
  image_shape = (32, 32, 3)

  def __init__(self, augment: bool = True, heavy_augmentation: bool = False,
               **kwargs):
    """Configures the task.

    Args:
      augment: Random crops and flips for training.
      heavy_augmentation: Instead, SimCLR's augmentation (random resized
        crops, flips, colour jitter, grayscale) in the input pipeline: the
        input-heavy variant that `scripts/benchmark_input.py
        --data_service_workers` measures, whose pixel work competes with
        training for a host's CPUs or runs on tf.data service workers.
      **kwargs: `data_dir`, `tfrecords`, `shuffle_seed` (see
        `ImageClassificationTask`).
    """
    super().__init__(**kwargs)
    self.augment = augment
    self.heavy_augmentation = heavy_augmentation

  def build_model(self) -> tf_keras.Model:
    # The model takes uint8 pixels and scales them itself: a quarter of the
    # bytes through the input pipeline, and the arithmetic in the step.
    return tf_keras.Sequential([
        tf_keras.Input((32, 32, 3), dtype=tf.uint8),
        tf_keras.layers.Rescaling(1 / 255, name="scale"),
        tf_keras.layers.Conv2D(32, 3, activation="relu", name="conv1"),
        tf_keras.layers.MaxPooling2D(name="pool1"),
        tf_keras.layers.Conv2D(64, 3, activation="relu", name="conv2"),
        tf_keras.layers.MaxPooling2D(name="pool2"),
        tf_keras.layers.Flatten(name="flatten"),
        tf_keras.layers.Dense(64, activation="relu", name="hidden"),
        tf_keras.layers.Dense(10, name="logits"),
    ], name="cifar10_cnn")

  def preprocess_batch(self, batch, training, seed):
    images, labels = self.gather(batch, training)
    if not (training and self.augment):
      return images, labels
    seed = tf.random.experimental.stateless_fold_in(seed, self.shuffle_seed)
    if self.heavy_augmentation:
      return image_inputs.resized_crop_flip_and_jitter(images, seed), labels
    # Only the crops and flips are drawn here; `compute_gradients` applies
    # them (see `image_inputs.draw_crops_and_flips`).
    crops = image_inputs.draw_crops_and_flips(tf.shape(images)[0], seed,
                                              PADDING)
    return {"image": images, "crops": crops}, labels

  def compute_gradients(self, inputs, model, optimizer):
    features, labels = inputs
    if isinstance(features, dict):
      features = image_inputs.crop_and_flip(features["image"],
                                            features["crops"], PADDING)
    return super().compute_gradients((features, labels), model, optimizer)


PADDING = 4  # Pixels of zero padding around images before cropping.
