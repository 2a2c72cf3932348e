"""Writing the images an evaluation produced: an eval action."""

from typing import Callable, Mapping, Optional

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
               step_fn: Callable[[], int],
               model_dir: Optional[str] = None):
    """Builds the action.

    Args:
      log_dir: The eval summaries' directory (`<model_dir>/eval`).
      images_fn: Returns the last evaluation's images by name.
      step_fn: Returns the global step.
      model_dir: The run's folder, holding `log_dir`: nothing is written
        once it is deleted (`summaries.write_images`).
    """
    self._log_dir = log_dir
    self._images_fn = images_fn
    self._step_fn = step_fn
    self._model_dir = model_dir

  def __call__(self, unused_output) -> None:
    summaries.write_images(self._log_dir, self._images_fn(), self._step_fn(),
                           self._model_dir)
