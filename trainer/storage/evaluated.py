"""The record of evaluated steps, `model_dir/eval/evaluated.json`: its one
owner.

Every evaluation that a run makes of a checkpoint (`train_and_eval`'s,
`continuous_eval`'s) adds its step and results here
(`trainer.actions.EvaluatedStepRecorder`, the continuous evaluator). A
restarted `train_and_eval` evaluates a step saved but not recorded; a
restarted continuous evaluator skips the steps recorded;
`trainer.keep_until_evaluated` keeps a checkpoint until it is recorded; a
sweep reads each trial's results as they come. Written atomically, so a
reader in another process sees the record before or after a write, never
half of one.
"""

import json
import os
from typing import Any, Dict, Set

from trainer.storage import files

RECORD = os.path.join("eval", "evaluated.json")


class EvaluatedRecord:
  """The evaluated steps and their results, read from `model_dir` and
  persisted atomically by `add`.

  Attributes:
    steps: The evaluated steps.
    results: Each evaluated step's results by name.
  """

  def __init__(self, model_dir: str):
    self._model_dir = model_dir
    self._path = os.path.join(model_dir, RECORD)
    record = _read(self._path)
    self.steps: Set[int] = set(record.get("steps", []))
    self.results: Dict[int, Dict[str, float]] = {
        int(step): results
        for step, results in record.get("results", {}).items()}

  def add(self, step: int, results: Dict[str, Any]) -> None:
    """Records `step` as evaluated, with `results` (name -> number); in
    memory only once `model_dir` is deleted under the run (`files`)."""
    self.steps.add(step)
    self.results[step] = {name: float(value)
                          for name, value in results.items()}
    files.write_json(self._path, {
        "steps": sorted(self.steps),
        "results": {str(step): results
                    for step, results in sorted(self.results.items())}},
                     root=self._model_dir)


def steps(model_dir: str) -> Set[int]:
  """The steps evaluated in `model_dir`."""
  return EvaluatedRecord(model_dir).steps


def metric_by_step(model_dir: str, metric: str) -> Dict[int, float]:
  """`{step: value}` of `metric` in every evaluation recorded so far."""
  return {step: results[metric]
          for step, results in EvaluatedRecord(model_dir).results.items()
          if metric in results}


def _read(path: str) -> Dict[str, Any]:
  """The record in `path`; empty where there is none, or where it is not
  JSON (written by hand, or cut by a full disk before atomic writes)."""
  try:
    return files.read_json(path) or {}
  except json.JSONDecodeError:
    return {}
