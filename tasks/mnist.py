"""`MnistClassification`: MNIST with the CNN of TensorFlow's
distributed-training tutorial (Conv2D 32x3 relu, MaxPool, Flatten, Dense 64
relu, Dense 10).
"""

import gin
import tensorflow as tf
import tf_keras

from tasks import classification


@gin.configurable
class MnistClassification(classification.ImageClassificationTask):
  """The tutorial CNN on MNIST, from tensorflow-datasets or TFRecords.

  The 60,000 training images (47 MB) are held in memory once read; each
  epoch visits them in a new seeded order, gathered a batch at a time.
  """

  tfds_name = "mnist"
  image_shape = (28, 28, 1)

  def build_model(self) -> tf_keras.Model:
    return tf_keras.Sequential([
        tf_keras.Input((28, 28, 1)),
        tf_keras.layers.Conv2D(32, 3, activation="relu", name="conv"),
        tf_keras.layers.MaxPooling2D(name="pool"),
        tf_keras.layers.Flatten(name="flatten"),
        tf_keras.layers.Dense(64, activation="relu", name="hidden"),
        tf_keras.layers.Dense(10, name="logits"),
    ], name="mnist_cnn")

  def preprocess_batch(self, batch, training, seed):
    del seed
    images, labels = self.gather(batch, training)
    return tf.cast(images, tf.float32) / 255.0, labels
