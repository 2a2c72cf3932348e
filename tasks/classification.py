"""`ClassificationTask`: what every shipped classifier shares.

Sparse categorical crossentropy on logits, an `accuracy` metric and Adam.
Subclasses add the model and the data.
"""

import tf_keras

import trainer


class ClassificationTask(trainer.Task):
  """Classifies `(features, integer label)` examples from logits.

  Attributes:
    learning_rate: Adam's learning rate; subclasses set it.
  """

  learning_rate: float = 1e-3

  def build_losses(self, labels, model_outputs, aux_losses=None):
    del aux_losses
    return tf_keras.losses.sparse_categorical_crossentropy(
        labels, model_outputs, from_logits=True)

  def build_metrics(self, training=True):
    del training
    return [tf_keras.metrics.SparseCategoricalAccuracy("accuracy")]

  def create_optimizer(self):
    return tf_keras.optimizers.Adam(self.learning_rate)
