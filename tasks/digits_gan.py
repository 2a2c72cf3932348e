"""`DigitsConditionalGan`: a conditional GAN on the embedded 8x8 digits.

Three models, three optimizers, one step: the generator draws a digit of the
class asked for from noise, the discriminator tells real (image, class)
pairs from generated ones, and a classifier (digits' CNN) learns the real
digits on the side; the generator and the discriminator update at the same
time, from one forward pass (non-saturating losses). The classifier is the
judge: evaluation generates one digit for every eval example's class and
reports the share it assigns to the class asked for
(`eval/classifier_accuracy`; chance is 0.1), beside its accuracy on the real
eval digits (`eval/real_accuracy`), and draws a grid of samples, a row per
class (`eval/samples` in TensorBoard's image tab,
`model_dir/eval/images/samples-<step>.png`).

The noise comes with the input (`preprocess_batch`, from the batch's
stateless seed): split over replicas with the batch and restored with the
input position, so the run is replica invariant and resumes exactly.
"""

from typing import Dict, List, Optional

import gin
import tensorflow as tf
import tf_keras

import trainer
from tasks import digits
from trainer.data import inputs

NUM_CLASSES = digits.NUM_CLASSES
# How many screen pixels each pixel of the sample grid takes.
GRID_ZOOM = 4


@gin.configurable
class DigitsConditionalGan(trainer.Task):
  """A conditional GAN on digits, judged by a classifier trained beside it."""

  def __init__(self, noise_dims: int = 32, hidden_units: int = 256,
               shuffle_seed: int = 0):
    """Configures the task.

    Args:
      noise_dims: The generator's noise per image.
      hidden_units: Width of the generator's and discriminator's layers.
      shuffle_seed: Seeds the training order.
    """
    self.noise_dims = noise_dims
    self.hidden_units = hidden_units
    self.shuffle_seed = shuffle_seed

  def build_model(self) -> Dict[str, tf_keras.Model]:
    # Kept for the evaluation's sample grid (`reduce_aggregated_logs`).
    self.generator = self._generator()
    return {"generator": self.generator,
            "discriminator": self._discriminator(),
            "classifier": digits.DigitsClassification().build_model()}

  def _generator(self) -> tf_keras.Model:
    noise = tf_keras.Input((self.noise_dims,), name="noise")
    label = tf_keras.Input((), dtype=tf.int32, name="label")
    embedded = tf_keras.layers.Embedding(NUM_CLASSES, 16)(label)
    x = tf_keras.layers.Concatenate()([noise, embedded])
    for i in range(2):
      x = tf_keras.layers.Dense(self.hidden_units, name=f"g_dense{i}")(x)
      x = tf_keras.layers.LeakyReLU(0.2)(x)
    x = tf_keras.layers.Dense(64, activation="sigmoid", name="g_pixels")(x)
    image = tf_keras.layers.Reshape((8, 8, 1))(x)
    return tf_keras.Model([noise, label], image, name="generator")

  def _discriminator(self) -> tf_keras.Model:
    image = tf_keras.Input((8, 8, 1), name="image")
    label = tf_keras.Input((), dtype=tf.int32, name="label")
    embedded = tf_keras.layers.Embedding(NUM_CLASSES, 16)(label)
    x = tf_keras.layers.Concatenate()(
        [tf_keras.layers.Flatten()(image), embedded])
    for i in range(2):
      x = tf_keras.layers.Dense(self.hidden_units, name=f"d_dense{i}")(x)
      x = tf_keras.layers.LeakyReLU(0.2)(x)
    logit = tf_keras.layers.Dense(1, name="d_logit")(x)
    return tf_keras.Model([image, label], logit, name="discriminator")

  def build_inputs(self, training, input_context=None) -> tf.data.Dataset:
    return inputs.examples_from_arrays(digits.load_split(training), training,
                                       input_context, seed=self.shuffle_seed)

  def preprocess_batch(self, batch, training: bool, seed: tf.Tensor):
    images, labels = batch
    noise = tf.random.stateless_normal(
        [tf.shape(labels)[0], self.noise_dims], seed)
    return {"image": images, "noise": noise}, labels

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    return tf_keras.losses.sparse_categorical_crossentropy(
        labels, model_outputs, from_logits=True)

  def build_metrics(self, training: bool = True
                    ) -> List[tf_keras.metrics.Metric]:
    if training:
      return []
    return [tf_keras.metrics.SparseCategoricalAccuracy("classifier_accuracy"),
            tf_keras.metrics.SparseCategoricalAccuracy("real_accuracy")]

  def train_step(self, inputs, model, optimizer,
                 metrics: Optional[List[tf_keras.metrics.Metric]] = None):
    features, labels = inputs
    generator, discriminator = model["generator"], model["discriminator"]
    classifier = model["classifier"]
    with tf.GradientTape(persistent=True) as tape:
      fake = generator([features["noise"], labels], training=True)
      # Losses in float32, whatever the compute precision.
      real_logit = trainer.float32_outputs(
          discriminator([features["image"], labels], training=True))
      fake_logit = trainer.float32_outputs(
          discriminator([fake, labels], training=True))
      # Per-example losses averaged over the GLOBAL batch.
      d_loss = tf.nn.compute_average_loss(
          tf.nn.softplus(-real_logit[:, 0]) + tf.nn.softplus(fake_logit[:, 0]))
      g_loss = tf.nn.compute_average_loss(tf.nn.softplus(-fake_logit[:, 0]))
      c_loss = tf.nn.compute_average_loss(self.build_losses(
          labels, trainer.float32_outputs(
              classifier(features["image"], training=True))))
    # Each update's gradient norm becomes `gradient_norm/<model>`; a
    # non-finite one makes the step's loss NaN (the framework does both).
    trainer.minimize(tape, d_loss, discriminator.trainable_variables,
                     optimizer["discriminator"])
    trainer.minimize(tape, g_loss, generator.trainable_variables,
                     optimizer["generator"])
    trainer.minimize(tape, c_loss, classifier.trainable_variables,
                     optimizer["classifier"])
    # Each loss's replica mean (the framework averages these over replicas).
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    return {"loss": d_loss + g_loss + c_loss,
            "discriminator_loss": d_loss * replicas,
            "generator_loss": g_loss * replicas,
            "classifier_loss": c_loss * replicas}

  def aggregate_logs(self, state=None, step_logs=None):
    del step_logs  # Overridden so that `reduce_aggregated_logs` is called.
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """`samples`: a grid of generated digits, one row per class, the same
    noise in each column, at every evaluation: each 8x8 digit in a grey
    1-pixel frame, magnified `GRID_ZOOM` times (TensorBoard shows an image
    at its own size, and 8 pixels are too few to read)."""
    del aggregated_logs, global_step
    columns = 10
    labels = tf.repeat(tf.range(NUM_CLASSES), columns)
    noise = tf.random.stateless_normal(
        [columns, self.noise_dims], seed=[0, 0])
    images = self.generator([tf.tile(noise, [NUM_CLASSES, 1]), labels],
                            training=False)
    cell = 8 + 2
    framed = tf.pad(tf.cast(images, tf.float32),
                    [[0, 0], [1, 1], [1, 1], [0, 0]], constant_values=0.5)
    grid = tf.reshape(framed, [NUM_CLASSES, columns, cell, cell, 1])
    grid = tf.reshape(tf.transpose(grid, [0, 2, 1, 3, 4]),
                      [NUM_CLASSES * cell, columns * cell, 1])
    grid = tf.repeat(tf.repeat(grid, GRID_ZOOM, axis=0), GRID_ZOOM, axis=1)
    return {"samples": grid}

  def export_signatures(self, model: tf_keras.Model, features_spec):
    """Serves the generator (`export.model = "generator"`): a batch of
    classes and noise in, images out."""
    del features_spec

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.int32, name="label"),
        tf.TensorSpec([None, self.noise_dims], tf.float32, name="noise")])
    def generate(label, noise):
      return {"image": tf.cast(model([noise, label], training=False),
                               tf.float32)}

    return {"serving_default": generate}

  def validation_step(self, inputs, model,
                      metrics: Optional[List[tf_keras.metrics.Metric]] = None):
    features, labels = inputs
    fake = model["generator"]([features["noise"], labels], training=False)
    judged = trainer.float32_outputs(model["classifier"](fake,
                                                         training=False))
    real = trainer.float32_outputs(model["classifier"](features["image"],
                                                       training=False))
    if metrics:
      metrics[0].update_state(labels, judged)
      metrics[1].update_state(labels, real)
    return {"loss": self.build_losses(labels, judged)}
