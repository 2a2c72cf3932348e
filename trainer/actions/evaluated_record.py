"""Recording which steps were evaluated, with their results: an eval
action."""

from typing import Any, Callable, Dict

from trainer.storage import evaluated


class EvaluatedStepRecorder:
  """Eval action: adds the step evaluated and its results to the run's
  record of evaluated steps (`trainer.storage.evaluated`).

  A restarted `train_and_eval` reads it to evaluate a step saved but not
  evaluated; `trainer.keep_until_evaluated` keeps checkpoints until it
  lists them.
  """

  def __init__(self, model_dir: str, step_fn: Callable[[], int]):
    """Builds the action, reading the record already in `model_dir`.

    Args:
      model_dir: Where the record is kept.
      step_fn: Returns the global step.
    """
    self._record = evaluated.EvaluatedRecord(model_dir)
    self._step_fn = step_fn

  def __call__(self, output: Dict[str, Any]) -> None:
    self._record.add(self._step_fn(), output)
