"""`DigitsMixture`: digits trained on a mixture of clean and perturbed images,
evaluated on three named sets.

The shipped example of several datasets (docs/several-datasets.md):
- training: a mixture of the clean training split and a perturbed copy of it
  (Gaussian noise, images shifted by a pixel), at `trainer.mixture`'s rates;
- evaluation: `clean` and `perturbed` (the first half of the validation
  split, as it is and perturbed) and `test` (the other half, perturbed),
  which is evaluated and reported but never judged: no best checkpoint,
  early stop or sweep may be chosen by it.

The perturbation is drawn once from a fixed seed, so every run, machine and
replica count sees the same images.
"""

from typing import Dict

import gin
import numpy as np
import tensorflow as tf

from tasks import digits
from trainer.data import inputs

# The validation split's first half is judged, its second half held out.
NUM_JUDGED = 180


def perturbed(images: np.ndarray, seed: int, noise: float = 0.2
              ) -> np.ndarray:
  """Returns `images` [n, 8, 8, 1] each shifted by up to a pixel along each
  axis, with Gaussian noise of standard deviation `noise`, clipped to
  [0, 1]: the same for the same `seed`."""
  rng = np.random.RandomState(seed)
  shifts = rng.randint(-1, 2, size=(len(images), 2))
  moved = np.stack([np.roll(image, tuple(shift), axis=(0, 1))
                    for image, shift in zip(images, shifts)])
  noisy = moved + rng.normal(scale=noise, size=moved.shape)
  return np.clip(noisy, 0.0, 1.0).astype(np.float32)


@gin.configurable
class DigitsMixture(digits.DigitsClassification):
  """`DigitsClassification` on clean and perturbed digits (see the module)."""

  def __init__(self, noise: float = 0.2, **kwargs):
    """Configures the task.

    Args:
      noise: Standard deviation of the perturbed images' Gaussian noise.
      **kwargs: `DigitsClassification`'s.
    """
    super().__init__(**kwargs)
    self.noise = noise

  def build_inputs(self, training, input_context=None
                   ) -> Dict[str, tf.data.Dataset]:
    images, labels = digits.load_split(training)
    if training:
      return {
          "clean": inputs.examples_from_arrays(
              (images, labels), True, input_context, seed=self.shuffle_seed),
          "perturbed": inputs.examples_from_arrays(
              (perturbed(images, seed=1, noise=self.noise), labels), True,
              input_context, seed=self.shuffle_seed + 1)}
    judged = slice(0, NUM_JUDGED)
    held_out = slice(NUM_JUDGED, None)
    sets = {
        "clean": (images[judged], labels[judged]),
        "perturbed": (perturbed(images[judged], seed=2, noise=self.noise),
                      labels[judged]),
        "test": (perturbed(images[held_out], seed=3, noise=self.noise),
                 labels[held_out])}
    return {name: inputs.examples_from_arrays(arrays, False, input_context)
            for name, arrays in sets.items()}
