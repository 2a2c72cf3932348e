"""`DigitsPipelineMLP`: a deep MLP on the 8x8 digits, cut into pipeline
stages by configuration.

A plain `tf_keras.Sequential` of named layers, which knows nothing of
devices: `gin/digits_pipeline.gin` cuts it with `pipeline.boundaries`
(after `hidden2`: two stages, on two GPUs or two logical CPUs) and feeds it
in micro-batches (`pipeline.num_microbatches`). Unbound, the same Task
trains whole on one device. With `batch_norm`, every hidden layer is
followed by batch normalisation, which a pipeline computes per micro-batch.
"""

import gin
import tf_keras

from tasks import digits


@gin.configurable
class DigitsPipelineMLP(digits.DigitsClassification):
  """A 64-(hidden_units x num_hidden)-10 MLP on the digits."""

  def __init__(self, hidden_units: int = 128, num_hidden: int = 4,
               batch_norm: bool = False, shuffle_seed: int = 0):
    """Configures the task.

    Args:
      hidden_units: Width of each hidden layer.
      num_hidden: Hidden layers, named `hidden1`, `hidden2`, ...
      batch_norm: Follow each hidden layer with batch normalisation
        (`batch_norm1`, ...).
      shuffle_seed: Seeds the training order.
    """
    super().__init__(hidden_units=hidden_units, shuffle_seed=shuffle_seed)
    self.num_hidden = num_hidden
    self.batch_norm = batch_norm

  def build_model(self) -> tf_keras.Model:
    layers = [tf_keras.Input((8, 8, 1)),
              tf_keras.layers.Flatten(name="flatten")]
    for index in range(1, self.num_hidden + 1):
      layers.append(tf_keras.layers.Dense(
          self.hidden_units, activation="relu", name=f"hidden{index}"))
      if self.batch_norm:
        layers.append(tf_keras.layers.BatchNormalization(
            name=f"batch_norm{index}"))
    layers.append(tf_keras.layers.Dense(digits.NUM_CLASSES, name="logits"))
    return tf_keras.Sequential(layers, name="digits_pipeline_mlp")
