"""Saving the operative gin config once, after the first loop: a train
action."""

from typing import Optional

from trainer import console
from trainer.report import summaries


class OperativeConfigWriter:
  """Train action: saves the operative gin config once, after the first loop.

  Gin only knows which parameters were used once the configurables ran.
  """

  def __init__(self, model_dir: str, writer: Optional[summaries.Writer]):
    self._model_dir = model_dir
    self._writer = writer
    self._done = False

  def __call__(self, unused_output) -> None:
    if self._done:
      return
    self._done = True
    path = summaries.write_operative_config(self._model_dir, self._writer,
                                            step=0)
    # None: `model_dir` was deleted under the run; the next save says so.
    if path is not None:
      console.log(f"wrote {path}")
