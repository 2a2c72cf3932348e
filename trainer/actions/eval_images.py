"""Writing the images an evaluation produced: an eval action."""

from typing import Callable, Mapping

import numpy as np

from trainer.report import summaries


class EvalImagesWriter:
  """Eval action: writes the last evaluation's images (the task's image
  results) as image summaries and PNG files, at the step evaluated.

  The images come from `images_fn` at each call: the evaluator keeps only
  the last evaluation's, outside the results the other actions judge.
  """

  def __init__(self, log_dir: str,
               images_fn: Callable[[], Mapping[str, np.ndarray]],
               step_fn: Callable[[], int]):
    """Builds the action.

    Args:
      log_dir: The eval summaries' directory (`<model_dir>/eval`).
      images_fn: Returns the last evaluation's images by name.
      step_fn: Returns the global step.
    """
    self._log_dir = log_dir
    self._images_fn = images_fn
    self._step_fn = step_fn

  def __call__(self, unused_output) -> None:
    summaries.write_images(self._log_dir, self._images_fn(), self._step_fn())
