"""Early stopping: an eval action that records each evaluation and the loop
hook that stops training once the metric stops improving.

It has no Orbit counterpart. Its state lives in `model_dir`, so a restarted
run remembers the evaluations without improvement.
"""

import dataclasses
import math
import os
from typing import Any, Callable, Dict, Optional

import gin

from trainer import checks
from trainer import console
from trainer.actions import metric
from trainer.loop.control import hooks as loop_hooks
from trainer.storage import files

EARLY_STOPPING_RECORD = "early_stopping.json"


@gin.configurable("early_stopping")
@dataclasses.dataclass(frozen=True)
class EarlyStoppingConfig:
  """Stopping when an eval metric stops improving, bound as
  `early_stopping.<name>`.

  Attributes:
    metric: The eval result to watch; None never stops early.
    higher_is_better: Whether a higher `metric` is better; required with it.
    patience: Stop after this many evaluations in a row without
      improvement.
    min_delta: The smallest change that counts as an improvement.
  """
  metric: Optional[str] = None
  higher_is_better: Optional[bool] = None
  patience: int = 5
  min_delta: float = 0.0

  def __post_init__(self):
    metric.check_direction("early_stopping", self.metric, self.higher_is_better)
    checks.integer("early_stopping.patience", self.patience, minimum=1)
    checks.at_least("early_stopping.min_delta", self.min_delta, 0)


class EarlyStopping(loop_hooks.LoopHook):
  """Eval action that decides when training should stop, and the loop hook
  that stops it (`stop_reason()`, asked before every loop).

  The record, `model_dir/early_stopping.json`, holds every evaluated step's
  value, written by whichever process evaluates: the training process in
  `train_and_eval`, or a `continuous_eval` process beside a `train` one,
  which then stops at its next loop. The decision (best value and step,
  evaluations since) is derived from those values in step order, so it
  depends only on which steps were evaluated: an evaluation run again after
  a restart replaces its step's value instead of counting twice, and one of
  a step later than the one evaluated (a timeline a restart went back on)
  is dropped. A restarted run that had stopped stays stopped; raising
  `patience` lets it go on.
  """

  def __init__(self, model_dir: str, config: EarlyStoppingConfig,
               step_fn: Callable[[], int]):
    self._model_dir = model_dir
    self._path = os.path.join(model_dir, EARLY_STOPPING_RECORD)
    self._config = config
    self._step_fn = step_fn
    self._version = None  # Of the record last read or written.
    self.values: Dict[int, float] = {}  # Evaluated step -> metric value.
    self.state = None  # The decision derived from `values`.
    self._reload()

  def _record_version(self):
    """What changes when the record is written: its modification time
    locally; on a URL its content (an object store's times may not change:
    `ram://` gives 0); None if there is none."""
    if files.is_url(self._path):
      return files.read_bytes(self._path)
    try:
      return files.mtime(self._path)
    except FileNotFoundError:
      return None

  def _reload(self) -> None:
    version = self._record_version()
    if version is not None and version != self._version:
      self._version = version
      record = files.read_json(self._path)
      if record and (record["metric"], record["higher_is_better"]) == (
          self._config.metric, self._config.higher_is_better):
        self.values = {int(step): value
                       for step, value in record.get("values", {}).items()}
        self.state = self._decide()

  def _decide(self) -> Optional[Dict[str, Any]]:
    """Replays the evaluations in step order: the best and the count since."""
    state = None
    for step in sorted(self.values):
      value = self.values[step]
      if state is None:
        if not math.isnan(value):
          state = {"best": value, "best_step": step,
                   "evaluations_since_best": 0}
        continue
      delta = value - state["best"]
      if not self._config.higher_is_better:
        delta = -delta
      if delta > self._config.min_delta:
        state = {"best": value, "best_step": step,
                 "evaluations_since_best": 0}
      else:
        state["evaluations_since_best"] += 1
    return state

  def __call__(self, output: Dict[str, Any]) -> None:
    value = metric.value("early_stopping", self._config.metric, output)
    self._reload()
    step = self._step_fn()
    self.values = {s: v for s, v in self.values.items() if s < step}
    self.values[step] = value
    self.state = self._decide()
    record = {"metric": self._config.metric,
              "higher_is_better": self._config.higher_is_better,
              "values": {str(s): v for s, v in sorted(self.values.items())},
              "last_step": step}
    record.update(self.state or {})
    if files.write_json(self._path, record, root=self._model_dir):
      self._version = self._record_version()
    reason = self.stop_reason()
    if reason:
      console.info(f"early stopping | {reason}")

  def stop_reason(self) -> Optional[str]:
    """Why training should stop now, or None to go on."""
    self._reload()
    if self.state is None or (self.state["evaluations_since_best"] <
                              self._config.patience):
      return None
    return (f"{self._config.metric} has not improved on "
            f"{self.state['best']:.4f} (step {self.state['best_step']}) for "
            f"{self.state['evaluations_since_best']} evaluations (patience "
            f"{self._config.patience})")
