"""`SplitDigitsMLP`: an MLP on the 8x8 digits, its two halves on two devices.

The scaling guide's manual model parallelism, as a shipped example: the
model is a `trainer.distribute.placement.StagedModel` of two stages; with
`runtime.model_parallel_devices=2` the first half's weights and ops sit on
device 0 and the second half's on device 1 (GPUs, or two logical CPUs on a
machine without accelerators), and TensorFlow copies the activations
between them. With model parallelism off, the same model runs whole on one
device, to the same weights (tests/distribute/test_placement.py).
"""

import gin
import tf_keras

from tasks import digits
from trainer.distribute import placement


@gin.configurable
class SplitDigitsMLP(digits.DigitsClassification):
  """A 64-256-256 | 128-10 MLP on the digits, split after its second layer."""

  def __init__(self, hidden_units: int = 256, shuffle_seed: int = 0):
    """Configures the task.

    Args:
      hidden_units: Width of the first half's two layers (the second half's
        is half of it).
      shuffle_seed: Seeds the training order.
    """
    super().__init__(hidden_units=hidden_units, shuffle_seed=shuffle_seed)

  def build_model(self) -> tf_keras.Model:
    width = self.hidden_units
    first = [tf_keras.layers.Flatten(name="flatten"),
             tf_keras.layers.Dense(width, activation="relu", name="hidden1"),
             tf_keras.layers.Dense(width, activation="relu", name="hidden2")]
    second = [tf_keras.layers.Dense(width // 2, activation="relu",
                                    name="hidden3"),
              tf_keras.layers.Dense(digits.NUM_CLASSES, name="logits")]
    return placement.StagedModel([first, second], name="split_digits_mlp")
