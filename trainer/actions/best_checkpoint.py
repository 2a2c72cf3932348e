"""Keeping the best checkpoint: an eval action.

Reuses Orbit's `NewBestMetric` for the comparison; its own JSON file holds
only the value, so the record here (step, value, files) is written next to
the checkpoint it names, atomically, and a restarted run remembers the best
so far.
"""

import dataclasses
import os
from typing import Any, Callable, Dict, Optional

import gin
import orbit

from trainer import console
from trainer.actions import metric
from trainer.storage import exports
from trainer.storage import files

BEST_DIRECTORY = "best"
BEST_RECORD = "best.json"


@gin.configurable("best_checkpoint")
@dataclasses.dataclass(frozen=True)
class BestCheckpointConfig:
  """Keeping the best checkpoint, bound as `best_checkpoint.<name>`.

  Attributes:
    metric: The eval result to judge by (e.g. `accuracy`); None keeps no
      best checkpoint.
    higher_is_better: Whether a higher `metric` is better; required with it.
  """
  metric: Optional[str] = None
  higher_is_better: Optional[bool] = None

  def __post_init__(self):
    metric.check_direction("best_checkpoint", self.metric,
                           self.higher_is_better)


class BestCheckpoint:
  """Eval action: keeps the checkpoint with the best eval `metric`.

  In `model_dir/best/`: `ckpt-<step>.*` (the whole training state at that
  step), `best.json` (`step`, `metric`, `value`, `higher_is_better`,
  `checkpoint`, `export`) and, with `export_fn`, `export/<step>/`. The new
  checkpoint and export are written first, then the record, then the
  previous best is removed: a crash leaves the old best or the new one.
  """

  def __init__(self, model_dir: str, config: BestCheckpointConfig,
               step_fn: Callable[[], int],
               save_fn: Callable[[str], None],
               export_fn: Optional[Callable[[str], None]] = None):
    """Reads the record of an earlier run, if any.

    Args:
      model_dir: The run's directory (`best/` goes inside).
      config: The metric and its direction.
      step_fn: Returns the step of the evaluated weights.
      save_fn: Writes the evaluated state as a checkpoint at a prefix.
      export_fn: Writes a SavedModel of the evaluated weights to a
        directory; None for no export.
    """
    self._model_dir = model_dir
    self.directory = os.path.join(model_dir, BEST_DIRECTORY)
    self._config = config
    self._step_fn = step_fn
    self._save_fn = save_fn
    self._export_fn = export_fn
    self._best = orbit.actions.NewBestMetric(
        config.metric, higher_is_better=config.higher_is_better)
    self.record = files.read_json(os.path.join(self.directory, BEST_RECORD))
    if self.record and (self.record["metric"], self.record[
        "higher_is_better"]) == (config.metric, config.higher_is_better):
      self._best.commit({config.metric: self.record["value"]})
    elif self.record:
      console.warning(
          f"best_checkpoint: {self.directory} judged "
          f"{self.record['metric']}; starting over with {config.metric}")
      self.record = None

  def __call__(self, output: Dict[str, Any]) -> None:
    value = metric.value("best_checkpoint", self._config.metric, output)
    if not self._best.test({self._config.metric: value}):
      return
    if files.directory_gone(self._model_dir):
      return  # Deleted under the run: the next save says so.
    step = self._step_fn()
    name = f"ckpt-{step}"
    files.makedirs(self.directory)
    self._save_fn(os.path.join(self.directory, name))
    export = None
    if self._export_fn is not None:
      export = os.path.join("export", str(step))
      self._export_fn(os.path.join(self.directory, export))
    self.record = {"step": step, "metric": self._config.metric,
                   "value": value,
                   "higher_is_better": self._config.higher_is_better,
                   "checkpoint": name, "export": export}
    files.write_json(os.path.join(self.directory, BEST_RECORD), self.record)
    self._best.commit({self._config.metric: value})
    for path in files.matching(self.directory, "ckpt-*"):
      if files.isdir(path):  # `ckpt-N_temp`, left by a killed save.
        files.rmtree(path)
      elif not os.path.basename(path).startswith(name + "."):
        files.remove(path)
    exports.keep_newest(os.path.join(self.directory, "export"),
                        1 if export else 0)
    console.info(f"best | step {step}: {self._config.metric} {value:.4f}, "
                 f"the best so far; kept in {self.directory}")
