"""`ClassificationTask`: what every shipped classifier shares.

Sparse categorical crossentropy on logits and an `accuracy` metric; the
optimizer comes from gin (`optimizer.*`, `learning_rate.*`). Subclasses add
the model and the data.
"""

import tf_keras

import trainer


class ClassificationTask(trainer.Task):
  """Classifies `(features, integer label)` examples from logits."""

  def build_losses(self, labels, model_outputs, aux_losses=None):
    del aux_losses
    return tf_keras.losses.sparse_categorical_crossentropy(
        labels, model_outputs, from_logits=True)

  def build_metrics(self, training=True):
    del training
    return [tf_keras.metrics.SparseCategoricalAccuracy("accuracy")]
